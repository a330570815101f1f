"""ROSE's ragged forward vs the ``transformers`` padded forward on the CPU.

Same weights, same thread count, same mixed-length batches of token ids:
ROSE runs one flat token axis (linear layers never see padding; attention
per sequence with ``sdpa``, or padded for attention only with
``sdpa_padded``); transformers pads each batch to its longest sequence and
masks. Both include pooling and normalisation;
ROSE's outputs are checked against transformers' (cosine >= 0.999) before
anything is timed. Runs rotate between them so load from other
processes hits both alike; the report gives medians and their ratio.

    python -m bench.scripts.ragged_vs_padded --threads 2 --reps 9

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

from rose import Engine

REPO = Path(__file__).resolve().parents[2]

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


def time_all(fns: dict, reps: int) -> dict[str, list[float]]:
    """Milliseconds per call of each function, run in rotating order so
    load from other processes falls on all of them alike."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for i in range(reps + 1):
        for name in names[i % len(names):] + names[: i % len(names)]:
            t0 = time.perf_counter()
            fns[name]()
            if i:  # the first round warms everything up
                out[name].append((time.perf_counter() - t0) * 1e3)
    return out


def models(workdir: Path) -> dict[str, str]:
    """The real all-MiniLM-L6-v2 plus a random XLM-R of bge-m3's width."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    from tulip_rose_cli.launch import default_model_dir

    xlmr = workdir / "xlmr-base-random"
    if not (xlmr / "model.safetensors").is_file():
        torch.manual_seed(0)
        cfg = XLMRobertaConfig(vocab_size=250002, hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                               intermediate_size=1536, max_position_embeddings=514, pad_token_id=1)
        XLMRobertaModel(cfg, add_pooling_layer=False).save_pretrained(str(xlmr))
        (xlmr / "tokenizer_config.json").write_text(json.dumps({"cls_token": "<s>", "model_max_length": 512}))
    return {"all-MiniLM-L6-v2 (real)": default_model_dir(), "xlm-roberta 4x384 (random)": str(xlmr)}


def plot(results: list[dict], backends: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = [f"{r['model'].split(' ')[0]}\n{r['workload']}" for r in results]
    width = 0.8 / len(backends)
    for i, a in enumerate(backends):
        xs = [j + (i - (len(backends) - 1) / 2) * width for j in range(len(results))]
        ax.bar(xs, [r["speedup"][a] for r in results], width, label=f"ROSE ragged, attention {a}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("transformers padded time / ROSE time (median)")
    ax.set_title("CPU forward, same weights, same threads: speed-up of the ragged path")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--attention", type=lambda v: v.split(","), default=["sdpa", "sdpa_padded"],
                   help="ROSE attention backends to time, comma-separated")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rose-bench-models")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()

    results = []
    for model_name, model_dir in models(args.workdir).items():
        engines = {a: Engine.from_dir(model_dir, device="cpu", dtype="float32", attention=a) for a in args.attention}
        info, spec = next(iter(engines.values())).info, next(iter(engines.values())).spec
        padded = Padded(model_dir, info.pooling, info.normalize_default)
        cls_id = spec.token_id("cls_token") or 0
        sep_id = spec.token_id("sep_token") or spec.token_id("eos_token") or 2
        for w, (kind, n, lo, hi) in WORKLOADS.items():
            lengths = lengths_for(kind, n, lo, min(hi, info.max_input_length), seed=n + lo + hi)
            seqs = batch_ids(lengths, min(info.vocab_size, 30000), 1, cls_id, sep_id)
            want = padded(seqs)
            for a, e in engines.items():
                cos = F.cosine_similarity(e.embed(seqs), want, dim=-1).min().item()
                if cos < 0.999:
                    raise SystemExit(f"{model_name} {w} ({a}): ROSE and transformers disagree (min cosine {cos:.5f})")
            fns = {"transformers": lambda padded=padded, seqs=seqs: padded(seqs)}
            fns.update({a: (lambda e=e, seqs=seqs: e.embed(seqs)) for a, e in engines.items()})
            ms = time_all(fns, args.reps)
            hf = statistics.median(ms["transformers"])
            tokens, padded_tokens = sum(lengths), len(lengths) * max(lengths)
            r = {"model": model_name, "workload": w, "sequences": len(lengths), "tokens": tokens,
                 "padded_tokens": padded_tokens, "padding_fraction": round(1 - tokens / padded_tokens, 3),
                 "hf_median_ms": round(hf, 2),
                 "rose_median_ms": {a: round(statistics.median(ms[a]), 2) for a in engines},
                 "speedup": {a: round(hf / statistics.median(ms[a]), 2) for a in engines},
                 "runs_ms": {k: [round(x, 2) for x in v] for k, v in ms.items()}}
            results.append(r)
            print(f"{model_name:28s} {w:30s} transformers {hf:8.1f} ms  " + "  ".join(
                f"{a} {r['rose_median_ms'][a]:8.1f} ms x{r['speedup'][a]:.2f}" for a in engines))

    meta = {"command": "python -m bench.scripts.ragged_vs_padded " + " ".join(argv if argv is not None else sys.argv[1:]),
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
             f"{meta['load_average_after']} after); {args.reps} rotating runs each, medians; speed-up = "
             "transformers time / ROSE time.", "",
             "| model | workload | tokens | padded tokens | transformers ms | "
             + " | ".join(f"ROSE {a} ms (speed-up)" for a in args.attention) + " |",
             "|---|---|---:|---:|---:|" + "---:|" * len(args.attention)]
    for r in results:
        lines.append(f"| {r['model']} | {r['workload']} | {r['tokens']} | {r['padded_tokens']} | {r['hf_median_ms']} | "
                     + " | ".join(f"{r['rose_median_ms'][a]} ({r['speedup'][a]:.2f}x)" for a in args.attention) + " |")
    (out / "ragged_vs_padded.md").write_text("\n".join(lines) + "\n")
    plot(results, args.attention, out / "ragged_vs_padded.png")
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
