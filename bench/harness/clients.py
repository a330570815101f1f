"""Concurrent client processes. Each is a fresh ``python -m bench.harness.clients``
(spawned, never forked: tokio and CUDA do not survive fork; and not through
multiprocessing, whose spawn re-imports the parent's main module, torch
included, in every child). A client connects, sends one untimed request,
reports ready, waits for the go that all clients get at once, sends its
requests back to back and reports (start, end) per request on the shared
monotonic clock."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ClientRun:
    """Every request's (start, end), per client."""

    spans: list[list[tuple[float, float]]]

    @property
    def latencies(self) -> list[float]:
        return [e - s for client in self.spans for s, e in client]

    @property
    def wall(self) -> float:
        starts = [s for client in self.spans for s, _ in client]
        ends = [e for client in self.spans for _, e in client]
        return max(ends) - min(starts)

    @property
    def requests(self) -> int:
        return sum(len(c) for c in self.spans)


def _http_sender(port: int, requests: list[bytes]):
    from bench.harness.httpclient import HttpClient

    client = HttpClient("127.0.0.1", port)

    def send(req: bytes) -> None:
        status, body = client.send(req)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
    return send, requests


def _grpc_sender(target: str, batches: list[list[list[int]]]):
    from tulip.client import TulipClient

    client = TulipClient(target, timeout=600)
    return (lambda req: client.stub.Embed(req, timeout=600)), [client.request(b) for b in batches]


def _worker() -> None:
    """The child: work in on stdin, messages out on stdout (pickles)."""
    out = sys.stdout.buffer
    kind, target, work = pickle.load(sys.stdin.buffer)
    try:
        send, requests = (_http_sender if kind == "http" else _grpc_sender)(target, work)
        send(requests[0])
    except Exception as e:  # reported to the parent, which raises it
        pickle.dump(("error", f"{type(e).__name__}: {e}"), out)
        out.flush()
        return
    pickle.dump(("ready",), out)
    out.flush()
    sys.stdin.buffer.readline()
    spans = []
    try:
        for req in requests:
            start = time.perf_counter()
            send(req)
            spans.append((start, time.perf_counter()))
    except Exception as e:
        pickle.dump(("error", f"{type(e).__name__}: {e}"), out)
    else:
        pickle.dump(("done", spans), out)
    out.flush()


def _run(kind: str, target, per_client: list, timeout: float) -> ClientRun:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-m", "bench.harness.clients"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env, cwd=REPO) for _ in per_client]
    try:
        for p, work in zip(procs, per_client):
            pickle.dump((kind, target, work), p.stdin)
            p.stdin.flush()
        for p in procs:
            msg = pickle.load(p.stdout)
            if msg[0] != "ready":
                raise RuntimeError(f"client failed before timing: {msg[1]}")
        for p in procs:
            p.stdin.write(b"go\n")
            p.stdin.flush()
        spans = []
        for p in procs:
            msg = pickle.load(p.stdout)
            if msg[0] != "done":
                raise RuntimeError(f"client failed: {msg[1]}")
            spans.append(msg[1])
    finally:
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return ClientRun(spans)


def http_clients(port: int, per_client: list[list[bytes]], timeout: float = 60) -> ClientRun:
    """One process per entry of ``per_client``, each sending its prepared
    HTTP requests (``HttpClient.prepare``) to ``127.0.0.1:port``."""
    return _run("http", port, per_client, timeout)


def grpc_clients(target: str, per_client: list[list[list[list[int]]]], timeout: float = 60) -> ClientRun:
    """One process per entry, each sending its batches of token ids to Tulip."""
    return _run("grpc", target, per_client, timeout)


if __name__ == "__main__":
    _worker()
