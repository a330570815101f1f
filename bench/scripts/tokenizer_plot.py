"""Bar chart of a tokenizer benchmark result: p50 latency, in-house vs
Hugging Face, per workload (log scale), with the speedup on each pair.

    python -m bench.scripts.tokenizer_plot bench/results/DATE-cpu-2core/tokenizer.json
writes tokenizer.png next to the JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path: str) -> None:
    src = Path(path)
    data = json.loads(src.read_text())
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, turns in zip(axes, ("rounds", "calls")):
        rows = [r for r in data["results"] + data.get("results_call_by_call", []) if r["turns"] == turns]
        names = [r["workload"] for r in rows]
        x = range(len(rows))
        ours = [r["ours"]["p50_us"] for r in rows]
        hf = [r["hf"]["p50_us"] for r in rows]
        ax.bar([i - 0.2 for i in x], ours, 0.4, label="in-house")
        ax.bar([i + 0.2 for i in x], hf, 0.4, label="HF tokenizers 0.23.2")
        for i, r in enumerate(rows):
            ax.text(i, hf[i] * 1.15, f"{r['p50_speedup']:.1f}×", ha="center", fontsize=9)
        ax.set_xticks(list(x), names, rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylim(top=max(hf) * 6)
        ax.set_title(f"p50 per call, alternating by {turns}")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("µs (log)")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"Tokenizer, single thread — {data['machine']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(src.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main(sys.argv[1])
