"""Issue 50's thread question: should the smallest steps of the CPU fast
path (ONNX Runtime) run on one thread? The same engine's fast path, built
with 1 and with the full thread budget (``OnnxSettings.threads``), on real
queries of the model's tokenizer and on longer inputs, each step timed from
``Engine.step`` to its rows on the host. Two orders, as the ``queries``
benchmark has them: streamed (steps back to back) and interleaved (between
two steps, a matmul loop of about a small transformers forward's size churns the
caches and lets the runtime's threads fall asleep, as another client's work
does on a server)."""

from __future__ import annotations

import time

import numpy as np

from bench.harness import inputs, plots
from bench.harness.results import table
from bench.harness.stack import Stack
from bench.harness.timing import ratio, scaled

TITLE = "CPU fast path: one intra-op thread against the thread budget, by step size (streamed and interleaved)"

# Real tokens per step (queries are 8-24 tokens; the buckets above them).
LENGTHS = (12, 24, 48, 96)


def _steps(engine, sequences: list[list[int]], rounds: int, warmup: int, interleaved: bool, churn) -> list[float]:
    from rose import Batch

    out = []
    for r in range(warmup + rounds):
        if interleaved:
            churn()
        batch = Batch.from_lists([sequences[r % len(sequences)]], "dense")
        start = time.perf_counter()
        lazy = engine.step(batch)
        lazy.tensor()
        mode = lazy.info.mode
        lazy.release()
        if r >= warmup:
            out.append(time.perf_counter() - start)
        if mode != "onnx":
            raise RuntimeError(f"a step ran as {mode}, not on the fast path")
    return out


def run(stack: Stack, rounds: int = 200, warmup: int = 20) -> tuple[dict, str]:
    import torch

    from rose import Engine
    from rose.cpu import OnnxSettings

    torch.set_num_threads(stack.threads)
    a = torch.randn(384, 384)

    def churn() -> None:
        x = a
        for _ in range(12):
            x = torch.tanh(x @ a)

    texts = inputs.queries(stack.model_dir, 64, hi=24)
    by_length = {n: [inputs.ids(stack.model_dir, t, n) for t in inputs.texts_of_tokens(stack.model_dir, n, 16)]
                 for n in LENGTHS}
    queries = [inputs.ids(stack.model_dir, t, 512) for t in texts]
    sets = {"queries": queries, **{f"{n} tokens": s for n, s in by_length.items()}}
    budget = stack.threads
    results: dict[str, dict[str, dict[str, float]]] = {}
    for threads in sorted({1, budget}):
        engine = Engine.from_dir(stack.model_dir, device="cpu", dtype="float32",
                                 cpu_runtimes=[OnnxSettings(threads=threads)])
        engine.warm()
        for name, seqs in sets.items():
            for order in ("streamed", "interleaved"):
                s = _steps(engine, seqs, rounds, warmup, order == "interleaved", churn)
                results.setdefault(name, {}).setdefault(order, {})[str(threads)] = float(np.median(s) * 1e3)
        del engine
    lengths = {"queries": [len(q) for q in queries], **{f"{n} tokens": [n] for n in LENGTHS}}
    rows = []
    for name, orders in results.items():
        for order, by_threads in orders.items():
            one, full = by_threads["1"], by_threads[str(budget)]
            rows.append([name, order, f"{one:.3f}", f"{full:.3f}", ratio(one, full)])
    data = {"params": {"rounds": rounds, "warmup": warmup, "threads": budget, "model_dir": stack.model_dir,
                       "lengths": LENGTHS, "query_tokens": {"min": min(lengths["queries"]),
                                                            "max": max(lengths["queries"]),
                                                            "median": float(np.median(lengths["queries"]))}},
            "step_p50_ms": results,
            "one_over_budget": {f"{r[0]} {r[1]}": r[4] for r in rows}}
    md = "\n".join([
        f"In process, the fast path (ONNX Runtime, float32) gated for every bucket first, {rounds} steps of one "
        f"sequence per cell after {warmup} warm-up steps; queries are real ones ({data['params']['query_tokens']['min']}"
        f"–{data['params']['query_tokens']['max']} tokens with specials). Interleaved: a 384×384 matmul loop "
        f"(12 matmuls and tanh, {budget} threads) before every step.",
        "",
        table(["inputs", "order", "1 thread p50 (ms)", f"{budget} threads p50 (ms)", "1 / budget"], rows),
    ])
    return data, md


def plot(data: dict, path) -> None:
    groups = {f"{name}\n{order}": {f"{t} thread(s)": v for t, v in by.items()}
              for name, orders in data["step_p50_ms"].items() for order, by in orders.items()}
    plots.throughput_bars(groups, path, "CPU fast path step p50 by intra-op threads", ylabel="ms per step (p50)")


def options(scale: float) -> dict:
    return {"rounds": scaled(200, scale, 20), "warmup": scaled(20, scale, 5)}
