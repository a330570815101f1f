"""LoRA adapters (issue 45), in-process on the CPU: the step time of a step
whose sequences chose 4 different adapters and the base model, against
the base model alone on the same tokens (ROSE's eager float32 step, the
runtime an adapter step takes, as Tulip runs it: packed linear layers,
one thread below 32 tokens), interleaved step by step; beside them the
base step with the 4 adapters resident but none chosen (what resident
adapters cost the steps that use none). Two adapter shapes: rank 16 on
query and value (PEFT's default for BERT) and rank 16 on every linear
projection; two steps: 5 queries (one per choice) and 20 documents of 128
tokens (the choices round-robin, so each adapter's rows are gathered by
index). Also the time to load a rank-16 adapter from disk (read, checked,
placed), load and unload alternating. Every adapter is gated first: ROSE's
vectors against PEFT's merged model through sentence-transformers."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.harness import gate, inputs
from bench.harness.results import table
from bench.harness.stack import Stack
from bench.harness.timing import Stats, interleave, ratio, scaled

TITLE = "LoRA adapters: a step mixing 4 adapters and the base model vs the base model alone; adapter load time"
RANK = 16
ADAPTERS = 4
# What the adapters adapt (the table's label) → (their names' prefix, PEFT's target_modules).
TARGETS = {"query, value": ("qv", ["query", "value"]), "all linear": ("all", ["query", "key", "value", "dense"])}
DOCUMENTS = (20, 128)
TARGET_RATIO = 1.15
TARGET_LOAD_MS = 100.0


def run(stack: Stack, rounds: int = 100, warmup: int = 10, loads: int = 30) -> tuple[dict, str]:
    import torch

    from bench.harness.lora_adapters import merged_st, random_adapter
    from rose import Batch, Engine

    torch.set_num_threads(stack.threads)
    base = Engine.from_dir(stack.model_dir, device="cpu", dtype="float32")
    longest = base.info.max_input_length
    queries = [inputs.ids(stack.model_dir, q, longest) for q in inputs.queries(stack.model_dir, ADAPTERS + 1)]
    docs, n = DOCUMENTS
    documents = [inputs.ids(stack.model_dir, t, longest)
                 for t in inputs.texts_of_tokens(stack.model_dir, min(n, longest), docs)]
    gate_texts = inputs.queries(stack.model_dir, 8)
    gate_ids = [inputs.ids(stack.model_dir, t, longest) for t in gate_texts]
    work = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    rows, data_rows, loads_ms = [], [], []
    for shape, (prefix, targets) in TARGETS.items():
        names = [f"{prefix}-{i}" for i in range(ADAPTERS)]
        adapted = Engine.from_dir(stack.model_dir, device="cpu", dtype="float32")
        for i, name in enumerate(names):
            path = random_adapter(stack.model_dir, work / name, targets, r=RANK, alpha=2 * RANK, seed=i)
            adapted.load_adapter(name, path)
            want = merged_st(stack.model_dir, path).encode(gate_texts)
            got = adapted.embed(gate_ids, adapters=[name] * len(gate_ids))
            stack.gates.append(gate.check(f"rose + adapter {name}", got.numpy(), want,
                                          "sentence-transformers on PEFT's merge_and_unload"))
        if shape == "query, value":  # load time of one rank-16 adapter, the others resident
            path = work / names[0]
            for _ in range(loads):
                adapted.unload_adapter(names[0])
                t = time.perf_counter()
                adapted.load_adapter(names[0], path)
                loads_ms.append((time.perf_counter() - t) * 1e3)
        choices = [*names, None]
        for step, seqs in (("5 queries", queries), (f"{docs} x {min(n, longest)}", documents)):
            mixed = [choices[i % len(choices)] for i in range(len(seqs))]
            batches = {"base": (base, Batch.from_lists(seqs)),
                       "base, adapters resident": (adapted, Batch.from_lists(seqs)),
                       "4 adapters + base": (adapted, Batch.from_lists(seqs, adapters=mixed))}
            modes: dict[str, str] = {}
            lat = interleave({k: _side(e, b, k, modes) for k, (e, b) in batches.items()}, rounds, warmup)
            stats = {k: Stats.of(v) for k, v in lat.items()}
            b, r, m = stats["base"], stats["base, adapters resident"], stats["4 adapters + base"]
            tokens = sum(len(s) for s in seqs)
            rows.append([shape, step, tokens, b.p50, r.p50, m.p50, ratio(m.p50, b.p50), ratio(r.p50, b.p50)])
            data_rows.append({"adapters": shape, "step": step, "tokens": tokens, "sequences": len(seqs),
                              "choices": mixed, "modes": modes, "base": b.to_dict(), "resident": r.to_dict(),
                              "mixed": m.to_dict(), "mixed_over_base_p50": ratio(m.p50, b.p50),
                              "resident_over_base_p50": ratio(r.p50, b.p50)})
    load = Stats.of([ms / 1e3 for ms in loads_ms])
    info = base.info
    data = {"params": {"rounds": rounds, "warmup": warmup, "threads": stack.threads, "model_dir": stack.model_dir,
                       "dtype": "float32", "rank": RANK, "adapters": ADAPTERS, "order": "shuffled every round"},
            "steps": data_rows, "load_ms": load.to_dict(),
            "targets": {"mixed_over_base_p50": TARGET_RATIO, "load_ms_p50": TARGET_LOAD_MS}}
    md = "\n".join([
        f"In-process on the CPU ({info.model_id}, float32, eager: the runtime a step with adapters takes), "
        f"{rounds} interleaved rounds after {warmup} warm-up rounds, threads = {stack.threads}. {ADAPTERS} random "
        f"rank-{RANK} adapters (alpha {2 * RANK}) per row, each gated against PEFT's merged model first; "
        "\"4 adapters + base\": the step's sequences choose the 4 adapters and the base model in turn; \"base, "
        "adapters resident\": the same engine, no sequence choosing one.\n",
        table(["adapters", "step", "tokens", "base p50 ms", "base, adapters resident p50 ms",
               "4 adapters + base p50 ms", "mixed / base", "resident / base"], rows),
        f"\nTarget: mixed / base ≤ {TARGET_RATIO}.",
        f"\nLoading a rank-{RANK} adapter on query and value ({loads} loads, the other {ADAPTERS - 1} resident): "
        f"p50 {load.p50:.1f} ms, max {load.max:.1f} ms (target ≤ {TARGET_LOAD_MS:.0f} ms).",
        "\nOn a served Tulip with the CPU fast path, the base step of a small batch runs on ONNX Runtime instead "
        "(`cpu-steps`), while a step with any adapter runs eagerly, as here."])
    return data, md


def _side(engine, batch, key: str, modes: dict[str, str]):
    """One step of ``batch`` on ``engine``, its mode kept under ``key``."""
    def once(_):
        lazy = engine.step(batch)
        modes[key] = lazy.info.mode
        lazy.release()
    return once


def options(scale: float) -> dict:
    return {"rounds": scaled(100, scale, 10), "warmup": scaled(10, scale, 2), "loads": scaled(30, scale, 5)}
