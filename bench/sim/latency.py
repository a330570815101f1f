"""Latency on the simulated device: batch 1 at several lengths, scoring
batches, and 1-16 concurrent clients, each timed by the compiled load
generator (``bench/crates/loadgen``; a few microseconds per request, its own floor
measured against a null server in its process) or, without it, by a
Python client (which costs about as much as the server being measured; the
report says which). Every figure is set beside the device time the
simulated device modelled for the same requests."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bench.gpu.loadgen import Loadgen, grpc_input, http_input
from bench.harness import inputs
from bench.harness.httpclient import HttpClient
from bench.harness.stack import IVY_PATH
from bench.harness.timing import Stats
from bench.sim.replicas import device_ms, now_ns, window

REPO = Path(__file__).resolve().parents[2]


def loadgen() -> Loadgen | None:
    """The compiled load generator, if it has been built
    (``cargo build --profile dist -p loadgen``)."""
    from bench.harness.isolation_load import loadgen_binary

    built = loadgen_binary()
    bundled = REPO / "gpu-bundle" / "loadgen"
    path = built or (bundled if bundled.is_file() else None)
    return Loadgen(path) if path else None


def token_ids(length: int, seed: int) -> list[int]:
    """BGE-M3-like ids: <s>, ``length - 2`` ids, </s>."""
    rng = np.random.default_rng(seed)
    return [0, *map(int, rng.integers(5, 250000, size=length - 2)), 2]


def _python_grpc(tulip, requests: list, rounds: int, warmup: int = 3) -> dict:
    with tulip.client() as c:
        reqs = [c.request(r) for r in requests]
        for i in range(warmup):
            c.stub.Embed(reqs[i % len(reqs)])
        lat = []
        for i in range(rounds):
            t0 = time.perf_counter()
            c.stub.Embed(reqs[i % len(reqs)])
            lat.append(time.perf_counter() - t0)
    return Stats.of(lat).to_dict()


def _python_http(port: int, bodies: list[dict], rounds: int, warmup: int = 3) -> dict:
    with HttpClient("127.0.0.1", port) as c:
        prepared = [c.prepare(IVY_PATH, b) for b in bodies]
        for i in range(warmup):
            c.send(prepared[i % len(prepared)])
        lat = []
        for i in range(rounds):
            t0 = time.perf_counter()
            status, body = c.send(prepared[i % len(prepared)])
            lat.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
    return Stats.of(lat).to_dict()


def _timed(lg: Loadgen | None, mode: str, target: str, payload: dict, levels: list[int], requests: int,
           fallback) -> dict:
    if lg is not None:
        return lg.run(mode, target, payload, levels, requests, floor=True)
    return {"1": fallback()}


def _added(stats: dict, device: float) -> dict:
    """What the host path adds over the modelled device time, and the
    latency relative to it."""
    return {"device_ms": round(device, 4), "p50_added_ms": round(stats["p50"] - device, 4),
            "p99_added_ms": round(stats["p99"] - device, 4),
            "p50_over_device": round(stats["p50"] / device, 3) if device else None}


def online(tulip, log: Path, ivy, model_dir: str, lengths: list[int], rounds: int, lg: Loadgen | None) -> dict:
    """Batch 1, sequential: pre-tokenized over gRPC to Tulip, and real text
    through Ivy (HTTP, tokenized there)."""
    out: dict = {}
    for n in lengths:
        seqs = [token_ids(n, seed=n + k) for k in range(4)]
        t0 = now_ns()
        tul = _timed(lg, "grpc", tulip.target, grpc_input([[s] for s in seqs]), [1], rounds,
                     lambda seqs=seqs: _python_grpc(tulip, [[s] for s in seqs], rounds))
        t1 = now_ns()
        texts = [inputs.text_of_tokens(model_dir, n, start=7 * k) for k in range(4)]
        t2 = now_ns()
        via_ivy = _timed(lg, "http", f"127.0.0.1:{ivy.port}", http_input([{"input": t} for t in texts]), [1],
                         rounds, lambda texts=texts: _python_http(ivy.port, [{"input": t} for t in texts], rounds))
        t3 = now_ns()
        d_tulip, d_ivy = device_ms(window(log, t0, t1)), device_ms(window(log, t2, t3))
        out[str(n)] = {"tulip": {**tul["1"], **_added(tul["1"], d_tulip)},
                       "ivy": {**via_ivy["1"], **_added(via_ivy["1"], d_ivy)},
                       "client_floor": tul.get("floor")}
    return out


def scoring(tulip, log: Path, length: int, batches: list[int], rounds: int, lg: Loadgen | None) -> dict:
    """One request of ``b`` documents at a time, pre-tokenized over gRPC;
    the device time per request is the modelled busy time in the run over
    the requests sent (warm-up included)."""
    out = {}
    warmup = 3
    for b in batches:
        seqs = [token_ids(length, seed=1000 + k) for k in range(b)]
        t0 = now_ns()
        stats = _timed(lg, "grpc", tulip.target, grpc_input([seqs]), [1], rounds,
                       lambda seqs=seqs: _python_grpc(tulip, [seqs], rounds, warmup))["1"]
        steps = window(log, t0, now_ns())
        per_request = sum(s["end"] - s["start"] for s in steps) / 1e6 / (rounds + warmup)
        out[str(b)] = {**stats, **_added(stats, per_request), "steps_per_request": len(steps) / (rounds + warmup)}
    return out


def concurrency(ivy, log: Path, model_dir: str, length: int, levels: list[int], per_level: int,
                lg: Loadgen | None) -> dict:
    """1..16 concurrent clients through Ivy, real text of ``length`` tokens,
    batch 1; steps batch the concurrent requests (the modelled device time
    of a step grows with it)."""
    texts = inputs.texts_of_tokens(model_dir, length, 16)
    bodies = [{"input": t} for t in texts]
    if lg is not None:
        out = {}
        for c in levels:
            t0 = now_ns()
            r = lg.run("http", f"127.0.0.1:{ivy.port}", http_input(bodies), [c], max(per_level, 2 * c), floor=False)
            steps = window(log, t0, now_ns())
            out[str(c)] = {**r[str(c)], "device_ms": round(device_ms(steps), 4),
                           "mean_sequences_per_step": round(float(np.mean([s["sequences"] for s in steps])), 2)
                           if steps else None}
        return out
    from bench.harness.clients import http_clients

    enc = HttpClient("127.0.0.1", 0)
    out = {}
    for c in levels:
        per = max(2, -(-per_level // c))
        reqs = [[enc.prepare(IVY_PATH, bodies[(k + j) % len(bodies)]) for j in range(per)] for k in range(c)]
        t0 = now_ns()
        run = http_clients(ivy.port, reqs)
        steps = window(log, t0, now_ns())
        out[str(c)] = {**Stats.of(run.latencies).to_dict(), "requests_per_s": round(run.requests / run.wall, 2),
                       "device_ms": round(device_ms(steps), 4)}
    return out

