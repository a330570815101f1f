"""CPU row 2, host overhead: HTTP → Ivy → Tulip → ROSE with the null model
(no compute) against a plain Python server (FastAPI + uvicorn, one process)
doing parse → tokenize → no-op model → respond. Batch 1, 128 tokens, the same
text and tokenizer on both sides, interleaved request by request."""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from bench import gate, inputs, metrics
from bench.baselines.servers import FastApiBaseline
from bench.harness import Stats, interleave, ratio, scaled
from bench.profiling import PerfRecord, by_thread, perf_table, profile_step
from bench.httpclient import HttpClient
from bench.results import table
from bench.stack import IVY_PATH, Stack, http_embeddings
from tests.servers import Ivy, Tulip

TITLE = "Host overhead: Ivy → Tulip → ROSE (null model) vs FastAPI + uvicorn"
TOKENS = 128
NULL_CONFIG = {"model_type": "null", "hidden_size": 384, "vocab_size": 30522, "max_position_embeddings": 512}


def null_model_dir() -> str:
    d = Path(tempfile.mkdtemp(prefix="bench-null-model-"))
    (d / "config.json").write_text(json.dumps(NULL_CONFIG))
    return str(d)


def _send(client: HttpClient, req: bytes) -> None:
    status, body = client.send(req)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {body[:200]!r}")


def run(stack: Stack, rounds: int = 3000, warmup: int = 300, breakdown_rounds: int = 1000) -> tuple[dict, str]:
    tok_dir = stack.model_dir  # the real model's tokenizer; the model itself computes nothing
    dim, max_len = NULL_CONFIG["hidden_size"], NULL_CONFIG["max_position_embeddings"]
    text = inputs.text_of_tokens(tok_dir, TOKENS)
    ids = inputs.ids(tok_dir, text)
    null_dir = null_model_dir()
    scaled_steps = breakdown_rounds * 2
    tulip = Tulip(null_dir, log_dir=stack.log_dir, threads=1)
    procs = [tulip]
    try:
        ivy = Ivy([tulip.url], tok_dir, log_dir=stack.log_dir)
        procs.append(ivy)
        base = FastApiBaseline(tok_dir, log_dir=stack.log_dir, dim=dim, max_length=max_len)
        procs.append(base)
        ivy_c, base_c = HttpClient("127.0.0.1", ivy.port), HttpClient("127.0.0.1", base.port)
        for name, c, path in (("Ivy → Tulip (null model)", ivy_c, IVY_PATH),
                              ("FastAPI baseline", base_c, FastApiBaseline.PATH)):
            stack.gates.append(gate.check_shape(name, http_embeddings(c, path, [text]), 1, dim,
                                                "one 384-dim row for one input"))
            status, body = c.post_json(path, {"input": text})
            got = body["usage"]["prompt_tokens"]
            if got != TOKENS:
                raise gate.GateFailed(f"{name} counted {got} tokens, expected {TOKENS}")
        ivy_req = ivy_c.prepare(IVY_PATH, {"input": text})
        base_req = base_c.prepare(FastApiBaseline.PATH, {"input": text})
        sides = {"ivy": lambda i: _send(ivy_c, ivy_req), "fastapi": lambda i: _send(base_c, base_req)}
        interleave(sides, warmup, 0)
        lat = interleave(sides, rounds, 0, seed=2)
        stats = {k: Stats.of(v) for k, v in lat.items()}

        # Stage breakdown on Ivy's path, measured after the comparison:
        # Tulip's own clock via /metrics over Ivy-only requests, then direct
        # gRPC calls with Tulip's per-response timing fields.
        before = metrics.parse(tulip.metrics())
        perf = PerfRecord([ivy.proc.pid, tulip.proc.pid], stack.log_dir / "overhead.perf.data")
        with perf:
            ivy_only = [_timed_send(ivy_c, ivy_req) for _ in range(breakdown_rounds)]
        stages = metrics.stage_means(before, metrics.parse(tulip.metrics()))
        ids_req = ivy_c.prepare(IVY_PATH, {"input": ids})
        health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        floors = {}
        for name, c, req in (("ivy: token ids in (no tokenization)", ivy_c, ids_req),
                             ("ivy: GET /health (HTTP floor)", ivy_c, health),
                             ("fastapi: GET /health (HTTP floor)", base_c, health)):
            for _ in range(50):
                _send(c, req)
            floors[name] = Stats.of([_timed_send(c, req) for _ in range(breakdown_rounds)])
        with tulip.client() as g:
            req = g.request([ids])
            for _ in range(50):
                g.stub.Embed(req)
            grpc_lat, server_us, infer_us, queue_us = [], [], [], []
            for _ in range(breakdown_rounds):
                resp, secs = _timed_grpc(g, req)
                grpc_lat.append(secs)
                server_us.append(resp.timing.total_us)
                infer_us.append(resp.timing.inference_us)
                queue_us.append(resp.timing.queue_us)
        ivy_c.close()
        base_c.close()
    finally:
        for p in reversed(procs):
            p.stop()

    perf_top = perf.top()
    step_profile = profile_step(null_dir, [ids], steps=scaled_steps)
    ivy_alone = Stats.of(ivy_only)
    grpc = Stats.of(grpc_lat)
    med = lambda xs: round(statistics.median(xs) / 1e3, 4)  # noqa: E731  µs → ms
    breakdown = [
        ["HTTP → Ivy → Tulip → back, client-observed (Ivy alone)", ivy_alone.p50, ivy_alone.mean],
        *[[k, v.p50, v.mean] for k, v in floors.items()],
        ["gRPC → Tulip → back, Python grpc client (pre-tokenized)", grpc.p50, grpc.mean],
        ["Tulip server time per request (timing.total_us)", med(server_us), None],
        ["  of which queue (timing.queue_us)", med(queue_us), None],
        ["  of which inference: step + wait (timing.inference_us)", med(infer_us), None],
        *[[v["what"] + " (/metrics)", None, v["mean_ms"]] for v in stages.values()],
    ]
    p50_ratio = ratio(stats["fastapi"].p50, stats["ivy"].p50)
    data = {
        "params": {"rounds": rounds, "warmup": warmup, "tokens": TOKENS, "batch": 1,
                   "tokenizer": tok_dir, "null_model": NULL_CONFIG, "order": "shuffled every round"},
        "stats": {k: s.to_dict() for k, s in stats.items()},
        "fastapi_over_ivy_p50": p50_ratio,
        "ivy_p50_ms": stats["ivy"].p50,
        "breakdown": {"rows": breakdown, "ivy_stage_means": stages},
        "perf_ivy_and_tulip": {"top": perf_top, "by_thread": by_thread(perf_top), "error": perf.error},
        "rose_null_step": step_profile,
    }
    md = "\n".join([
        f"One input of {TOKENS} tokens (real English text, the all-MiniLM-L6-v2 tokenizer on both sides), "
        f"null model (zeros, no compute), {rounds} interleaved rounds after {warmup} warm-up rounds.\n",
        table(["side", "count", "p50 ms", "p90 ms", "p99 ms", "mean ms"],
              [[k, s.count, s.p50, s.p90, s.p99, s.mean] for k, s in stats.items()]),
        f"\nFastAPI p50 / Ivy p50 = **{p50_ratio}** (target ≥ 5); Ivy's absolute p50 = {stats['ivy'].p50:.3f} ms.\n",
        f"Where Ivy's time goes ({breakdown_rounds} requests each, after the comparison):\n",
        table(["stage", "p50 ms", "mean ms"], breakdown),
        f"\nROSE's step on the null model in-process, as Tulip calls it (from_arena → step → release): "
        f"{step_profile['mean_ms_per_step']:.4f} ms per step.\n",
        "While Ivy alone was timed: " + perf_table(perf_top, perf.error),
        "\nSampled share per thread in the rows above: "
        + ", ".join(f"{k} {v}%" for k, v in by_thread(perf_top).items()),
    ])
    return data, md


def _timed_send(client: HttpClient, req: bytes) -> float:
    import time

    start = time.perf_counter()
    _send(client, req)
    return time.perf_counter() - start


def _timed_grpc(client, req):
    import time

    start = time.perf_counter()
    resp = client.stub.Embed(req)
    return resp, time.perf_counter() - start


def options(scale: float) -> dict:
    return {"rounds": scaled(3000, scale, 100), "warmup": scaled(300, scale, 20),
            "breakdown_rounds": scaled(1000, scale, 50)}
