"""One overload client process: ``threads`` closed-loop clients sending the
same prepared request from ``start`` to ``end`` (CLOCK_MONOTONIC, shared by
every process on the machine). A 429 is followed by a short pause, as a
client honouring it would. Prints a pickle of (start, ms, status) per
request on stdout.

python -m bench.reliability.load_worker PORT PATH JSON THREADS START END BACKOFF_MS"""

from __future__ import annotations

import json
import pickle
import sys
import threading
import time

from bench.harness.httpclient import HttpClient


def main(argv: list[str]) -> None:
    port, path, payload = int(argv[0]), argv[1], json.loads(argv[2])
    threads, start, end, backoff = int(argv[3]), float(argv[4]), float(argv[5]), float(argv[6]) / 1e3
    out: list[tuple[float, float, int]] = []
    lock = threading.Lock()

    def client() -> None:
        c = HttpClient("127.0.0.1", port, timeout=120)
        request = c.prepare(path, payload)
        c.send(request)  # connect and warm up before the start
        mine = []
        time.sleep(max(0.0, start - time.monotonic()))
        while (t := time.monotonic()) < end:
            try:
                status, _ = c.send(request)
            except OSError:
                status = 0
                c.close()
            mine.append((t, (time.monotonic() - t) * 1e3, status))
            if status == 429:
                time.sleep(backoff)
        c.close()
        with lock:
            out.extend(mine)

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    sys.stdout.buffer.write(pickle.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
