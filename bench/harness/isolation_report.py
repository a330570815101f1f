"""Isolation results: per-class percentiles with bootstrap intervals, the
targets met or missed by how much, the markdown table and the figure (the
per-class latency distributions side by side)."""

from __future__ import annotations

import numpy as np

from bench.harness.results import table

QUANTILES = (50.0, 99.0, 99.9)
BOOTSTRAP = 1000


def percentiles(ms: list[float], seed: int = 0) -> dict:
    """p50/p99/p99.9 (ms) with 95% bootstrap intervals (resampling the
    pooled latencies ``BOOTSTRAP`` times)."""
    x = np.asarray(ms, dtype=np.float64)
    if x.size == 0:
        return {"count": 0}
    out: dict = {"count": int(x.size)}
    point = np.percentile(x, QUANTILES)
    rng = np.random.default_rng(seed)
    boot = np.empty((BOOTSTRAP, len(QUANTILES)))
    for i in range(BOOTSTRAP):
        boot[i] = np.percentile(rng.choice(x, size=x.size, replace=True), QUANTILES)
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
    for q, p, a, b in zip(QUANTILES, point, lo, hi):
        key = f"p{q:g}".replace(".", "_")
        out[key] = round(float(p), 3)
        out[f"{key}_ci"] = [round(float(a), 3), round(float(b), 3)]
    return out


def ci(s: dict, key: str) -> str:
    if key not in s:
        return "-"
    lo, hi = s[f"{key}_ci"]
    return f"{s[key]:.2f} [{lo:.2f}, {hi:.2f}]"


def targets(d: dict, goals: dict) -> list[dict]:
    """Each target: its value, the goal, met or not, and by how much."""
    sc = d["scenarios"]
    on, fcfs, idle = sc["priority"], sc["fcfs"], sc["idle"]
    out = []
    ratio = fcfs["queries"]["p99"] / on["queries"]["p99"]
    out.append({"target": f"query p99 ≥ {goals['p99_vs_fcfs']:g}× lower than first-come-first-served",
                "value": f"{ratio:.2f}×", "met": ratio >= goals["p99_vs_fcfs"],
                "by": f"{ratio / goals['p99_vs_fcfs'] - 1:+.0%} of the goal"})
    if goals.get("p99_over_idle_ms") is not None:
        over = on["queries"]["p99"] - idle["queries"]["p99"]
        goal = goals["p99_over_idle_ms"]
        out.append({"target": f"query p99 ≤ idle p99 + {goal:g} ms",
                    "value": f"{on['queries']['p99']:.2f} ms = idle {idle['queries']['p99']:.2f} + {over:.2f} ms",
                    "met": over <= goal, "by": f"{over - goal:+.2f} ms against the goal"})
    # Throughput: batch tokens the replica finished in the windows (its own
    # counter; the clients' documents/s beside it count whole requests).
    share = on["batch_tokens_per_s"] / fcfs["batch_tokens_per_s"]
    docs = on["docs_per_s"] / fcfs["docs_per_s"]
    goal = goals["throughput_vs_fcfs"]
    out.append({"target": f"indexing throughput ≥ {goal:.0%} of first-come-first-served",
                "value": f"{share:.1%} of its batch tokens/s (clients' documents/s: {docs:.1%})",
                "met": share >= goal, "by": f"{(share - goal) * 100:+.1f} points"})
    return out


def markdown(d: dict) -> str:
    p = d["params"]
    sc = d["scenarios"]
    rows = []
    for s in sc.values():
        q, b = s["queries"], s.get("batch", {})
        t = s.get("queries_in_tulip", {})
        rows.append([s["label"], q["count"], ci(q, "p50"), ci(q, "p99"), ci(q, "p99_9"),
                     f"{t['p50']:.2f} / {t['p99']:.2f}" if t.get("count") else "-", s["late"],
                     ci(b, "p50") if b else "-", ci(b, "p99") if b else "-",
                     f"{s['batch_tokens_per_s']:,.0f}" if s.get("batch_tokens_per_s") else "-",
                     f"{s['docs_per_s']:.1f}" if s.get("docs_per_s") else "-",
                     f"{s['bulk_docs_per_s']:.1f}" if s.get("bulk_docs_per_s") else "-",
                     f"{s['busy']:.1%}" if s.get("busy") is not None else "-",
                     (f"{s['device_backlog_ms']['p50']:.2f} / {s['device_backlog_ms']['p99']:.2f}"
                      if s.get("device_backlog_ms") else "-"),
                     f"{s['step_ms_p99']:.2f}" if s.get("step_ms_p99") is not None else "-"])
    flags = "\n".join(f"- {sc[n]['label']}: Tulip `{sc[n]['tulip_flags'] or 'defaults'}`, Ivy "
                      f"`{sc[n]['ivy_flags'] or 'defaults'}`" for n in sc if n != "idle")
    lines = [
        f"Queries: {p['queries']} real English lines of {p['query_tokens']} tokens, {p['query_rate']:g}/s on a "
        f"fixed schedule from {p['connections']} keep-alive connections ({p['query_client']}; latency from the "
        f"actual send, 'late' = slots sent >10 ms after their time). Indexing: {p['index_clients']} client "
        f"processes sending {p['docs_per_request']} passages of {p['passage_tokens']} tokens per request back "
        f"to back{', plus the bulk client (`tulip-rose embed --priority batch`, 64 documents per request, 2 in flight)' if p['bulk'] else ''}. "
        f"Nobody else marks a priority: Ivy classifies by size. {p['rounds']} rounds of {p['seconds']:g} s per "
        f"scenario, scenarios alternating in order (reversed every other round); latencies pooled over rounds, "
        f"throughput the median round. Intervals: 95% bootstrap ({BOOTSTRAP} resamples).\n",
        f"Load average: {p['load_before']} before, {p['load_after']} after.\n",
        table(["scenario", "queries", "query p50 ms", "query p99 ms", "query p99.9 ms",
               "in Tulip p50 / p99 ms", "late",
               "batch request p50 ms", "batch request p99 ms", "batch tokens/s (Tulip)", "indexing docs/s",
               "of which bulk",
               "device busy", "device backlog p50 / p99 ms", "step p99 ms"], rows),
        "",
        "In Tulip: what Tulip reported for each query (arrival to rows on the host: waiting for a step, and "
        "from the launch to the rows, behind the steps already on the device); the rest of a query's latency is "
        "the host path outside Tulip (client, Ivy's tokenizing and rendering, transport) on the shared cores. "
        "Batch requests are the indexing clients' 32-passage requests (Ivy splits each into chunks). Batch "
        "tokens/s: Tulip's batch-class token counter over each window (the throughput the target reads); "
        "indexing docs/s: the clients' completed documents, each client over its own requests' span. "
        + ("Device busy: modelled busy time over the window, from `--sim-log`; device backlog: at evenly "
           "spread instants of the window, how long the steps already launched still run on the device (what a "
           "query launched at once waits there before its own step, free of the host's noise); step p99: "
           "modelled device time of the window's steps." if d.get("simulated") else
           "Step p99: Tulip's step-duration histogram (buckets double; linear inside the bucket)."),
        "",
        flags,
        "",
        "| target | value | verdict |",
        "|---|---|---|",
        *(f"| {t['target']} | {t['value']} | {'met' if t['met'] else '**missed**'} ({t['by']}) |"
          for t in d["targets"]),
    ]
    return "\n".join(lines)


def plot(d: dict, path) -> None:
    """Per class, the share of requests slower than x (log scales), every
    scenario on the same axes; and indexing throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, ScalarFormatter

    raw = d["raw"]
    colors = {name: f"C{i}" for i, name in enumerate(d["scenarios"])}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, cls, title in [(axes[0], "queries", "interactive class: queries"),
                           (axes[1], "batch", "batch class: indexing requests")]:
        for name, s in d["scenarios"].items():
            ms = np.sort(np.asarray(raw[name].get(cls, []), dtype=float))
            if ms.size == 0:
                continue
            tail = 1.0 - np.arange(ms.size) / ms.size
            ax.step(ms, tail, where="post", label=s["label"], color=colors[name])
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_yscale("log")
        ax.set_ylim(1e-4, 1.05)
        for q in (0.01, 0.001):
            ax.axhline(q, color="grey", lw=0.5, ls=":")
        ax.set_xlabel("latency, ms")
        ax.set_ylabel("share of requests slower")
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7)
    names = [n for n in d["scenarios"] if d["scenarios"][n].get("batch_tokens_per_s")]
    axes[2].bar(range(len(names)), [d["scenarios"][n]["batch_tokens_per_s"] for n in names],
                color=[colors[n] for n in names])
    axes[2].set_xticks(range(len(names)), [d["scenarios"][n]["label"] for n in names], fontsize=7, rotation=12)
    axes[2].set_ylabel("indexing: batch tokens/s in Tulip (median round)")
    fig.suptitle(d.get("title", "Queries under indexing"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
