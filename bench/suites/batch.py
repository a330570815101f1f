"""CPU row 5, batch embedding of real documents: 100 documents of 512 tokens
(capped to the model's maximum) per request from 4 concurrent client
processes through Ivy, against ``sentence-transformers`` ``encode``
in-process on the same documents, fastembed's runtime in-process (ONNX
Runtime + tokenizers, each request's documents as one padded batch, as
fastembed's default batch size of 256 does) and Infinity serving the same
model with the same clients, in alternating blocks of one run. Beside
them, with ``int8``, the same Ivy → Tulip with the CPU fast path's int8
copy on (``--cpu-int8 true``: int8 where a bucket's gate passes, float32
elsewhere), so that float32 and int8 are each stated against ONNX Runtime,
with how many of its steps ran in int8."""

from __future__ import annotations

import random
import time
from pathlib import Path

from bench.harness import inputs, metrics, plots
from bench.harness.baseline_servers import INFINITY_MODEL_NAME, Infinity
from bench.harness.clients import http_clients
from bench.harness.httpclient import HttpClient
from bench.harness.profiling import PerfRecord, perf_table
from bench.harness.results import table
from bench.harness.stack import IVY_PATH, Stack
from bench.harness.timing import ratio, scaled
from bench.suites.online import capped_lengths
from rose.cpu import bf16

TITLE = "Batch embedding of documents: Ivy vs sentence-transformers in-process and Infinity"
LENGTH = 512


def run(stack: Stack, clients: int = 4, requests: int = 1, batch: int = 100, rounds: int = 1,
        int8: bool = True) -> tuple[dict, str]:
    ivy, st = stack.ivy(), stack.st()
    notes: list[str] = []
    # Where the bfloat16 twin serves (auto: CPUs with AMX), the same stack
    # with it off, so that what it adds is measured in the same run.
    f32 = stack.float32_ivy() if bf16.missing(require_amx=True) is None else None
    ort = stack.onnxruntime_or_note(notes)
    i8 = _int8_or_note(stack, notes) if int8 else None
    inf = stack.infinity_or_note(notes)
    (length,), capped = capped_lengths([LENGTH], stack.max_length)
    notes += capped
    docs = inputs.texts_of_tokens(stack.model_dir, length, 2 * batch)
    rng = random.Random(0)
    per_client = [[rng.sample(docs, batch) for _ in range(requests)] for _ in range(clients)]
    total = clients * requests * batch
    enc = HttpClient("127.0.0.1", 0)  # only builds request bytes
    ivy_reqs = [[enc.prepare(IVY_PATH, {"input": b}) for b in c] for c in per_client]

    def in_process() -> float:
        start = time.perf_counter()
        for c in per_client:
            for b in c:
                st.encode(b)
        return time.perf_counter() - start

    tulip = stack.tulip()
    observed: dict = {}

    def through_ivy() -> float:
        # Tulip's own clock and a perf profile of Ivy and Tulip: where the
        # time goes on our side.
        before = metrics.parse(tulip.metrics())
        perf = PerfRecord([ivy.proc.pid, tulip.proc.pid], stack.log_dir / "batch.perf.data")
        with perf:
            wall = http_clients(ivy.port, ivy_reqs).wall
        after = metrics.parse(tulip.metrics())
        observed.update(stages=metrics.stage_means(before, after), batches=metrics.batch_means(before, after),
                        perf=perf.top(), perf_error=perf.error)
        return wall

    def onnxruntime() -> float:
        start = time.perf_counter()
        for c in per_client:
            for b in c:
                ort.encode(b)
        return time.perf_counter() - start

    int8_steps: dict[str, float] = {}

    def through_int8() -> float:
        assert i8 is not None
        before = metrics.parse(i8[0].metrics())
        wall = http_clients(i8[1].port, ivy_reqs).wall
        int8_steps.clear()
        int8_steps.update(_steps_by_mode(before, metrics.parse(i8[0].metrics())))
        return wall

    sides = {"ivy": through_ivy, "sentence-transformers": in_process}
    if f32 is not None:
        sides["ivy (float32)"] = lambda: http_clients(f32.port, ivy_reqs).wall
    if i8 is not None:
        sides["ivy (int8)"] = through_int8
    if ort is not None:
        sides["onnxruntime"] = onnxruntime
    if inf is not None:
        inf_reqs = [[enc.prepare(Infinity.PATH, {"input": b, "model": INFINITY_MODEL_NAME}) for b in c]
                    for c in per_client]
        sides["infinity"] = lambda: http_clients(inf.port, inf_reqs).wall
    rates: dict[str, list[float]] = {k: [] for k in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            rates[name].append(total / sides[name]())
    best = {k: round(max(v), 2) for k, v in rates.items()}
    ratios = {"ivy / sentence-transformers": ratio(best["ivy"], best["sentence-transformers"])}
    if "onnxruntime" in best:
        ratios["ivy / onnxruntime"] = ratio(best["ivy"], best["onnxruntime"])
    if "infinity" in best:
        ratios["ivy / infinity"] = ratio(best["ivy"], best["infinity"])
    if "ivy (float32)" in best:
        ratios["ivy / ivy (float32)"] = ratio(best["ivy"], best["ivy (float32)"])
        if "onnxruntime" in best:
            ratios["ivy (float32) / onnxruntime"] = ratio(best["ivy (float32)"], best["onnxruntime"])
    if "ivy (int8)" in best and "onnxruntime" in best:
        ratios["ivy (int8) / onnxruntime"] = ratio(best["ivy (int8)"], best["onnxruntime"])
    data = {"params": {"clients": clients, "requests_per_client": requests, "batch": batch, "rounds": rounds,
                       "tokens_per_document": length, "threads": stack.threads,
                       "sentence_transformers_batch_size": 32, "infinity_batch_size": 32},
            "embeddings_per_s": {k: [round(x, 2) for x in v] for k, v in rates.items()},
            "best": best, "ratios": ratios, "notes": notes, "ivy_side": observed,
            "int8_steps_by_mode": int8_steps}
    md = "\n".join([
        f"{clients} client processes × {requests} request(s) × {batch} real-text documents of {length} tokens "
        f"= {total} embeddings per block, {rounds} block(s) per side in rotating order (best reported). "
        f"sentence-transformers encodes the same requests one after another in-process (its default batch "
        f"size 32); onnxruntime (fastembed's runtime) encodes each request's documents as one padded batch "
        f"in-process. Torch and ONNX Runtime threads = {stack.threads}, fp32"
        + ("; ivy's Tulip runs its steps on its bfloat16 twin (this CPU has AMX: `--cpu-bf16 auto`, gated "
           "per token bucket at cosine 0.999), and `ivy (float32)` is the same stack with it off (its small "
           "steps on the CPU fast path, the others eager).\n" if f32 is not None
           else " (this CPU has no AMX: no bfloat16 twin).\n"),
        table(["side", "embeddings/s (best)", "all blocks"], [[k, best[k], ", ".join(f"{x:.1f}" for x in rates[k])] for k in rates]),
        (f"\n`ivy (int8)`: its Tulip with `--cpu-int8 true` (and `--cpu-bf16 false`); its steps in the last "
         f"block by how they ran (`tulip_steps_total`): {_modes_line(int8_steps)}. int8 runs only steps the "
         "CPU fast path takes (up to 256 tokens) and only in buckets whose int8 output reached cosine 0.999 "
         "against float32 at their gate; the rest ran float32.\n" if "ivy (int8)" in rates else ""),
        "\n" + table(["ratio", "value"], [[k, v] for k, v in ratios.items()]),
        "\nOn Ivy's side (last Ivy block; Tulip's /metrics and a perf profile of the Ivy and Tulip processes):\n",
        table(["Tulip stage / batch shape", "steps or requests", "mean"],
              [[v["what"], v["count"], f"{v['mean_ms']} ms"] for v in observed["stages"].values()]
              + [[v["what"], v["steps"], v["mean"]] for v in observed["batches"].values()]),
        "\n" + perf_table(observed["perf"], observed["perf_error"]),
        *[f"\nNote: {x}" for x in notes]])
    return data, md


def _int8_or_note(stack: Stack, notes: list[str]):
    """The int8 stack (Tulip, Ivy), or None with the reason in ``notes``."""
    from bench.harness import gate

    try:
        return stack.int8_stack()
    except (gate.GateFailed, RuntimeError) as e:
        notes.append(f"ivy (int8) not measured: {type(e).__name__}: {e}")
        return None


def _steps_by_mode(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Tulip's steps between two scrapes, by mode (those that ran)."""
    out = {}
    for key, value in after.items():
        if key.startswith("tulip_steps_total{"):
            n = value - before.get(key, 0.0)
            if n:
                out[key.partition('mode="')[2].rstrip('"}')] = n
    return out


def _modes_line(steps: dict[str, float]) -> str:
    return ", ".join(f"{mode} {n:.0f}" for mode, n in sorted(steps.items())) or "none"


def options(scale: float) -> dict:
    return {"requests": scaled(1, scale), "rounds": scaled(1, scale)}


def plot(data: dict, path: Path) -> Path:
    p = data["params"]
    return plots.throughput_bars({f"{p['clients']} clients x {p['batch']} documents": data["best"]}, path,
                                 "Batch embedding: embeddings / s (best block)")
