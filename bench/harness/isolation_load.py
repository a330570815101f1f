"""The load of one isolation round, every source started together and run
for the same window: search-box queries on a fixed schedule, indexing
clients sending 32-passage requests back to back, and the bulk client
(``tulip-rose embed --priority batch``) on a file of passages.

- Queries: ``bench/loadgen``'s open loop (``--rate``) when it is built
  (``cargo build --profile dist -p loadgen``, ``bench/crates/loadgen``): a few microseconds per
  request, so a p99 is the stack's, not the client's. Without it, Python
  threads (``query_load``), whose own jitter on a loaded 2-core
  machine is milliseconds; the results say which one ran.
- Indexing: one process per client (``python -m bench.harness.isolation_load``),
  each sending its prepared requests round-robin until the window ends and
  reporting every request's (start, end) on the shared monotonic clock.
- Bulk: the real command line, started before the window (its start-up is
  not in it) and interrupted at its end; its rate is the documents its
  progress lines report over the window.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]


def loadgen_binary() -> Path | None:
    """The compiled load generator where cargo put it (CARGO_TARGET_DIR, as
    in CI, else the clone's target/), dist or release; None if not built."""
    from tulip_rose_cli.launch import TARGET_DIR

    return next((p for p in (TARGET_DIR / "dist" / "loadgen", TARGET_DIR / "release" / "loadgen")
                 if p.is_file()), None)


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


@dataclass
class Load:
    """What one round sends (the same for every side)."""

    query_bodies: list[dict]
    query_rate: float
    connections: int
    index_bodies: list[list[dict]]  # per indexing client
    docs_per_request: int
    bulk_file: Path | None = None  # passages, one per line; None = no bulk client
    path: str = "/v1/embeddings"


@dataclass
class Round:
    seconds: float
    queries_ms: list[float] = field(default_factory=list)
    query_sent_s: list[float] = field(default_factory=list)  # from the window's start
    # Per query, what Tulip reported (Ivy's x-queue-time + x-inference-time):
    # arrival in Tulip to rows on the host; empty from the Python client.
    query_tulip_ms: list[float] = field(default_factory=list)
    late: int = 0
    index_ms: list[float] = field(default_factory=list)
    index_docs_per_s: float = 0.0
    bulk_docs_per_s: float | None = None
    window_ns: tuple[int, int] = (0, 0)
    query_client: str = ""
    # Batch-class tokens the replica finished per second of the window (its
    # own counter, read at the window's edges: no request cut in half).
    batch_tokens_per_s: float | None = None

    @property
    def docs_per_s(self) -> float:
        return self.index_docs_per_s + (self.bulk_docs_per_s or 0.0)


def run_round(port: int, load: Load, seconds: float, indexing: bool = True,
              batch_tokens: Callable[[], float] | None = None) -> Round:
    """Queries (and, with ``indexing``, the indexing clients and the bulk
    client) against Ivy on ``port`` for ``seconds``; ``batch_tokens`` reads
    the replica's batch-class token counter at the window's edges."""
    out = Round(seconds)
    bulk = Bulk(port, load.bulk_file) if indexing and load.bulk_file else None
    index = Indexers(port, load.index_bodies, load.path) if indexing and load.index_bodies else None
    queries = Queries(port, load, seconds)
    try:
        if bulk:
            bulk.wait_sending()
        if index:
            index.wait_ready()
        queries.wait_ready()
        go = time.perf_counter()
        out.window_ns = (time.monotonic_ns(), time.monotonic_ns() + int(seconds * 1e9))
        if index:
            index.go(go + seconds)
        queries.go()
        tokens_at_go = batch_tokens() if batch_tokens else None
        time.sleep(max(0.0, go + seconds - time.perf_counter()))
        if tokens_at_go is not None:
            out.batch_tokens_per_s = (batch_tokens() - tokens_at_go) / (time.perf_counter() - go)
        if bulk:
            out.bulk_docs_per_s = bulk.rate_since(go)
        q = queries.finish()
        out.queries_ms, out.query_sent_s, out.late, out.query_client = q["ms"], q["sent_s"], q["late"], q["client"]
        out.query_tulip_ms = q.get("tulip_ms", [])
        if index:
            spans = index.finish()
            out.index_ms = [(e - s) * 1e3 for client in spans for s, e in client]
            # Each client's documents over its own span: the window's edges
            # cut no request in half.
            out.index_docs_per_s = sum(len(c) * load.docs_per_request / (c[-1][1] - go) for c in spans if c)
    finally:
        for part in (bulk, index, queries):
            if part is not None:
                part.close()
    return out


class Queries:
    """The query stream: loadgen's open loop, else Python threads."""

    def __init__(self, port: int, load: Load, seconds: float):
        self.binary = loadgen_binary()
        self.port, self.load = port, load
        self._go = threading.Event()
        self._result: dict = {}
        if self.binary is not None:
            f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
            json.dump({"path": load.path, "bodies": load.query_bodies}, f)
            f.close()
            self._input = Path(f.name)
            self.proc = subprocess.Popen(
                [str(self.binary), "--mode", "http", "--target", f"127.0.0.1:{port}", "--input", f.name,
                 "--rate", str(load.query_rate), "--duration-s", str(seconds), "--connections", str(load.connections),
                 "--go-stdin", "--timeout-s", "120"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_ready(self) -> None:
        if self.binary is not None:
            line = self.proc.stderr.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"loadgen did not start: {line}{self.proc.stderr.read()[-2000:]}")

    def go(self) -> None:
        self._started = time.perf_counter()
        if self.binary is not None:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        else:
            from bench.harness.stack import IVY_PATH

            self._stop = threading.Event()
            assert self.load.path == IVY_PATH
            texts = [b["input"] for b in self.load.query_bodies]
            self._thread = threading.Thread(target=lambda: self._result.update(query_load(
                self.port, texts, self.load.query_rate, self.load.connections, stop=self._stop)))
            self._thread.start()

    def finish(self) -> dict:
        if self.binary is not None:
            out, err = self.proc.communicate(timeout=180)
            if self.proc.returncode != 0:
                raise RuntimeError(f"loadgen failed ({self.proc.returncode}): {err[-2000:]}")
            r = json.loads(out)["rate"]
            if r["errors"]:
                raise RuntimeError(f"{r['errors']} queries failed; first: {r['first_error']}")
            tulip = [a + b for a, b in zip(r["server_queue_ms"], r["server_inference_ms"])
                     if a is not None and b is not None]
            return {"ms": [x / 1e3 for x in r["latencies_us"]], "sent_s": [x / 1e6 for x in r["sent_us"]],
                    "late": r["late"], "client": "bench/loadgen --rate (compiled, open loop)", "tulip_ms": tulip}
        self._stop.set()
        self._thread.join()
        r = self._result
        return {"ms": [x * 1e3 for x in r["latencies"]], "sent_s": [], "late": r["late"],
                "client": "Python threads (bench/harness/isolation_load.py query_load)"}

    def close(self) -> None:
        if self.binary is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.binary is not None:
            self._input.unlink(missing_ok=True)


class Indexers:
    """One process per indexing client."""

    def __init__(self, port: int, per_client: list[list[dict]], path: str):
        self.procs = [subprocess.Popen([sys.executable, "-m", "bench.harness.isolation_load"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=_env(), cwd=REPO) for _ in per_client]
        for p, bodies in zip(self.procs, per_client):
            pickle.dump((port, path, bodies), p.stdin)
            p.stdin.flush()

    def wait_ready(self) -> None:
        for p in self.procs:
            msg = pickle.load(p.stdout)
            if msg[0] != "ready":
                raise RuntimeError(f"indexing client failed before the window: {msg[1]}")

    def go(self, until: float) -> None:
        for p in self.procs:
            p.stdin.write(f"{until!r}\n".encode())
            p.stdin.flush()

    def finish(self) -> list[list[tuple[float, float]]]:
        spans = []
        for p in self.procs:
            msg = pickle.load(p.stdout)
            if msg[0] != "done":
                raise RuntimeError(f"indexing client failed: {msg[1]}")
            spans.append(msg[1])
        return spans

    def close(self) -> None:
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _index_worker() -> None:
    """The child: (port, path, bodies) in; sends until the deadline it is
    given, back to back; (start, end) of every request out."""
    from bench.harness.httpclient import HttpClient

    out = sys.stdout.buffer
    port, path, bodies = pickle.load(sys.stdin.buffer)
    client = HttpClient("127.0.0.1", port)
    prepared = [client.prepare(path, b) for b in bodies]
    try:
        status, body = client.send(prepared[0])
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
    except Exception as e:  # reported to the parent, which raises it
        pickle.dump(("error", f"{type(e).__name__}: {e}"), out)
        out.flush()
        return
    pickle.dump(("ready",), out)
    out.flush()
    until = float(sys.stdin.buffer.readline())
    spans, k = [], 0
    try:
        while (start := time.perf_counter()) < until:
            status, body = client.send(prepared[k % len(prepared)])
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
            spans.append((start, time.perf_counter()))
            k += 1
    except Exception as e:
        pickle.dump(("error", f"{type(e).__name__}: {e}"), out)
    else:
        pickle.dump(("done", spans), out)
    out.flush()


class Bulk:
    """``tulip-rose embed --priority batch`` on a file of passages."""

    def __init__(self, port: int, passages: Path):
        self.work = Path(tempfile.mkdtemp(prefix="iso-bulk-"))
        self.lines: list[tuple[float, int]] = []  # (perf_counter, documents done)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tulip_rose_cli", "embed", str(passages), "--out", str(self.work / "out.npy"),
             "--url", f"http://127.0.0.1:{port}", "--priority", "batch", "--progress-every", "0.2", "--fresh"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            if line.startswith("embedded "):
                done = int(line.split()[1].split("/")[0].replace(",", ""))
                self.lines.append((time.perf_counter(), done))

    def wait_sending(self, timeout: float = 120) -> None:
        """Until its second progress line: started and sending steadily."""
        deadline = time.monotonic() + timeout
        while len(self.lines) < 2:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the bulk client did not start sending (status {self.proc.poll()})")
            time.sleep(0.05)

    def rate_since(self, since: float) -> float | None:
        """Documents per second from its last progress line before
        ``since`` (its documents then) to its latest one; ``None`` when it
        reported no batch in the window (a slow device: raise the window)."""
        before = [x for x in self.lines if x[0] <= since]
        lines = before[-1:] + [x for x in self.lines if x[0] > since]
        if len(lines) < 2:
            return None
        (t0, d0), (t1, d1) = lines[0], lines[-1]
        return (d1 - d0) / (t1 - t0)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        import shutil

        shutil.rmtree(self.work, ignore_errors=True)


if __name__ == "__main__":
    _index_worker()


def query_load(port: int, queries: list[str], rate: float, threads: int, stop_after: float | None = None,
               stop: threading.Event | None = None) -> dict:
    """Queries on a fixed schedule (``rate`` per second) from ``threads``
    keep-alive connections until ``stop`` is set or ``stop_after`` seconds
    (the fallback without ``bench/loadgen``). Latency is measured from the
    actual send; a slot sent more than 10 ms after its time (every thread
    busy) is counted as late."""
    stop = stop or threading.Event()
    start = time.perf_counter()
    deadline = start + stop_after if stop_after else float("inf")
    lock = threading.Lock()
    state = {"next": 0, "late": 0}
    latencies: list[float] = []
    errors: list[str] = []
    from bench.harness.httpclient import HttpClient
    from bench.harness.stack import IVY_PATH

    enc = HttpClient("127.0.0.1", 0)
    prepared = [enc.prepare(IVY_PATH, {"input": q}) for q in queries]

    def worker() -> None:
        with HttpClient("127.0.0.1", port) as client:
            while True:
                with lock:
                    slot = state["next"]
                    state["next"] += 1
                at = start + slot / rate
                while not stop.is_set() and time.perf_counter() < min(at, deadline):
                    time.sleep(min(0.005, max(0.0, at - time.perf_counter())))
                if stop.is_set() or at >= deadline:
                    return
                t0 = time.perf_counter()
                status, body = client.send(prepared[slot % len(prepared)])
                t1 = time.perf_counter()
                with lock:
                    if status != 200:
                        errors.append(f"HTTP {status}: {body[:200]!r}")
                    latencies.append(t1 - t0)
                    if t0 - at > 0.010:
                        state["late"] += 1

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise RuntimeError(f"{len(errors)} queries failed; first: {errors[0]}")
    return {"latencies": latencies, "late": state["late"]}
