"""Issue 14's tracing cost: batch-1 latency (128 tokens) through HTTP → Ivy →
Tulip → ROSE's null model (no compute, so the serving path's own cost is
what is measured), interleaved request by request:

- tracing off (no ``--otlp-endpoint``: the default);
- tracing on: Ivy and Tulip exporting every request's spans (about ten)
  over OTLP/gRPC to a collector in its own process (``bench/harness/otlp.py``);
- optionally, an Ivy built before tracing existed (``BENCH_BASELINE_IVY``,
  a path to its binary; same Tulip as "off"), for "off costs nothing".

Each side has its own Tulip replica, so "on" exports from both services."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.harness import inputs
from bench.harness.httpclient import HttpClient
from bench.harness.results import table
from bench.harness.stack import IVY_PATH, Stack
from bench.harness.timing import Stats, interleave, ratio, scaled
from bench.suites.overhead import NULL_CONFIG, TOKENS, null_model_dir
from tulip_rose_cli.launch import Ivy, Tulip
from tulip_rose_cli.processes import Process, free_port

TITLE = "Tracing off vs on (OTLP export from Ivy and Tulip), batch-1 latency, null model"


def run(stack: Stack, rounds: int = 3000, warmup: int = 300) -> tuple[dict, str]:
    tok_dir = stack.model_dir  # the real model's tokenizer; the model itself computes nothing
    text = inputs.text_of_tokens(tok_dir, TOKENS)
    null_dir = null_model_dir()
    port = free_port()
    collector = Process("otlp-collector", [sys.executable, "-m", "bench.harness.otlp", str(port)], None, stack.log_dir)
    endpoint = f"http://127.0.0.1:{port}"
    baseline = os.environ.get("BENCH_BASELINE_IVY")
    procs: list[Process] = [collector]
    try:
        tulip_off = Tulip(null_dir, log_dir=stack.log_dir, threads=1)
        procs.append(tulip_off)
        tulip_on = Tulip(null_dir, log_dir=stack.log_dir, threads=1, otlp_endpoint=endpoint)
        procs.append(tulip_on)
        ivys = {"off": Ivy([tulip_off.url], tok_dir, log_dir=stack.log_dir)}
        procs.append(ivys["off"])
        ivys["on"] = Ivy([tulip_on.url], tok_dir, log_dir=stack.log_dir, otlp_endpoint=endpoint)
        procs.append(ivys["on"])
        if baseline:
            ivys["before tracing"] = Ivy([tulip_off.url], tok_dir, log_dir=stack.log_dir, binary=Path(baseline))
            procs.append(ivys["before tracing"])
        clients = {k: HttpClient("127.0.0.1", v.port) for k, v in ivys.items()}
        reqs = {k: c.prepare(IVY_PATH, {"input": text}) for k, c in clients.items()}
        sides = {k: (lambda i, c=clients[k], r=reqs[k]: c.send_ok(r)) for k in ivys}
        interleave(sides, warmup, 0)
        lat = interleave(sides, rounds, 0, seed=3)
        for c in clients.values():
            c.close()
    finally:
        for p in reversed(procs):
            p.stop()
    spans = next((line.split()[1] for line in collector.log_path.read_text().splitlines() if line.startswith("spans ")), None)
    stats = {k: Stats.of(v) for k, v in lat.items()}
    on_off = ratio(stats["on"].p50, stats["off"].p50)
    off_before = ratio(stats["off"].p50, stats["before tracing"].p50) if baseline else None
    data = {"params": {"tokens": TOKENS, "rounds": rounds, "warmup": warmup, "model": NULL_CONFIG,
                       "baseline_ivy": baseline},
            "latency_ms": {k: s.to_dict() for k, s in stats.items()},
            "on_over_off_p50": on_off, "off_over_before_p50": off_before,
            "spans_exported": int(spans) if spans else None}
    rows = [[k, s.p50, s.p90, s.p99, s.mean] for k, s in stats.items()]
    md = "\n".join([
        f"One {TOKENS}-token input per request over a kept-alive connection, {rounds} rounds after {warmup} "
        "of warm-up, the sides in a fresh random order each round; Tulip runs the null model (no compute) "
        "with one torch thread. \"on\": Ivy and its Tulip export every span (batch span processor, OTLP/gRPC) "
        "to a collector process on the same machine.\n",
        table(["tracing", "p50 ms", "p90 ms", "p99 ms", "mean ms"], rows),
        f"\np50 on / off = **{on_off}**"
        + (f"; off / before tracing = **{off_before}**" if off_before is not None else "")
        + (f"; {spans} spans exported." if spans else "."),
        "\nThe \"on\" cost includes the collector's decoding on the same cores.",
    ])
    return data, md


def options(scale: float) -> dict:
    return {"rounds": scaled(3000, scale, 200), "warmup": scaled(300, scale, 50)}
