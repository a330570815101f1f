"""Ivy's balancing on a mixed workload: chunks cut on a token budget sent to
the least-loaded replica, against whole requests sent round-robin.

Real processes on this machine: Tulip replicas on all-MiniLM-L6-v2 (one
torch thread each) and two Ivy instances in front of the same replicas, one
per policy. A round replays the same workload through one Ivy: indexing
clients send a fixed list of large requests (hundreds to thousands of
tokens, real multilingual passages) while query clients send short real
queries one after another. Two scenarios by default: one indexing client
(its requests one after another) and two concurrent ones. It measures the query latencies (p50/p99) and
the makespan (start to the last indexing answer). Rounds alternate between
the policies so load from other processes hits both alike; the report gives
medians over rounds and the ratios. Before timing, both Ivys' embeddings
are checked against sentence-transformers (cosine >= 0.999).

    python -m bench.scripts.gateway_balance --rounds 4

Writes ``gateway_balance.{json,md,png}`` to
``bench/results/<date>-cpu-<cores>core/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from tulip_rose_cli.launch import Ivy, default_model_dir, start_tulips

REPO = Path(__file__).resolve().parents[2]

CORPUS = REPO / "tests" / "data" / "corpus"

# Documents per indexing request, in submission order: big jobs mixed with
# small ones, as in the published example (scaled to a 256-token model).
INDEX_REQUESTS = [64, 4, 64, 2, 8, 3, 48, 6]


def lines(name: str) -> list[str]:
    text = (CORPUS / name).read_text(encoding="utf-8-sig")
    return [line.strip() for line in text.splitlines() if line.strip()]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def post(ivy: Ivy, inputs) -> dict:
    status, body = ivy.post_json("/v1/embeddings", {"input": inputs})
    if status != 200:
        raise RuntimeError(f"Ivy answered {status}: {body}")
    return body


def check_correct(ivy: Ivy, docs: list[str], st) -> float:
    got = np.array([d["embedding"] for d in post(ivy, docs)["data"]], dtype=np.float64)
    ref = st.encode(docs, normalize_embeddings=True).astype(np.float64)
    cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    return float(cos.min())


def replica_tokens(ivy: Ivy) -> dict[str, float]:
    return {k: v for k, v in ivy.metrics().items() if k.startswith("ivy_replica_tokens_total")}


def run_round(ivy: Ivy, requests: list[list[str]], queries: list[str], index_clients: int,
              query_clients: int) -> dict:
    """One replay of the workload; returns query latencies and the makespan."""
    latencies: list[float] = []
    indexing_done = threading.Event()
    errors: list[BaseException] = []
    before = replica_tokens(ivy)

    def query_loop(k: int) -> None:
        i = k
        try:
            while not indexing_done.is_set():
                t0 = time.perf_counter()
                post(ivy, queries[i % len(queries)])
                latencies.append(time.perf_counter() - t0)
                i += query_clients
        except BaseException as e:  # noqa: BLE001 - reported after the round
            errors.append(e)

    def index_loop(share: list[list[str]]) -> None:
        try:
            for docs in share:
                post(ivy, docs)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    shares = [requests[k::index_clients] for k in range(index_clients)]
    query_threads = [threading.Thread(target=query_loop, args=(k,)) for k in range(query_clients)]
    index_threads = [threading.Thread(target=index_loop, args=(s,)) for s in shares]
    start = time.perf_counter()
    for t in query_threads + index_threads:
        t.start()
    for t in index_threads:
        t.join()
    makespan = time.perf_counter() - start
    indexing_done.set()
    for t in query_threads:
        t.join()
    if errors:
        raise errors[0]
    after = replica_tokens(ivy)
    spread = [after[k] - before.get(k, 0.0) for k in sorted(after)]
    return {"makespan_s": makespan, "query_latencies_s": latencies, "replica_tokens": spread}


def summarise(rounds: list[dict]) -> dict:
    per_round_p50 = [percentile(r["query_latencies_s"], 50) for r in rounds]
    per_round_p99 = [percentile(r["query_latencies_s"], 99) for r in rounds]
    pooled = [x for r in rounds for x in r["query_latencies_s"]]
    return {
        "rounds": len(rounds),
        "queries": len(pooled),
        "query_p50_ms": statistics.median(per_round_p50) * 1e3,
        "query_p90_ms": percentile(pooled, 90) * 1e3,
        "query_p99_ms": statistics.median(per_round_p99) * 1e3,
        "query_p50_ms_pooled": percentile(pooled, 50) * 1e3,
        "query_p99_ms_pooled": percentile(pooled, 99) * 1e3,
        "makespan_s": statistics.median(r["makespan_s"] for r in rounds),
        "makespans_s": [r["makespan_s"] for r in rounds],
        "replica_tokens_per_round": [r["replica_tokens"] for r in rounds],
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = results["scenarios"]
    names = list(results["setup"]["policies"])
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    width = 0.38
    for ax, key, title in [(axes[0], "query_p50_ms", "short queries p50 (ms)"),
                           (axes[1], "query_p99_ms", "short queries p99 (ms)"),
                           (axes[2], "makespan_s", "indexing makespan (s)")]:
        for j, (name, color) in enumerate(zip(names, ["tab:green", "tab:red"])):
            xs = [i + (j - 0.5) * width for i in range(len(scenarios))]
            values = [sc["policies"][name][key] for sc in scenarios.values()]
            ax.bar(xs, values, width, color=color, label=name)
            for x, v in zip(xs, values):
                ax.text(x, v, f"{v:.0f}" if v >= 10 else f"{v:.1f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(scenarios)), [f"{c} indexing client(s)" for c in scenarios])
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Ivy balancing, {results['setup']['replicas']} CPU replicas, all-MiniLM-L6-v2 "
                 f"(medians of {results['setup']['rounds']} rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(results: dict) -> str:
    s = results["setup"]
    names = list(s["policies"])
    rows, ratios, spread = [], [], []
    for clients, sc in results["scenarios"].items():
        for n, p in sc["policies"].items():
            rows.append(f"| {clients} | {n} | {p['query_p50_ms']:.1f} | {p['query_p90_ms']:.1f} | "
                        f"{p['query_p99_ms']:.1f} | {p['queries']} | {p['makespan_s']:.2f} | "
                        f"{', '.join(f'{m:.2f}' for m in p['makespans_s'])} |")
            spread.append(f"- {clients} indexing client(s), {n}: "
                          + "; ".join("/".join(f"{int(t)}" for t in rt) for rt in p["replica_tokens_per_round"]))
        r = sc["ratios"]
        ratios.append(f"- {clients} indexing client(s): query p50 {r['query_p50']:.2f}x, query p99 "
                      f"{r['query_p99']:.2f}x, makespan {r['makespan']:.2f}x")
    nl = "\n"
    return f"""# Ivy balancing: chunked least-loaded vs whole-request round-robin

Command: `{s['command']}`

Machine: {s['machine']}. Model: all-MiniLM-L6-v2 (float32, CPU), {s['replicas']} Tulip replicas with
{s['tulip_threads']} torch thread(s) each, one Ivy per policy in front of the same replicas.

Workload per round: indexing clients share {len(INDEX_REQUESTS)} requests of {INDEX_REQUESTS} real
passages (truncated to 256 tokens; {s['index_tokens']} tokens in all), each client sending its
requests one after another, while {s['query_clients']} query clients send short real queries back to
back until indexing ends. Rounds alternate between the policies; values are medians over
{s['rounds']} rounds (p90 from all queries pooled). Correctness gate: min cosine vs
sentence-transformers {', '.join(f'{k} {v:.5f}' for k, v in s['gate_min_cosine'].items())}.

| indexing clients | policy | query p50 ms | query p90 ms | query p99 ms | queries | makespan s (median) | makespans s |
|---|---|---|---|---|---|---|---|
{nl.join(rows)}

Ratios ({names[1]} / {names[0]}):
{nl.join(ratios)}

Tokens completed per replica in each round:
{nl.join(spread)}
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--tulip-threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--chunk-tokens", type=int, default=2048)
    p.add_argument("--index-clients", type=int, nargs="+", default=[1, 2],
                   help="scenarios: how many indexing clients send the requests concurrently")
    p.add_argument("--query-clients", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    cores = os.cpu_count() or 0
    out = args.out or REPO / "bench" / "results" / f"{datetime.date.today()}-cpu-{cores}core"
    out.mkdir(parents=True, exist_ok=True)
    model = default_model_dir()
    docs = lines("calibration_miracl.txt")
    queries = [q for q in lines("botchan.txt") if 10 <= len(q) <= 80]
    requests, offset = [], 0
    for n in INDEX_REQUESTS:
        requests.append([docs[(offset + i) % len(docs)] for i in range(n)])
        offset += n

    load_at_start = os.getloadavg()
    log_dir = Path(tempfile.mkdtemp(prefix="gateway-balance-"))
    policies = {
        f"chunks of {args.chunk_tokens} tokens, least-loaded": {"balance": "least-loaded",
                                                                "chunk_tokens": args.chunk_tokens},
        "whole requests, round-robin": {"balance": "round-robin", "chunk_tokens": 0},
    }
    replicas = start_tulips(args.replicas, model, log_dir=log_dir, threads=args.tulip_threads)
    ivys = {}
    try:
        for name, flags in policies.items():
            ivys[name] = Ivy([t.url for t in replicas], model, log_dir=log_dir, max_inputs=4096, **flags)
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(model, device="cpu")
        gate = {name: check_correct(ivy, docs[:24] + queries[:8], st) for name, ivy in ivys.items()}
        if min(gate.values()) < 0.999:
            raise SystemExit(f"correctness gate failed: {gate}")
        index_tokens = sum(post(next(iter(ivys.values())), r)["usage"]["prompt_tokens"] for r in requests)
        for ivy in ivys.values():  # warm-up
            run_round(ivy, requests[:2], queries, 1, args.query_clients)
        rounds: dict[int, dict[str, list[dict]]] = {}
        for clients in args.index_clients:
            rounds[clients] = {name: [] for name in policies}
            for k in range(args.rounds):
                order = list(policies) if k % 2 == 0 else list(reversed(policies))
                for name in order:
                    r = run_round(ivys[name], requests, queries, clients, args.query_clients)
                    rounds[clients][name].append(r)
                    lat = r["query_latencies_s"]
                    print(f"{clients} indexing client(s), round {k + 1}, {name}: makespan {r['makespan_s']:.2f}s, "
                          f"{len(lat)} queries, p50 {percentile(lat, 50) * 1e3:.1f} ms, "
                          f"p99 {percentile(lat, 99) * 1e3:.1f} ms, replica tokens {r['replica_tokens']}", flush=True)
    finally:
        for ivy in ivys.values():
            ivy.stop()
        for t in replicas:
            t.stop()

    scenarios = {}
    for clients, by_policy in rounds.items():
        summary = {name: summarise(rs) for name, rs in by_policy.items()}
        chunked, whole = (summary[n] for n in policies)
        scenarios[str(clients)] = {
            "policies": summary,
            "ratios": {
                "query_p50": whole["query_p50_ms"] / chunked["query_p50_ms"],
                "query_p99": whole["query_p99_ms"] / chunked["query_p99_ms"],
                "makespan": whole["makespan_s"] / chunked["makespan_s"],
            },
            "raw": {name: [{"makespan_s": r["makespan_s"], "query_latencies_s": r["query_latencies_s"]} for r in rs]
                    for name, rs in by_policy.items()},
        }
    results = {
        "setup": {
            "command": "python -m bench.scripts.gateway_balance " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": f"{cores}-core CPU ({platform.processor() or platform.machine()}), {platform.platform()}, "
                       f"shared: load average {load_at_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at the end",
            "replicas": args.replicas, "tulip_threads": args.tulip_threads, "rounds": args.rounds,
            "query_clients": args.query_clients, "index_requests": INDEX_REQUESTS, "index_tokens": index_tokens,
            "policies": policies, "gate_min_cosine": gate,
        },
        "scenarios": scenarios,
    }
    (out / "gateway_balance.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "gateway_balance.md").write_text(markdown(results))
    plot(results, out / "gateway_balance.png")
    print(markdown(results))
    print(f"wrote {out}/gateway_balance.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
