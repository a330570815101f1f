"""Step time per token bucket, in-process, on the CPU: ROSE's eager step
(as Tulip runs it: packed linear layers, one thread below 32 tokens)
against the CPU fast path (ONNX Runtime on ROSE's own export,
``rose/cpu/onnx.py``), the same with its int8 copy (``rose/cpu/int8.py``:
served as ``--cpu-int8`` serves it, int8 where the bucket's gate passed,
and the int8 copy alone, ungated, with its cosine against float32) and,
where the CPU has bfloat16 arithmetic, the
bfloat16 twin (``rose/cpu/bf16.py``), interleaved step by step on real text
of each bucket's size, batch 1, plus one step of 4 queries and two large
steps of 16 documents (fewer rounds); beside them, when
the ``onnxruntime`` side loads, ONNX Runtime on the ``transformers`` export
as fastembed runs it (``bench/baselines/inprocess.py``: the same session
options, ids padded to the longest, the session's run only). Also the fast
path's build time, its gate per bucket and the resident memory it added."""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

from bench.harness import inputs, plots
from bench.harness.results import table
from bench.harness.stack import Stack
from bench.harness.timing import Stats, ratio, scaled

TITLE = "CPU step time per bucket: eager vs the CPU fast path (ONNX Runtime, float32 and int8) vs the bfloat16 twin"
# Real tokens per step, batch 1 (one per bucket of the default grid).
TOKENS = (12, 28, 60, 120, 250)
QUERIES_IN_ONE_STEP = 4
# Large steps (documents x tokens, capped to the model's length), as a
# batch request's steps are: the twin's ground. Eager takes ~0.1-1 s each.
LARGE = ((16, 128), (16, 256))
LARGE_ROUNDS_DIVISOR = 20


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _ort_runner(session, seqs: list[list[int]]):
    from bench.baselines.inprocess import padded

    ids, mask = padded(seqs)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}

    def once():
        session.run(None, feed)
        return "onnxruntime"
    return once


def run(stack: Stack, rounds: int = 200, warmup: int = 20) -> tuple[dict, str]:
    import torch

    from rose import Batch, Engine
    from rose.cpu import Bf16Settings, Int8Settings, OnnxSettings
    from rose.cpu.gated import min_cosine
    from rose.cpu.int8 import dot_products
    from rose.step.inputs import resolve_defaults

    torch.set_num_threads(stack.threads)
    eager = Engine.from_dir(stack.model_dir, device="cpu", dtype="float32")
    rss_before = _rss_mb()
    fast = Engine.from_dir(stack.model_dir, device="cpu", dtype="float32", cpu_runtimes=[OnnxSettings()])
    onnx = fast.runner.runtime("onnx")
    if onnx is None:
        raise RuntimeError("the CPU fast path is unavailable here (pip install 'tulip-rose[cpu-fast]')")
    started = time.perf_counter()
    states = fast.warm()["onnx"]
    warm_s = time.perf_counter() - started
    rss_after = _rss_mb()
    notes: list[str] = []
    # Forced on (not auto), so that a CPU with AVX-512 BF16 but no AMX is
    # measured too; absent where the CPU has no bfloat16 arithmetic at all.
    twin = Engine.from_dir(stack.model_dir, device="cpu", dtype="float32",
                           cpu_runtimes=[Bf16Settings(require_amx=False)])
    twin_states: dict[int, str] = {}
    if twin.runner.runtime("bf16") is None:
        notes.append("bf16 twin not measured: this CPU or PyTorch has no bfloat16 matmuls (rose/cpu/bf16.py)")
        twin = None
    else:
        twin_states = twin.warm()["bf16"]
    # The int8 copy, forced on (not auto) as the twin is; its float32
    # session takes the buckets its gate refuses, as served.
    int8 = Engine.from_dir(stack.model_dir, device="cpu", dtype="float32",
                           cpu_runtimes=[OnnxSettings(), Int8Settings(require_dot=False)])
    int8_rt = int8.runner.runtime("onnx_int8")
    int8_states: dict[int, str] = {}
    if int8_rt is None:
        notes.append("int8 not measured: the int8 copy cannot run for this model here (rose/cpu/int8.py)")
        int8 = None
    else:
        int8_states = int8.warm()["onnx_int8"]

    max_len = min(stack.max_length, max(TOKENS))
    steps = {f"1 x {n}": [stack.ids(inputs.text_of_tokens(stack.model_dir, min(n, max_len)))] for n in TOKENS}
    queries = inputs.queries(stack.model_dir, QUERIES_IN_ONE_STEP)
    steps[f"{QUERIES_IN_ONE_STEP} queries"] = [stack.ids(q) for q in queries]
    large = {}
    for docs, n in LARGE:
        n = min(n, stack.max_length)
        large[f"{docs} x {n}"] = [stack.ids(t) for t in inputs.texts_of_tokens(stack.model_dir, n, docs)]
    steps.update(large)

    def runner(engine, seqs):
        batch = Batch.from_lists(seqs)

        def once():
            lazy = engine.step(batch)
            mode = lazy.info.mode
            lazy.release()
            return mode
        return once

    def ungated(seqs):
        batch = Batch.from_lists(seqs)
        resolve_defaults(batch, int8.info.dimension, int8.info.normalize_default)

        def once():
            int8_rt.run_ungated(batch)
            return "onnx_int8 (ungated)"
        return once

    engines = {"eager": eager, "fast path": fast, **({"bf16 twin": twin} if twin else {}),
               **({"int8": int8} if int8 else {})}
    sides = {(name, side): runner(engine, seqs) for name, seqs in steps.items() for side, engine in engines.items()}
    # The int8 copy alone on the steps it could take, and its cosine
    # against the eager float32 step: what the gate judged.
    int8_cos: dict[str, float] = {}
    if int8 is not None:
        for name, seqs in steps.items():
            if int8_rt.key(Batch.from_lists(seqs)) is None:
                continue
            sides[(name, "int8 copy")] = ungated(seqs)
            batch = Batch.from_lists(seqs)
            resolve_defaults(batch, int8.info.dimension, int8.info.normalize_default)
            got = int8_rt.run_ungated(batch)
            int8_cos[name] = round(min_cosine(got.numpy(), eager.embed(seqs).numpy()), 6)
    ort = stack.onnxruntime_or_note(notes)
    if ort is not None:
        sides.update({(name, "onnxruntime"): _ort_runner(ort.session, seqs) for name, seqs in steps.items()})
    modes = {k: fn() for k, fn in sides.items()}
    for _ in range(warmup):
        for (name, _side), fn in sides.items():
            if name not in large:
                fn()
    lat: dict = {k: [] for k in sides}
    rng = random.Random(0)
    keys = list(sides)
    for r in range(rounds):
        rng.shuffle(keys)
        for k in keys:
            if k[0] in large and r % LARGE_ROUNDS_DIVISOR:
                continue
            t = time.perf_counter()
            sides[k]()
            lat[k].append(time.perf_counter() - t)
    stats = {k: Stats.of(v) for k, v in lat.items()}
    rows, data_rows, int8_rows = [], [], []
    for name, seqs in steps.items():
        e, f = stats[(name, "eager")], stats[(name, "fast path")]
        tokens = sum(len(s) for s in seqs)
        bucket = onnx.settings.bucket(tokens)
        r = ratio(e.p50, f.p50)
        o = stats.get((name, "onnxruntime"))
        b = stats.get((name, "bf16 twin"))
        rows.append([name, tokens, bucket or "–", modes[(name, "fast path")], e.p50, f.p50, r]
                    + ([b.p50, ratio(e.p50, b.p50), modes[(name, "bf16 twin")]] if b else [])
                    + ([o.p50, ratio(f.p50, o.p50)] if o else []))
        i8, i8c = stats.get((name, "int8")), stats.get((name, "int8 copy"))
        if i8 is not None:
            int8_rows.append([name, tokens, modes[(name, "int8")], i8.p50, i8c.p50 if i8c else "–", f.p50,
                              ratio(f.p50, i8c.p50) if i8c else "–",
                              f"{int8_cos[name]:.4f}" if name in int8_cos else "–"]
                             + ([o.p50, ratio(o.p50, i8.p50)] if o else []))
        data_rows.append({"step": name, "tokens": tokens, "rounds": e.count, "bucket": bucket,
                          "fast_mode": modes[(name, "fast path")],
                          "eager": e.to_dict(), "fast": f.to_dict(), "speedup_p50": r,
                          **({"bf16": b.to_dict(), "bf16_mode": modes[(name, "bf16 twin")],
                              "eager_over_bf16_p50": ratio(e.p50, b.p50)} if b else {}),
                          **({"onnxruntime": o.to_dict(), "fast_over_onnxruntime_p50": ratio(f.p50, o.p50)}
                             if o else {}),
                          **({"int8": i8.to_dict(), "int8_mode": modes[(name, "int8")]} if i8 else {}),
                          **({"int8_copy_ungated": i8c.to_dict(), "int8_copy_min_cosine": int8_cos[name],
                              "fast_over_int8_copy_p50": ratio(f.p50, i8c.p50)} if i8c else {}),
                          **({"onnxruntime_over_int8_p50": ratio(o.p50, i8.p50)} if i8 and o else {})})
    gates = {str(b): round(c, 6) for b, c in onnx.gates.items()}
    twin_gates = {str(b): round(c, 6) for b, c in twin.runner.runtime("bf16").gates.items()} if twin else {}
    int8_gates = {str(b): round(c, 6) for b, c in int8_rt.gates.items()} if int8 else {}
    data = {"params": {"rounds": rounds, "warmup": warmup, "threads": stack.threads, "model_dir": stack.model_dir,
                       "dtype": "float32", "order": "shuffled every round"},
            "steps": data_rows, "bucket_states": {str(b): s for b, s in states.items()}, "gates_min_cosine": gates,
            "bf16_bucket_states": {str(b): s for b, s in twin_states.items()}, "bf16_gates_min_cosine": twin_gates,
            "int8_bucket_states": {str(b): s for b, s in int8_states.items()}, "int8_gates_min_cosine": int8_gates,
            "int8_dot_products": dot_products(),
            "build_and_warm_seconds": round(warm_s, 1),
            "notes": notes,
            "rss_mb": {"before_fast_engine": round(rss_before, 1), "after_warm": round(rss_after, 1),
                       "added": round(rss_after - rss_before, 1)}}
    md = "\n".join([
        f"In-process, {rounds} interleaved rounds after {warmup} warm-up rounds (the large steps: every "
        f"{LARGE_ROUNDS_DIVISOR}th round, no warm-up rounds), threads = {stack.threads}. "
        "Eager: ROSE's float32 ragged step as Tulip runs it; fast path: the same engine API with the CPU fast "
        "path (ONNX Runtime, float32) built and gated for every bucket first (`Engine.warm`), "
        "eager above its 256 tokens; bf16 twin: the same with the bfloat16 twin instead, every bucket up to 4096 "
        "tokens gated first (`Engine.warm`).\n",
        table(["step", "tokens", "bucket", "fast path ran as", "eager p50 ms", "fast p50 ms", "eager / fast"]
              + (["bf16 p50 ms", "eager / bf16", "bf16 ran as"] if twin else [])
              + (["onnxruntime p50 ms", "fast / onnxruntime"] if ort else []), rows),
        "\nonnxruntime: the `transformers` export on ONNX Runtime as the `onnxruntime` side of `queries` and "
        "`batch` runs it (fastembed's runtime), interleaved with the other two; its step only (no tokenizer, "
        "no pooling), on the same ids (padded to the longest for the 4 queries).\n" if ort else "",
        f"\nBuild (export + session) and gating of every bucket: {warm_s:.1f} s. Fidelity gate per bucket (min "
        f"cosine against the eager step): {', '.join(f'{b}: {c}' for b, c in gates.items())}.",
        (f"\nbfloat16 twin's gate per bucket (min cosine against the float32 eager step): "
         f"{', '.join(f'{b}: {c}' for b, c in twin_gates.items())}." if twin else ""),
        ("\nint8 (`--cpu-int8`, `rose/cpu/int8.py`; this CPU's int8 dot products: "
         f"{dot_products() or 'none'}): served, the fast path runs a bucket in int8 only where the int8 copy's "
         "rows reached cosine 0.999 against the float32 step at its gate, else on its float32 session (ran as "
         "`onnx`); the int8 copy alone (ungated) is timed beside it on the steps the fast path takes, with its "
         "min cosine against the eager float32 step on that step's rows. Gate per bucket: "
         f"{', '.join(f'{b}: {c} ({int8_states.get(int(b))})' for b, c in int8_gates.items())}.\n\n"
         + table(["step", "tokens", "int8 served ran as", "int8 served p50 ms", "int8 copy p50 ms (ungated)",
                  "fast path float32 p50 ms", "float32 / int8 copy", "int8 copy min cosine"]
                 + (["onnxruntime p50 ms", "onnxruntime / int8 served"] if ort else []), int8_rows)
         if int8 else ""),
        f"\nResident memory of the process: {rss_before:.0f} MB before the second (fast-path) engine loaded, "
        f"{rss_after:.0f} MB once its fast path was built (+{rss_after - rss_before:.0f} MB: that engine's model "
        "and its ONNX Runtime session).",
        f"\nMean speed-up over the batch-1 rows: "
        f"{statistics.mean(r['speedup_p50'] for r in data_rows[:len(TOKENS)] if r['speedup_p50']):.2f}×.",
        *(f"\nNote: {n}" for n in notes)])
    return data, md


def options(scale: float) -> dict:
    return {"rounds": scaled(200, scale, 20), "warmup": scaled(20, scale, 5)}


def plot(data: dict, path: Path) -> Path:
    groups = {r["step"]: {"eager": r["eager"]["p50"], "fast path": r["fast"]["p50"],
                          **({"bf16 twin": r["bf16"]["p50"]} if "bf16" in r else {}),
                          **({"int8 (served)": r["int8"]["p50"]} if "int8" in r else {}),
                          **({"onnxruntime": r["onnxruntime"]["p50"]} if "onnxruntime" in r else {})}
              for r in data["steps"]}
    return plots.throughput_bars(groups, path, "CPU step time per bucket: eager vs fast path vs bf16 twin (p50)",
                                 ylabel="p50 step time, ms")
