"""ROSE on a GPU, in one short run: every family and output kind with every
attention backend that imports there, in bf16 (and fp32 where the backend
takes it), against ROSE's fp32 CPU outputs (which the test suite checks
against transformers), plus a mixed-length batch against each sequence
alone. Prints a table and writes JSON + markdown.

    python -m bench.gpu.engine_check --out /tmp/gpu-check          # on the GPU machine
    python -m bench.gpu.engine_check --dry-run --out /tmp/check    # CPU, keeps it working

Exit status 1 when any cell misses its tolerance (bf16: cosine >= 0.99,
sparse weights within 0.05 + 5%; fp32: cosine >= 0.999).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.harness.tiny_models import tiny_bert, tiny_qwen3, tiny_reranker, tiny_xlmr
from rose import Engine
from rose.attention import available_backends

MODELS = {  # name -> (builder, kwargs, kinds)
    "bert": (tiny_bert, {}, ["dense"]),
    "xlmr-m3": (tiny_xlmr, {}, ["dense", "sparse", "multi_vector"]),
    "rerank-bert": (tiny_reranker, {"arch": "bert"}, ["score"]),
    "rerank-xlmr": (tiny_reranker, {"arch": "xlm-roberta"}, ["score"]),
    "qwen3": (tiny_qwen3, {}, ["dense"]),
    "pplx": (tiny_qwen3, {"variant": "pplx"}, ["dense"]),
}
LENGTHS = [1, 2, 5, 13, 34, 89, 233, 512, 7, 100, 300, 450, 3, 64, 128, 256]


def sequences(vocab: int, cap: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(4, min(vocab, 30000), (min(n, cap),), generator=g).tolist() for n in LENGTHS]
    for s in seqs[4:]:
        s[0], s[len(s) // 2] = 0, 102  # a leading special token, a separator inside
    return seqs


def compare(kind: str, got: torch.Tensor, want: torch.Tensor, dtype: str) -> tuple[bool, float]:
    """(passes, worst metric): cosine for vectors, max error for scores and
    sparse weights."""
    got, want = got.double(), want.double()
    if kind in ("sparse", "score"):
        err = (got - want).abs()
        slack = (0.05 + 0.05 * want.abs()) if dtype != "float32" else 1e-3 * (1 + want.abs())
        return bool((err <= slack).all()), err.max().item()
    cos = F.cosine_similarity(got, want, dim=-1).min().item() if got.numel() else 1.0
    return cos >= (0.99 if dtype != "float32" else 0.999), cos


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU only, the BGE-M3-style model")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda, "backends": sorted(available_backends(device))}
    if device == "cuda":
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True)
        print(smi.stdout)
    print(json.dumps(meta))
    dtypes = ["float32"] if device == "cpu" else ["bfloat16", "float16", "float32"]
    models = {"xlmr-m3": MODELS["xlmr-m3"]} if args.dry_run else MODELS

    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name, (build, kw, kinds) in models.items():
            model_dir = build(Path(tmp) / name, **kw)
            reference = Engine.from_dir(model_dir, device="cpu", dtype="float32")
            cap = 48 if args.dry_run else 512
            seqs = sequences(reference.info.vocab_size, min(cap, reference.info.max_input_length))
            want = {k: reference.embed(seqs, kind=k) for k in kinds}
            for backend in meta["backends"]:
                for dtype in dtypes:
                    try:
                        engine = Engine.from_dir(model_dir, device=device, dtype=dtype, attention=backend)
                    except ValueError as e:  # the backend does not take this shape or dtype
                        rows.append({"model": name, "backend": backend, "dtype": dtype, "skipped": str(e)})
                        continue
                    for kind in kinds:
                        t0 = time.perf_counter()
                        got = engine.embed(seqs, kind=kind)
                        ms = (time.perf_counter() - t0) * 1e3
                        passed, metric = compare(kind, got, want[kind], dtype)
                        alone = torch.cat([engine.embed([s], kind=kind) for s in seqs])
                        ragged = (alone.double() - got.double()).abs().max().item() if got.numel() else 0.0
                        ok &= passed
                        rows.append({"model": name, "backend": backend, "dtype": dtype, "kind": kind,
                                     "passed": passed, "metric": round(metric, 6),
                                     "batch_vs_alone_max_abs": ragged, "ms": round(ms, 2)})
                        print(f"{name:12s} {backend:12s} {dtype:9s} {kind:12s} {'ok ' if passed else 'BAD'} "
                              f"{metric:.6f}  batch-vs-alone {ragged:.2e}  {ms:.1f} ms")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_engine_check.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [f"# ROSE engine check on {meta['device']}", "", f"torch {meta['torch']}, CUDA {meta['cuda']}; "
             f"backends: {', '.join(meta['backends'])}", "",
             "| model | backend | dtype | kind | ok | min cosine / max abs err | batch vs alone |", "|---|---|---|---|---|---:|---:|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['backend']} | {r['dtype']} | - | skipped | - | - |")
        else:
            lines.append(f"| {r['model']} | {r['backend']} | {r['dtype']} | {r['kind']} | "
                         f"{'yes' if r['passed'] else 'NO'} | {r['metric']} | {r['batch_vs_alone_max_abs']:.1e} |")
    (args.out / "gpu_engine_check.md").write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
