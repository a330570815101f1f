"""Issue 50's first item: where a served query's time goes on the CPU fast
path. One query at a time, real queries of the model's tokenizer, every
layer of the path timed on the same inputs in the same run, each side's
order shuffled every round:

- fastembed's way: ONNX Runtime on the ``transformers`` export, the bare
  ``session.run`` on token ids, and ``encode`` (tokenize, run, pool);
- ROSE's export of the same weights: the same runtime's session in this
  process (``GatedRuntime.run_ungated``: the feed, the run, the rows), and
  Tulip's own call into the engine (``Engine.step_arena`` from an arena
  Tulip would have built: the step's Python wrapper and copies);
- served: Tulip over gRPC (pre-tokenized, Python client) and Ivy over HTTP
  (text), on the fast path; Ivy also over a Unix socket to its own Tulip;
- the step's threads pinned (``--cpu-fast-path-pin``, auto: on where the
  process has as many CPUs as threads) against the same left to the
  scheduler: ROSE's session in process, and Ivy → a Tulip with
  ``--cpu-fast-path-pin false``.

Five orders: interleaved (every side once per round), interleaved with
20 ms idle before every call (sporadic traffic: every thread has gone to
sleep), interleaved with a bare ``transformers`` forward on a query (the
``queries`` benchmark's heavy in-process sides) before every call, run in
this process and then in a child process, and streamed (runs of requests
per side). Then, per thread of Tulip, of Ivy and of this process, the CPU
time and wake-ups one request costs, streamed and after idle."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from bench.harness import inputs, metrics, plots
from bench.harness.httpclient import HttpClient
from bench.harness.profiling import thread_times, thread_use
from bench.harness.remote_forward import RemoteForward
from bench.harness.results import table
from bench.harness.stack import IVY_PATH, Stack
from bench.harness.timing import Stats, interleave, ratio, scaled, stream_stats

TITLE = "CPU fast path: a served query against ONNX Runtime in-process, layer by layer"
IDLE_S = 0.02
STREAM_BLOCK, STREAM_SETTLE = 50, 5

# Table headers for the orders.
SHORT = {"interleaved": "interleaved", "interleaved, 20 ms idle before each call": "20 ms idle",
         "interleaved, a transformers forward in this process before each call": "forward here",
         "interleaved, the same forward in a child process before each call": "forward in a child",
         "streamed": "streamed"}

# The ratios the issue asks about, each a layer of the path (numerator over denominator).
LAYERS = {
    "ivy / fastembed encode (the target)": ("ivy http", "fastembed encode"),
    "rose session / fastembed session (the export)": ("rose session", "fastembed session"),
    "rose host step / rose session (the step's wrapper)": ("rose host step", "rose session"),
    "tulip grpc / rose host step (the served hop)": ("tulip grpc", "rose host step"),
    "ivy http / tulip grpc (text, HTTP and tokenizing)": ("ivy http", "tulip grpc"),
    "ivy over a unix socket / fastembed encode": ("ivy http, unix socket", "fastembed encode"),
    "pinned / unpinned, rose session": ("rose session", "rose session, unpinned"),
    "pinned / unpinned, ivy http": ("ivy http", "ivy http, unpinned"),
}


def run(stack: Stack, rounds: int = 200, warmup: int = 20, n_queries: int = 64) -> tuple[dict, str]:
    import numpy as np
    import torch

    from rose import Batch, Engine
    from rose.cpu import OnnxSettings
    from rose.step.inputs import resolve_defaults

    torch.set_num_threads(stack.threads)
    texts = inputs.queries(stack.model_dir, n_queries)
    ids = [stack.ids(t) for t in texts]
    n = len(texts)
    ort = stack.onnxruntime()
    ivy, tulip = stack.ivy(), stack.tulip()
    unix_tulip, unix_ivy = stack.colocated()
    free_tulip, free_ivy = stack.variant("unpinned (--cpu-fast-path-pin false)", cpu_fast_path_pin="false")
    bare = stack.bare()
    remote = RemoteForward(stack.model_dir, stack.threads)
    heavy = [bare.prepare([x]) for x in ids]
    engine = Engine.from_dir(stack.model_dir, device="cpu", dtype="float32",
                             cpu_runtimes=[OnnxSettings(threads=stack.threads)])
    engine.warm()
    runtime = next(r for r in engine.gated() if r.name == "onnx")
    free_engine = Engine.from_dir(stack.model_dir, device="cpu", dtype="float32",
                                  cpu_runtimes=[OnnxSettings(threads=stack.threads, pin=False)])
    free_engine.warm()
    free_runtime = next(r for r in free_engine.gated() if r.name == "onnx")
    batches = [Batch.from_lists([x], "dense") for x in ids]
    arenas = []
    for b, x in zip(batches, ids):
        resolve_defaults(b, engine.info.dimension, True)
        arenas.append((bytearray(b.arena[:b.layout.size].numpy().tobytes()), 1, len(x)))
    feeds = [{"input_ids": np.array([x], dtype=np.int64), "attention_mask": np.ones((1, len(x)), dtype=np.int64)}
             for x in ids]

    def host_step(i: int) -> None:
        arena, seqs, tokens = arenas[i % n]
        out = engine.step_arena(arena, seqs, tokens, "dense")
        out[0].release()
        if out[5] != "onnx":
            raise RuntimeError(f"an in-process host step ran as {out[5]}, not on the fast path")

    ivy_c = HttpClient("127.0.0.1", ivy.port)
    reqs = [ivy_c.prepare(IVY_PATH, {"input": t}) for t in texts]

    unix_c = HttpClient("127.0.0.1", unix_ivy.port)
    unix_reqs = [unix_c.prepare(IVY_PATH, {"input": t}) for t in texts]
    free_c = HttpClient("127.0.0.1", free_ivy.port)
    free_reqs = [free_c.prepare(IVY_PATH, {"input": t}) for t in texts]

    def ivy_send(i: int) -> None:
        ivy_c.send_ok(reqs[i % n])

    with tulip.client() as grpc:
        sides = {
            "fastembed session": lambda i: ort.session.run(None, feeds[i % n]),
            "fastembed encode": lambda i: ort.encode([texts[i % n]]),
            "rose session": lambda i: runtime.run_ungated(batches[i % n]),
            "rose session, unpinned": lambda i: free_runtime.run_ungated(batches[i % n]),
            "rose host step": host_step,
            "tulip grpc": lambda i: grpc.embed([ids[i % n]]),
            "ivy http": ivy_send,
            "ivy http, unix socket": lambda i: unix_c.send_ok(unix_reqs[i % n]),
            "ivy http, unpinned": lambda i: free_c.send_ok(free_reqs[i % n]),
        }
        interleave(sides, warmup, 0)
        before = [metrics.parse(t.metrics()) for t in (tulip, unix_tulip, free_tulip)]
        orders = {
            "interleaved": {k: Stats.of(v) for k, v in interleave(sides, rounds, 0, seed=1).items()},
            "interleaved, 20 ms idle before each call": {
                k: Stats.of(v) for k, v in interleave(sides, rounds, 0, seed=2, idle=IDLE_S).items()},
            # The forward takes another query than the call after it.
            "interleaved, a transformers forward in this process before each call": {
                k: Stats.of(v) for k, v in interleave(sides, rounds, 0, seed=4,
                                                      before=lambda k: bare.forward(heavy[(k + 7) % n])).items()},
            "interleaved, the same forward in a child process before each call": {
                k: Stats.of(v) for k, v in interleave(sides, rounds, 0, seed=5,
                                                      before=lambda k: remote(ids[(k + 7) % n])).items()},
            "streamed": stream_stats(sides, rounds, STREAM_BLOCK, STREAM_SETTLE, seed=3),
        }
        after = [metrics.parse(t.metrics()) for t in (tulip, unix_tulip, free_tulip)]
        threads = {
            "ivy http, streamed": _thread_use({"tulip": tulip.proc.pid, "ivy": ivy.proc.pid}, ivy_send, rounds, 0),
            "ivy http, 20 ms idle before each": _thread_use({"tulip": tulip.proc.pid, "ivy": ivy.proc.pid},
                                                            ivy_send, rounds, IDLE_S),
            "fastembed session, streamed": _thread_use({"this process": os.getpid()}, sides["fastembed session"],
                                                       rounds, 0),
            "fastembed session, 20 ms idle before each": _thread_use(
                {"this process": os.getpid()}, sides["fastembed session"], rounds, IDLE_S),
        }
    ivy_c.close()
    unix_c.close()
    free_c.close()
    remote.close()

    served = sum(metrics.steps(a, "onnx") - metrics.steps(b, "onnx") for a, b in zip(after, before))
    # Four served sides, one step per call: four interleaved orders and the streamed runs.
    expected = 4 * (4 * rounds + max(rounds // STREAM_BLOCK, 2) * (STREAM_BLOCK + STREAM_SETTLE))
    p50 = {order: {k: s.p50 for k, s in stats.items()} for order, stats in orders.items()}
    ratios = {order: {name: ratio(p[a], p[b]) for name, (a, b) in LAYERS.items()} for order, p in p50.items()}
    lengths = [len(x) for x in ids]
    data = {
        "params": {"rounds": rounds, "warmup": warmup, "queries": n, "threads": stack.threads,
                   "forward_before": "bare transformers forward on the query 7 after the call's, batch 1",
                   "idle_ms": IDLE_S * 1e3, "stream_block": STREAM_BLOCK, "stream_settle": STREAM_SETTLE,
                   "tokens": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
                   "model_dir": stack.model_dir, "dtype": "float32",
                   "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "")},
        "stats": {order: {k: s.to_dict() for k, s in stats.items()} for order, stats in orders.items()},
        "ratios_p50": ratios,
        "thread_use_per_request": threads,
        "tulip_fast_path_steps": served,
        "tulip_steps_expected": expected,
    }
    md = [f"Real English queries ({min(lengths)}–{max(lengths)} tokens with specials, median "
          f"{statistics.median(lengths)}), one per call, {rounds} rounds per order after {warmup} warm-up rounds, "
          f"{stack.threads} intra-op threads everywhere, float32, OMP_WAIT_POLICY={data['params']['omp_wait_policy']}. "
          f"The three Tulips ran {served:.0f} of the {expected} served calls' steps (one per gRPC or HTTP call, untimed "
          "stream runs' first calls included) on the fast path (`tulip_steps_total{mode=\"onnx\"}`).\n"]
    for order, stats in orders.items():
        md += [f"\n{order.capitalize()}:\n",
               table(["side", "count", "p50 ms", "p90 ms", "p99 ms", "mean ms"],
                     [[k, s.count, s.p50, s.p90, s.p99, s.mean] for k, s in stats.items()])]
    md += ["\nRatios of p50, layer by layer:\n",
           table(["layer", *(SHORT[o] for o in orders)], [[name, *(ratios[o][name] for o in orders)]
                                                           for name in LAYERS])]
    for what, rows in threads.items():
        md += [f"\nPer request, {what}: CPU time and voluntary switches (sleeps that needed a wake-up) "
               "per thread (threads under 0.01 ms left out):\n",
               table(["process", "thread", "cpu ms", "wake-ups"],
                     [[r["process"], r["thread"], r["cpu_ms"], r["switches"]] for r in rows if r["cpu_ms"] >= 0.01])]
    return data, "\n".join(md)


def _thread_use(pids: dict[str, int], call, calls: int, idle: float) -> list[dict]:
    """Per thread of these processes, what one call costs (``thread_use``),
    over ``calls`` calls with ``idle`` seconds slept before each."""
    before = {name: thread_times(pid) for name, pid in pids.items()}
    for i in range(calls):
        if idle:
            time.sleep(idle)
        call(i)
    rows = []
    for name, pid in pids.items():
        rows += [{"process": name, **r} for r in thread_use(before[name], thread_times(pid), calls)]
    return sorted(rows, key=lambda r: -r["cpu_ms"])


def options(scale: float) -> dict:
    return {"rounds": scaled(200, scale, 20), "warmup": scaled(20, scale, 5)}


def plot(data: dict, path: Path) -> Path:
    groups = {order: {k: v["p50"] for k, v in stats.items()} for order, stats in data["stats"].items()}
    return plots.throughput_bars(groups, path, "A query, layer by layer: p50 per side", ylabel="p50 latency, ms")
