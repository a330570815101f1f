"""PNG plots of the results: latency vs length, latency vs concurrency,
throughput bars. Each takes a benchmark's result data and writes one file."""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_vs_length(online: dict, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    lengths = sorted(int(n) for n in online["by_length"])
    for side, style in (("tulip", "o-"), ("transformers forward", "s--")):
        for q, alpha in (("p50", 1.0), ("p99", 0.45)):
            ys = [online["by_length"][str(n)]["stats"][side][q] for n in lengths]
            ax.plot(lengths, ys, style, alpha=alpha, label=f"{side} {q}")
    ax.set_xlabel("tokens (batch 1)")
    ax.set_ylabel("latency, ms")
    ax.set_title("Online embedding: latency vs length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_vs_concurrency(conc: dict, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for side, by_level in conc["by_side"].items():
        levels = sorted(int(c) for c in by_level)
        for q, style in (("p50", "o-"), ("p99", "^:")):
            ax.plot(levels, [by_level[str(c)][q] for c in levels], style, label=f"{side} {q}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent clients (batch 1)")
    ax.set_ylabel("latency, ms")
    ax.set_title(f"Latency vs concurrency ({conc['params']['tokens']} tokens)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def throughput_bars(groups: dict[str, dict[str, float]], path: Path, title: str) -> Path:
    """``groups``: {group label: {side: embeddings/s}}."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    x = 0
    ticks, labels = [], []
    for group, sides in groups.items():
        for side, value in sides.items():
            ax.bar(x, value)
            ax.text(x, value, f"{value:.0f}", ha="center", va="bottom", fontsize=8)
            ticks.append(x)
            labels.append(f"{side}\n({group})")
            x += 1
        x += 0.6
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("embeddings / s")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
