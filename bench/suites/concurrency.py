"""Chart 4, high concurrency: batch 1, real text of 512 tokens (capped to the
model's maximum) through Ivy (tokenization and the gateway hop included),
1/2/4/8/16 concurrent client processes, latency percentiles per level;
Infinity at the same levels in the same run as the baseline."""

from __future__ import annotations

from bench.harness import inputs
from bench.harness.baseline_servers import INFINITY_MODEL_NAME, Infinity
from bench.harness.clients import http_clients
from bench.harness.httpclient import HttpClient
from bench.harness.results import table
from bench.harness.stack import IVY_PATH, Stack
from bench.harness.timing import Stats, ratio, scaled
from bench.suites.online import capped_lengths

TITLE = "High concurrency, batch 1, real text through Ivy vs Infinity"
LEVELS = (1, 2, 4, 8, 16)
LENGTH = 512


def run(stack: Stack, requests_per_level: int = 32, levels=LEVELS, with_infinity: bool = True) -> tuple[dict, str]:
    ivy = stack.ivy()
    notes: list[str] = []
    inf = stack.infinity_or_note(notes) if with_infinity else None
    (length,), capped = capped_lengths([LENGTH], stack.max_length)
    notes += capped
    texts = inputs.texts_of_tokens(stack.model_dir, length, 16)
    enc = HttpClient("127.0.0.1", 0)
    servers = {"ivy": (ivy.port, IVY_PATH, {})}
    if inf is not None:
        servers["infinity"] = (inf.port, Infinity.PATH, {"model": INFINITY_MODEL_NAME})
    results: dict[str, dict] = {name: {} for name in servers}
    rows = []
    for c in levels:
        per = max(2, -(-requests_per_level // c))
        for name, (port, path, extra) in servers.items():
            reqs = [[enc.prepare(path, {"input": texts[(k + j) % len(texts)], **extra}) for j in range(per)]
                    for k in range(c)]
            run_ = http_clients(port, reqs)
            s = Stats.of(run_.latencies)
            results[name][str(c)] = {**s.to_dict(), "throughput_rps": round(run_.requests / run_.wall, 3)}
        row = [c, per * c]
        for name in servers:
            r = results[name][str(c)]
            row += [r["p50"], r["p99"]]
        if inf is not None:
            row.append(ratio(results["infinity"][str(c)]["p50"], results["ivy"][str(c)]["p50"]))
        rows.append(row)
    headers = ["clients", "requests"]
    for name in servers:
        headers += [f"{name} p50 ms", f"{name} p99 ms"]
    if inf is not None:
        headers.append("infinity / ivy p50")
    data = {"params": {"levels": list(levels), "tokens": length, "batch": 1, "threads": stack.threads,
                       "client": "spawned processes, one keep-alive connection each"},
            "by_side": results, "notes": notes}
    md = "\n".join([
        f"Batch 1, real English text of {length} tokens, each client process sends its requests back to back "
        f"after a shared start; the sides run one after another at each level. Torch threads = {stack.threads}.\n",
        table(headers, rows), *[f"\nNote: {x}" for x in notes]])
    return data, md


def options(scale: float) -> dict:
    return {"requests_per_level": scaled(32, scale, 8)}
