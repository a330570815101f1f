"""Attention backend sweep: times every available backend on ragged
batches over a grid of model shapes (heads, KV heads, head dim, causal) and
batches (sequences x mean length), and writes the selection table ROSE's
"auto" backend reads (``rose/attention/tables/<device>.json``).

    python -m bench.scripts.attention_sweep --device cuda --write-table   # on a GPU
    python -m bench.scripts.attention_sweep --device cpu --write-table    # CPU table
    python -m bench.scripts.attention_sweep --dry-run --out /tmp/sweep    # CI smoke

Results (JSON + markdown) go to ``bench/results/<date>-<machine>/`` unless
``--out`` says otherwise. ``--dry-run`` runs a two-cell grid with one
iteration on the CPU so the script keeps working between GPU runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from rose.attention import AttnShape, available_backends, device_kind
from rose.attention.selection import TABLES

REPO = Path(__file__).resolve().parents[2]

# (name, heads, kv heads, head dim, causal): the served families' shapes.
GPU_SHAPES = [
    ("bge-m3", 16, 16, 64, False),
    ("minilm", 12, 12, 32, False),
    ("qwen3-0.6b", 16, 8, 128, True),
    ("pplx-0.6b", 16, 8, 128, False),
    ("pplx-4b", 32, 8, 128, False),
]
CPU_SHAPES = [
    ("minilm", 12, 12, 32, False),
    ("bge-m3", 16, 16, 64, False),
    ("qwen3-0.6b", 16, 8, 128, True),
    ("pplx-0.6b", 16, 8, 128, False),
]
GRIDS = {  # (sequences, mean length)
    "cuda": [(s, n) for s in (1, 4, 16, 64) for n in (64, 128, 512, 2048, 8192) if s * n <= 65536],
    "cpu": [(s, n) for s in (1, 4, 16, 32, 64) for n in (16, 64, 256) if s * n <= 4096],  # Tulip CPU budget
    "dry": [(1, 16), (4, 32)],
}


def lengths_for(sequences: int, mean: int, seed: int) -> list[int]:
    """Mixed lengths around ``mean`` (between half and one and a half)."""
    g = torch.Generator().manual_seed(seed)
    return [max(1, int(mean * (0.5 + torch.rand(1, generator=g).item()))) for _ in range(sequences)]


def time_backend(backend, q, k, v, cu, lengths, causal, iters: int, device) -> tuple[float, float]:
    """(min, median) microseconds of one attend, plan included (it runs per
    step). Rankings use the minimum: on a shared machine other processes
    only ever add time."""
    scale = q.shape[-1] ** -0.5
    times = []
    for i in range(iters + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        plan = backend.plan(cu, lengths, max(lengths), causal)
        backend.attend(q, k, v, plan, scale)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:  # the first call warms up (kernel selection, JIT)
            times.append((time.perf_counter() - t0) * 1e6)
    return min(times), statistics.median(times)


def sweep(device: torch.device, dtype: torch.dtype, shapes, grid, iters: int) -> list[dict]:
    backends = available_backends(device)
    cells = []
    for name, heads, kv, dim, causal in shapes:
        shape = AttnShape(heads, kv, dim, causal)
        usable = [b for b in backends.values() if b.supports(shape, device, dtype)]
        for b in usable:
            b.bind(shape, device, dtype)
        for seqs, mean in grid:
            lengths = lengths_for(seqs, mean, seed=seqs * 7919 + mean)
            t = sum(lengths)
            cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)
            g = torch.Generator(device="cpu").manual_seed(t)
            q = torch.randn(t, heads, dim, generator=g).to(device, dtype)
            k = torch.randn(t, kv, dim, generator=g).to(device, dtype)
            v = torch.randn(t, kv, dim, generator=g).to(device, dtype)
            us, median = {}, {}
            for b in usable:
                if b.max_tokens is not None and t > b.max_tokens:
                    continue
                try:
                    best, mid = time_backend(b, q, k, v, cu, lengths, causal, iters, device)
                    us[b.name], median[b.name] = round(best, 1), round(mid, 1)
                except Exception as e:  # a kernel that rejects this cell is just not ranked there
                    print(f"  {b.name} failed on {name} {seqs}x{mean}: {e}", file=sys.stderr)
            ranking = sorted(us, key=us.get)
            cells.append({"model": name, "heads": heads, "kv_heads": kv, "head_dim": dim, "causal": causal,
                          "dtype": str(dtype).removeprefix("torch."), "tokens": t, "sequences": seqs,
                          "ranking": ranking, "us": us, "median_us": median})
            print(f"{name:11s} seqs={seqs:3d} tokens={t:6d} " + "  ".join(f"{n}={us[n]:.0f}us" for n in ranking))
    return cells


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def markdown(meta: dict, cells: list[dict]) -> str:
    names = sorted({n for c in cells for n in c["us"]})
    lines = [f"# Attention backend sweep ({meta['device_kind']}, {meta['dtype']})", "",
             f"Command: `{meta['command']}`  ", f"Date: {meta['date']}; torch {meta['torch']}; "
             f"threads {meta['threads']}; load average {meta['load']}; minimum of {meta['iters']} runs "
             "(rankings use it), plan included.", "",
             "| model | seqs | tokens | " + " | ".join(f"{n} (µs)" for n in names) + " | fastest | vs sdpa |",
             "|---|---:|---:|" + "---:|" * len(names) + "---|---:|"]
    for c in cells:
        us = c["us"]
        best = c["ranking"][0] if c["ranking"] else "-"
        ratio = f"{us['sdpa'] / us[best]:.2f}x" if "sdpa" in us and best in us else "-"
        row = " | ".join(f"{us[n]:.0f}" if n in us else "-" for n in names)
        lines.append(f"| {c['model']} | {c['sequences']} | {c['tokens']} | {row} | {best} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    p.add_argument("--dry-run", action="store_true", help="two tiny cells on the CPU, one iteration")
    p.add_argument("--write-table", action="store_true", help="update rose/attention/tables/<device>.json")
    p.add_argument("--out", type=Path, default=None, help="results folder (default bench/results/<date>-<machine>)")
    args = p.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu" if args.dry_run else args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    shapes = (CPU_SHAPES[:1] + CPU_SHAPES[2:3]) if args.dry_run else (GPU_SHAPES if device.type == "cuda" else CPU_SHAPES)
    grid = GRIDS["dry" if args.dry_run else device.type]
    iters = 1 if args.dry_run else args.iters

    kind = device_kind(device)
    meta = {"device_kind": kind, "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "iters": iters, "load": _load(),
            "date": datetime.date.today().isoformat(), "command": "python " + " ".join(sys.argv)}
    cells = sweep(device, dtype, shapes, grid, iters)

    today = datetime.date.today().isoformat()
    machine = f"{kind}-{torch.get_num_threads()}core" if device.type == "cpu" else kind
    out = args.out or REPO / "bench" / "results" / f"{today}-{machine}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention_sweep.json").write_text(json.dumps({"meta": meta, "cells": cells}, indent=1) + "\n")
    (out / "attention_sweep.md").write_text(markdown(meta, cells))
    if args.write_table and not args.dry_run:
        TABLES.mkdir(parents=True, exist_ok=True)
        (TABLES / f"{kind}.json").write_text(json.dumps({"meta": meta, "cells": cells}, indent=1) + "\n")
        print(f"wrote {TABLES / f'{kind}.json'}")
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
