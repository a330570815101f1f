"""PNG plots of the results: latency vs length, latency vs concurrency,
bars per side (throughput or latency). Each takes a benchmark's result data and writes one file."""

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
    for i, side in enumerate(("tulip", "transformers forward")):
        for q, style in (("p50", "o-"), ("p99", "^:")):
            ys = [online["by_length"][str(n)]["stats"][side][q] for n in lengths]
            ax.plot(lengths, ys, style, color=f"C{i}", label=f"{side} {q}")
    return _latency_figure(plt, fig, ax, path, "tokens (batch 1)", "Online embedding: latency vs length")


def latency_vs_concurrency(conc: dict, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (side, by_level) in enumerate(conc["by_side"].items()):
        levels = sorted(int(c) for c in by_level)
        for q, style in (("p50", "o-"), ("p99", "^:")):
            ax.plot(levels, [by_level[str(c)][q] for c in levels], style, color=f"C{i}", label=f"{side} {q}")
    ax.set_xscale("log", base=2)
    return _latency_figure(plt, fig, ax, path, "concurrent clients (batch 1)",
                           f"Latency vs concurrency ({conc['params']['tokens']} tokens)")


def _latency_figure(plt, fig, ax, path: Path, xlabel: str, title: str) -> Path:
    return finish(plt, fig, ax, path, xlabel, "latency, ms", title)


def finish(plt, fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """Labels, grid and legend of a one-axes figure; writes it to ``path``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def throughput_bars(groups: dict[str, dict[str, float]], path: Path, title: str,
                    ylabel: str = "embeddings / s") -> Path:
    """``groups``: {group label: {side: value}} (embeddings/s unless
    ``ylabel`` says otherwise); one colour per side."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    colours: dict[str, str] = {}
    x = 0.0
    for group, sides in groups.items():
        start = x
        for side, value in sides.items():
            new = side not in colours
            c = colours.setdefault(side, f"C{len(colours)}")
            ax.bar(x, value, color=c, label=side if new else None)
            ax.text(x, value, f"{value:.1f}", ha="center", va="bottom", fontsize=8)
            x += 1
        ax.text((start + x - 1) / 2, -0.08, group, ha="center", va="top", fontsize=8,
                transform=ax.get_xaxis_transform())
        x += 0.8
    ax.set_xticks([])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
