"""Isolation: search-box queries while indexing runs on the same replica.

Short real queries go out at a steady rate (64 client threads, enough
that even first-come-first-served's slow answers do not hold the next
query back, so every side gets the same query load) while indexing client
processes send batches of real passages back to back. In the same run:
(a) the queries alone on an idle stack, (b) under indexing with priority
classes on (Ivy's and Tulip's defaults: on the CPU, steps carrying batch
work are cut to 1024 tokens while queries arrive and a query's step carries
no batch work), (b') priority classes alone, steps full-size and filled
with batch work (Tulip --batch-step-tokens 0 --fill-interactive-steps
true), (c) under indexing
with one first-come-first-served queue (Tulip --priority false, Ivy without
a bound on batch chunks). Nobody marks a priority: Ivy classifies by size.
Indexing throughput is documents/s of the indexing clients. The engine
step's p99 comes from Tulip's step-duration histogram during (b)."""

from __future__ import annotations

import re
import threading
import time

from bench.harness import inputs
from bench.harness.clients import http_clients
from bench.harness.httpclient import HttpClient
from bench.harness.results import table
from bench.harness.stack import IVY_PATH, Stack, http_embeddings
from bench.harness.timing import Stats, ratio, scaled
from tulip_rose_cli.launch import Ivy, Tulip

TITLE = "Isolation: query latency under indexing, priority classes vs first-come-first-served"
DOCS_PER_REQUEST = 32
FULL_STEPS = "priority, full-size filled steps"


def run(stack: Stack, rounds: int = 2, index_clients: int = 3, index_requests: int = 12,
        query_rate: float = 20.0, query_threads: int = 64, idle_seconds: float = 10.0) -> tuple[dict, str]:
    ivy_on = stack.ivy()
    sides = {"priority": (stack.tulip(), ivy_on)}
    extra: list = []
    try:
        for name, tulip_flags, ivy_flags in [
            (FULL_STEPS, {"batch_step_tokens": 0, "fill_interactive_steps": "true"}, {}),
            ("fcfs", {"priority": "false"}, {"batch_chunks_per_replica": 0}),
        ]:
            tulip = stack.gated_tulip(f"Tulip ({name})", **tulip_flags)
            extra.append(tulip)
            ivy = Ivy([tulip.url], stack.model_dir, log_dir=stack.log_dir, **ivy_flags)
            extra.append(ivy)
            check_gate(stack, ivy, f"Ivy → Tulip ({name})")
            sides[name] = (tulip, ivy)
        return measure(stack, sides, rounds, index_clients, index_requests, query_rate, query_threads,
                       idle_seconds)
    finally:
        for p in reversed(extra):
            p.stop()


def options(scale: float) -> dict:
    return {"rounds": max(1, round(2 * min(scale, 1.5))), "index_requests": scaled(12, scale, 3),
            "idle_seconds": max(3.0, 10.0 * scale)}


def check_gate(stack: Stack, ivy: Ivy, name: str) -> None:
    from bench.harness import gate

    texts = inputs.english_lines()[:16]
    with HttpClient("127.0.0.1", ivy.port) as c:
        got = http_embeddings(c, IVY_PATH, texts)
    result = gate.check(name, got, stack.reference(texts), "sentence-transformers encode")
    stack.gates.append(result)


def measure(stack: Stack, sides: dict[str, tuple[Tulip, Ivy]], rounds: int, index_clients: int,
            index_requests: int, query_rate: float, query_threads: int, idle_seconds: float) -> tuple[dict, str]:
    queries = inputs.queries(stack.model_dir, 64, lo=8, hi=32)
    passages = list(inputs.lines("calibration_miracl.txt"))
    enc = HttpClient("127.0.0.1", 0)
    per_client = [[enc.prepare(IVY_PATH, {"input": [passages[(c * 997 + r * DOCS_PER_REQUEST + j) % len(passages)]
                                                     for j in range(DOCS_PER_REQUEST)]})
                   for r in range(index_requests)] for c in range(index_clients)]
    docs = index_clients * index_requests * DOCS_PER_REQUEST

    on_tulip, on_ivy = sides["priority"]
    idle = query_load(on_ivy.port, queries, query_rate, query_threads, stop_after=idle_seconds)
    loaded: dict[str, list[dict]] = {name: [] for name in sides}
    steps: dict[str, list[float]] = {name: [] for name in sides}
    for k in range(rounds):
        order = list(sides) if k % 2 == 0 else list(reversed(sides))
        for name in order:
            tulip, ivy = sides[name]
            before = step_histogram(tulip)
            result = under_indexing(ivy.port, per_client, queries, query_rate, query_threads)
            steps[name].append(step_p99(before, step_histogram(tulip)))
            result["docs_per_s"] = docs / result["index_wall_s"]
            loaded[name].append(result)
            print(f"isolation round {k + 1}, {name}: query p99 {Stats.of(result['latencies']).p99:.1f} ms, "
                  f"{result['docs_per_s']:.1f} docs/s", flush=True)

    def summary(runs: list[dict]) -> dict:
        pooled = [x for r in runs for x in r["latencies"]]
        s = Stats.of(pooled).to_dict()
        s["queries"] = len(pooled)
        s["late_slots"] = sum(r["late"] for r in runs)
        s["docs_per_s"] = sorted(r["docs_per_s"] for r in runs)[len(runs) // 2]
        return s

    idle_s = Stats.of(idle["latencies"]).to_dict()
    idle_s["queries"] = len(idle["latencies"])
    by_side = {name: summary(runs) for name, runs in loaded.items()}
    step = {name: max(v) for name, v in steps.items()}
    on, fcfs = by_side["priority"], by_side["fcfs"]
    targets = {
        "p99_vs_fcfs": ratio(fcfs["p99"], on["p99"]),
        "p99_bound_ms": idle_s["p99"] + step["priority"],
        "throughput_vs_fcfs": ratio(on["docs_per_s"], fcfs["docs_per_s"]),
    }
    data = {
        "params": {"rounds": rounds, "index_clients": index_clients, "index_requests_per_client": index_requests,
                   "docs_per_request": DOCS_PER_REQUEST, "query_rate_per_s": query_rate,
                   "query_threads": query_threads, "threads": stack.threads},
        "idle": idle_s, "by_side": by_side, "step_p99_ms": step, "targets": targets,
        "raw": {"idle": idle["latencies"], **{n: [r["latencies"] for r in runs] for n, runs in loaded.items()}},
    }
    return data, markdown(data)


def query_load(port: int, queries: list[str], rate: float, threads: int, stop_after: float | None = None,
               stop: threading.Event | None = None) -> dict:
    """Queries on a fixed schedule (``rate`` per second) from ``threads``
    keep-alive connections until ``stop`` is set or ``stop_after`` seconds.
    Latency is measured from the actual send; a slot sent more than 10 ms
    after its time (every thread busy) is counted as late."""
    stop = stop or threading.Event()
    start = time.perf_counter()
    deadline = start + stop_after if stop_after else float("inf")
    lock = threading.Lock()
    state = {"next": 0, "late": 0}
    latencies: list[float] = []
    errors: list[str] = []
    enc = HttpClient("127.0.0.1", 0)
    prepared = [enc.prepare(IVY_PATH, {"input": q}) for q in queries]

    def worker() -> None:
        with HttpClient("127.0.0.1", port) as client:
            while True:
                with lock:
                    slot = state["next"]
                    state["next"] += 1
                at = start + slot / rate
                while not stop.is_set() and time.perf_counter() < min(at, deadline):
                    time.sleep(min(0.005, max(0.0, at - time.perf_counter())))
                if stop.is_set() or at >= deadline:
                    return
                t0 = time.perf_counter()
                status, body = client.send(prepared[slot % len(prepared)])
                t1 = time.perf_counter()
                with lock:
                    if status != 200:
                        errors.append(f"HTTP {status}: {body[:200]!r}")
                    latencies.append(t1 - t0)
                    if t0 - at > 0.010:
                        state["late"] += 1

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise RuntimeError(f"{len(errors)} queries failed; first: {errors[0]}")
    return {"latencies": latencies, "late": state["late"]}


def under_indexing(port: int, per_client: list[list[bytes]], queries: list[str], rate: float,
                   threads: int) -> dict:
    """Indexing clients (processes) send their requests back to back; the
    queries run from just before their start until the last one ends."""
    stop = threading.Event()
    out: dict = {}
    q = threading.Thread(target=lambda: out.update(query_load(port, queries, rate, threads, stop=stop)))
    q.start()
    try:
        indexing = http_clients(port, per_client, timeout=1800)
    finally:
        stop.set()
        q.join()
    return {**out, "index_wall_s": indexing.wall}


def step_histogram(tulip: Tulip) -> dict[float, float]:
    """Cumulative bucket counts of Tulip's step-duration histogram."""
    buckets = {}
    for m in re.finditer(r'^tulip_step_duration_seconds_bucket\{le="([^"]+)"\} (\S+)$', tulip.metrics(), re.M):
        buckets[float(m.group(1))] = float(m.group(2))
    return buckets


def step_p99(before: dict[float, float], after: dict[float, float]) -> float:
    """p99 (ms) of the steps between two snapshots, interpolated linearly
    inside its bucket (buckets double, so this is an estimate)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return 0.0
    target, lower, below = 0.99 * total, 0.0, 0.0
    for bound, cum in zip(bounds, counts):
        if cum >= target:
            upper = bound if bound != float("inf") else lower * 2
            share = (target - below) / max(cum - below, 1e-9)
            return (lower + share * (upper - lower)) * 1e3
        lower, below = bound, cum
    return lower * 1e3


def markdown(d: dict) -> str:
    p, t, idle = d["params"], d["targets"], d["idle"]
    rows = [["(a) queries alone, idle stack", f"{idle['p50']:.1f}", f"{idle['p99']:.1f}", idle["queries"], "-", "-",
             "-"]]
    labels = {"priority": "(b) under indexing, priority classes",
              FULL_STEPS: "(b') under indexing, priority classes alone (full-size steps, filled with batch work)",
              "fcfs": "(c) under indexing, first come first served"}
    for name, s in d["by_side"].items():
        rows.append([labels[name], f"{s['p50']:.1f}", f"{s['p99']:.1f}", s["queries"], s["late_slots"],
                     f"{s['docs_per_s']:.1f}", f"{d['step_p99_ms'][name]:.0f}"])

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    on = d["by_side"]["priority"]
    return "\n".join([
        f"Queries: short real English lines (8–32 tokens), {p['query_rate_per_s']:.0f}/s on a fixed schedule from "
        f"{p['query_threads']} keep-alive connections (latency from the actual send; 'late' counts slots sent "
        f">10 ms after their time because every connection was busy). Indexing: {p['index_clients']} client "
        f"processes, each sending {p['index_requests_per_client']} requests of {p['docs_per_request']} real "
        f"multilingual passages back to back. One Tulip replica per side (torch threads = {p['threads']}) behind "
        f"its own Ivy; nobody marks a priority (Ivy classifies by size). Loaded sides alternate over "
        f"{p['rounds']} round(s); latencies pooled over rounds; throughput is the median round.\n",
        table(["scenario", "query p50 ms", "query p99 ms", "queries", "late slots", "indexing docs/s",
               "engine step p99 ms (est.)"], rows),
        "",
        "| target | value | verdict |",
        "|---|---|---|",
        f"| (b) p99 ≥ 4× lower than (c) | {t['p99_vs_fcfs']:.2f}× | {verdict(t['p99_vs_fcfs'] >= 4)} |",
        f"| (b) p99 ≤ (a) p99 + one step's p99 | {on['p99']:.1f} ms vs {t['p99_bound_ms']:.1f} ms | "
        f"{verdict(on['p99'] <= t['p99_bound_ms'])} |",
        f"| (b) indexing throughput ≥ 90% of (c) | {t['throughput_vs_fcfs'] * 100:.0f}% | "
        f"{verdict(t['throughput_vs_fcfs'] >= 0.9)} |",
        "",
        "Step p99 is estimated from Tulip's step-duration histogram (buckets double; linear inside the bucket).",
    ])


def plot(data: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["idle"] + list(data["by_side"])
    stats = [data["idle"]] + [data["by_side"][n] for n in data["by_side"]]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = range(len(names))
    a1.bar([x - 0.2 for x in xs], [s["p50"] for s in stats], 0.4, label="p50")
    a1.bar([x + 0.2 for x in xs], [s["p99"] for s in stats], 0.4, label="p99")
    a1.set_xticks(list(xs), names, fontsize=7, rotation=10)
    a1.set_ylabel("query latency, ms")
    a1.set_yscale("log")
    a1.legend()
    a2.bar(list(xs)[1:], [s["docs_per_s"] for s in stats[1:]], 0.5, color="tab:green")
    a2.set_xticks(list(xs)[1:], names[1:], fontsize=7, rotation=10)
    a2.set_ylabel("indexing documents/s")
    fig.suptitle("Queries under indexing: priority classes vs FCFS")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
