"""Issue 50: the CPU fast path's pinned workers (``--cpu-fast-path-pin``,
rose/cpu/pinning.py) under load, where a pinned thread cannot move to a
less busy core. Three Ivy → Tulip pairs on the same model, one as served
(pinning auto) and two with ``--cpu-fast-path-pin false`` (their
difference is the run's A/A noise), each workload run on all three in a
rotating order round after round: real queries
from 1, 2, 4 and 8 client processes (keep-alive, back to back), and 8-query
requests from 4 clients. ``query-path`` measures the same switch on
single, sporadic queries."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.harness import inputs, plots
from bench.harness.clients import http_clients
from bench.harness.httpclient import HttpClient
from bench.harness.results import table
from bench.harness.stack import IVY_PATH, Stack
from bench.harness.timing import scaled

TITLE = "CPU fast path: pinned workers against the scheduler's placement, under concurrent load"
QUERY_CLIENTS = (1, 2, 4, 8)
BATCH, BATCH_CLIENTS = 8, 4


def run(stack: Stack, rounds: int = 9, per_client: int = 120) -> tuple[dict, str]:
    texts = inputs.queries(stack.model_dir, 64)
    n = len(texts)
    sides = {"pinned (auto)": stack.ivy(),
             "unpinned": stack.variant("unpinned (--cpu-fast-path-pin false)", cpu_fast_path_pin="false")[1],
             # A/A: how far two identical pairs differ in this run.
             "unpinned, again": stack.variant("unpinned again (--cpu-fast-path-pin false)",
                                              cpu_fast_path_pin="false")[1]}
    enc = HttpClient("127.0.0.1", 0)
    queries = [enc.prepare(IVY_PATH, {"input": t}) for t in texts]
    batches = [enc.prepare(IVY_PATH, {"input": [texts[(i + j) % n] for j in range(BATCH)]}) for i in range(n)]
    workloads = {f"queries, {c} client{'s' if c > 1 else ''}": (c, queries, per_client) for c in QUERY_CLIENTS}
    workloads[f"{BATCH}-query requests, {BATCH_CLIENTS} clients"] = (BATCH_CLIENTS, batches, max(per_client // 4, 10))
    names = list(sides)
    got: dict[str, dict[str, dict[str, list[float]]]] = {
        w: {s: {"per_s": [], "p50_ms": []} for s in names} for w in workloads}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        if r % 2:
            order.reverse()
        for w, (clients, reqs, count) in workloads.items():
            for s in order:
                res = http_clients(sides[s].port, [[reqs[(c * 7 + i) % n] for i in range(count)]
                                                   for c in range(clients)])
                got[w][s]["per_s"].append(res.requests / res.wall)
                got[w][s]["p50_ms"].append(statistics.median(res.latencies) * 1e3)
    medians = {w: {s: {k: round(statistics.median(v), 3) for k, v in by.items()} for s, by in sides_.items()}
               for w, sides_ in got.items()}
    # Medians of each round's ratios: the machine's speed drifted from
    # round to round by more than the sides differ, and a round's sides
    # ran within seconds of each other.
    ratios = {w: {"requests/s, pinned / unpinned": _paired(g, names[0], names[1], "per_s"),
                  "p50, pinned / unpinned": _paired(g, names[0], names[1], "p50_ms"),
                  "requests/s, A/A: unpinned again / unpinned": _paired(g, names[2], names[1], "per_s"),
                  "p50, A/A": _paired(g, names[2], names[1], "p50_ms")}
              for w, g in got.items()}
    data = {"params": {"rounds": rounds, "per_client": per_client, "batch": BATCH, "model_dir": stack.model_dir,
                       "threads": stack.threads, "order": "rotating, every workload on the three sides per round"},
            "medians": medians, "ratios": ratios, "rounds": got}
    rows = [[w, m[names[0]]["per_s"], m[names[1]]["per_s"], m[names[2]]["per_s"],
             ratios[w]["requests/s, pinned / unpinned"], ratios[w]["requests/s, A/A: unpinned again / unpinned"],
             m[names[0]]["p50_ms"], m[names[1]]["p50_ms"], ratios[w]["p50, pinned / unpinned"], ratios[w]["p50, A/A"]]
            for w, m in medians.items()]
    md = "\n".join([
        f"Real English queries through Ivy (HTTP, keep-alive, one process per client, requests back to back), "
        f"{rounds} rounds, every workload on the three pairs per round in a rotating order; A/A: a second "
        "unpinned pair against the first, the spread this machine gives two identical servers. Requests/s and p50: "
        "medians over the rounds of each run's; ratios: medians of each round's ratio (paired within the round). "
        f"{per_client} requests per query client per run, "
        f"{max(per_client // 4, 10)} per {BATCH}-query client.",
        "",
        table(["workload", "pinned req/s", "unpinned req/s", "unpinned again req/s", "pinned / unpinned",
               "A/A", "pinned p50 ms", "unpinned p50 ms", "p50 pinned / unpinned", "p50 A/A"], rows),
    ])
    enc.close()
    return data, md


def _paired(got: dict, a: str, b: str, key: str) -> float:
    return round(statistics.median(x / y for x, y in zip(got[a][key], got[b][key])), 4)


def options(scale: float) -> dict:
    return {"rounds": max(3, round(9 * scale)), "per_client": scaled(120, scale, 20)}


def plot(data: dict, path: Path) -> Path:
    groups = {w: {s: v["per_s"] for s, v in m.items()} for w, m in data["medians"].items()}
    return plots.throughput_bars(groups, path, "Requests/s per workload, pinned vs unpinned", ylabel="requests / s")
