"""ROSE's ragged forward vs the ``transformers`` padded forward on the CPU.

Same weights, same thread count, same mixed-length batches of token ids:
ROSE runs one flat token axis (no padding); transformers pads each batch to
its longest sequence and masks. Both include pooling and normalisation;
ROSE's outputs are checked against transformers' (cosine >= 0.999) before
anything is timed. Runs alternate between the two so load from other
processes hits both alike; the report gives medians and their ratio.

    python bench/ragged_vs_padded.py --threads 2 --reps 9

Writes ``ragged_vs_padded.{json,md,png}`` to
``bench/results/<date>-cpu-<threads>core/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rose import Engine  # noqa: E402

# name -> (shape of the lengths, sequences): each batch draws its lengths
# from the named distribution with a fixed seed.
WORKLOADS = {
    "queries 16x[8-64]": ("uniform", 16, 8, 64),
    "mixed 32x[8-256]": ("uniform", 32, 8, 256),
    "skewed 32 (1x256, rest 8-32)": ("skewed", 32, 8, 32),
    "documents 8x[128-256]": ("uniform", 8, 128, 256),
}


def lengths_for(kind: str, n: int, lo: int, hi: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    if kind == "skewed":
        lens[0] = 256
    return lens


def batch_ids(lengths: list[int], vocab: int, seed: int, cls: int, sep: int) -> list[list[int]]:
    """Random ids framed like real inputs ([CLS] ... [SEP])."""
    g = torch.Generator().manual_seed(seed)
    return [[cls] + torch.randint(1000, vocab, (n - 2,), generator=g).tolist() + [sep] for n in lengths]


class Padded:
    """The baseline: transformers' AutoModel on a right-padded batch with an
    attention mask, then the model's pooling and normalisation."""

    def __init__(self, model_dir: str, pooling: str, normalize: bool):
        from transformers import AutoModel

        self.model = AutoModel.from_pretrained(model_dir).eval()
        self.pad = int(self.model.config.pad_token_id or 0)
        self.pooling = pooling
        self.normalize = normalize

    @torch.inference_mode()
    def __call__(self, seqs: list[list[int]]) -> torch.Tensor:
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        h = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        if self.pooling == "mean":
            m = mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1)
        else:
            pooled = h[:, 0]
        return F.normalize(pooled, dim=-1) if self.normalize else pooled


def time_pair(rose_fn, hf_fn, reps: int) -> tuple[list[float], list[float]]:
    rose_ms, hf_ms = [], []
    for i in range(reps + 1):
        for fn, out in ((rose_fn, rose_ms), (hf_fn, hf_ms)) if i % 2 else ((hf_fn, hf_ms), (rose_fn, rose_ms)):
            t0 = time.perf_counter()
            fn()
            if i:  # the first round warms both up
                out.append((time.perf_counter() - t0) * 1e3)
    return rose_ms, hf_ms


def models(workdir: Path) -> dict[str, str]:
    """The real all-MiniLM-L6-v2 plus a random XLM-R of bge-m3's width."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    from tests.servers import default_model_dir

    xlmr = workdir / "xlmr-base-random"
    if not (xlmr / "model.safetensors").is_file():
        torch.manual_seed(0)
        cfg = XLMRobertaConfig(vocab_size=250002, hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                               intermediate_size=1536, max_position_embeddings=514, pad_token_id=1)
        XLMRobertaModel(cfg, add_pooling_layer=False).save_pretrained(str(xlmr))
        (xlmr / "tokenizer_config.json").write_text(json.dumps({"cls_token": "<s>", "model_max_length": 512}))
    return {"all-MiniLM-L6-v2 (real)": default_model_dir(), "xlm-roberta 4x384 (random)": str(xlmr)}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{r['model'].split(' ')[0]}\n{r['workload']}" for r in results]
    ratios = [r["speedup"] for r in results]
    ax.bar(range(len(ratios)), ratios, color=["tab:green" if x >= 1 else "tab:red" for x in ratios])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("transformers padded / ROSE ragged (median time)")
    ax.set_title("CPU forward, same weights and threads: speed-up of the ragged path")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rose-bench-models")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()

    results = []
    for model_name, model_dir in models(args.workdir).items():
        engine = Engine.from_dir(model_dir, device="cpu", dtype="float32")
        padded = Padded(model_dir, engine.info.pooling, engine.info.normalize_default)
        cls_id = engine.spec.token_id("cls_token") or 0
        sep_id = engine.spec.token_id("sep_token") or engine.spec.token_id("eos_token") or 2
        for w, (kind, n, lo, hi) in WORKLOADS.items():
            lengths = lengths_for(kind, n, lo, min(hi, engine.info.max_input_length), seed=n + lo + hi)
            seqs = batch_ids(lengths, min(engine.info.vocab_size, 30000), 1, cls_id, sep_id)
            cos = F.cosine_similarity(engine.embed(seqs), padded(seqs), dim=-1).min().item()
            if cos < 0.999:
                raise SystemExit(f"{model_name} {w}: ROSE and transformers disagree (min cosine {cos:.5f})")
            rose_ms, hf_ms = time_pair(lambda: engine.embed(seqs), lambda: padded(seqs), args.reps)
            backend = engine.runner.backend
            if hasattr(backend, "choose"):  # "auto": the backend the table picks for this batch
                backend = backend.choose(sum(lengths), len(lengths))
            tokens, padded_tokens = sum(lengths), len(lengths) * max(lengths)
            r = {"model": model_name, "workload": w, "sequences": len(lengths), "tokens": tokens,
                 "padded_tokens": padded_tokens, "padding_fraction": round(1 - tokens / padded_tokens, 3),
                 "rose_median_ms": round(statistics.median(rose_ms), 2),
                 "hf_median_ms": round(statistics.median(hf_ms), 2),
                 "speedup": round(statistics.median(hf_ms) / statistics.median(rose_ms), 2),
                 "attention": backend.name, "min_cosine": round(cos, 6), "rose_ms": [round(x, 2) for x in rose_ms],
                 "hf_ms": [round(x, 2) for x in hf_ms]}
            results.append(r)
            print(f"{model_name:28s} {w:30s} rose {r['rose_median_ms']:8.1f} ms  hf {r['hf_median_ms']:8.1f} ms"
                  f"  x{r['speedup']:.2f}  padding {r['padding_fraction']:.0%}")

    meta = {"command": "python bench/ragged_vs_padded.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": datetime.date.today().isoformat(), "torch": torch.__version__, "threads": args.threads,
            "reps": args.reps, "cpus": os.cpu_count(),
            "load_average_before": [round(x, 1) for x in load_before],
            "load_average_after": [round(x, 1) for x in os.getloadavg()]}
    out = args.out or REPO / "bench" / "results" / f"{meta['date']}-cpu-{args.threads}core"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ragged_vs_padded.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    lines = ["# ROSE ragged vs transformers padded (CPU)", "",
             f"Command: `{meta['command']}`  ",
             f"Date {meta['date']}; torch {meta['torch']}; {args.threads} threads on a {meta['cpus']}-core machine "
             f"shared with other jobs (load average {meta['load_average_before']} before, "
             f"{meta['load_average_after']} after); {args.reps} alternating runs each, medians.", "",
             "| model | workload | tokens | padded tokens | ROSE attention | ROSE ms | transformers ms | speed-up |",
             "|---|---|---:|---:|---|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['model']} | {r['workload']} | {r['tokens']} | {r['padded_tokens']} | {r['attention']} | "
                     f"{r['rose_median_ms']} | {r['hf_median_ms']} | {r['speedup']:.2f}x |")
    (out / "ragged_vs_padded.md").write_text("\n".join(lines) + "\n")
    plot(results, out / "ragged_vs_padded.png")
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
