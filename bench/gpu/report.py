"""``gpu.md``: the GPU run's JSON as tables, rewritten after every section
(so it also reads well for a run cut short)."""

from __future__ import annotations

from bench.harness.results import table


def _cells(by: dict, sides: list[str]) -> list[list]:
    rows = []
    for key in sorted(by, key=int):
        row = [key]
        for s in sides:
            c = by[key].get(s, {})
            row += [c.get("p50"), c.get("p99")]
        rows.append(row)
    return rows


def _latency(title: str, first: str, by: dict, sides: list[str]) -> list[str]:
    return [f"\n{title} (p50 / p99 ms):\n",
            table([first, *[f"{s} {q}" for s in sides for q in ("p50", "p99")]], _cells(by, sides))]


def _detail(name: str, r) -> list[str]:
    """Tables for the sections that have them."""
    kind = name.rsplit("/", 1)[-1]
    if name.startswith("gate/"):
        return ["\n" + table(["backend", "dtype", "status", "min cosine / reason", "threshold"],
                             [[g.get("backend"), g.get("dtype"), g["status"], g.get("min_cosine", g.get("reason")),
                               g.get("threshold")] for g in r])]
    if name.startswith("check/") or name.startswith("preflight/"):
        return [f"\n`{ {k: v for k, v in r.items() if k != 'check'} }`\n"] if isinstance(r, dict) else []
    if kind == "graphs":
        out = _latency("Batch 1, engine level", "tokens", r["eager_vs_graphs"],
                       ["rose eager", "rose graphs", "transformers eager"])
        out.append(f"\nKernel-launch inflection point (graphs save < 5% from here on): "
                   f"{r['inflection_tokens']} tokens\n")
        return out + _latency("Sweep", "tokens", r["sweep"], ["rose eager", "rose graphs"])
    if kind == "online":
        sides = ["tulip", "transformers eager"]
        if any("loadgen floor" in v for v in r.values()):
            sides.append("loadgen floor")  # the compiled client's own cost, against a null server
        return _latency("Online through Tulip (gRPC)", "tokens", r, sides)
    if kind == "scoring":
        return _latency("Scoring through Tulip", "batch", r, ["tulip", "transformers eager"])
    if kind == "throughput":
        return ["\nBatch embedding (embeddings/s):\n",
                table(["tokens", "tulip", "transformers", "ratio"],
                      [[k, v["tulip_embeddings_per_s"], v["transformers_embeddings_per_s"], v["ratio"]]
                       for k, v in r.items()])]
    if kind == "concurrency":
        return [f"\nConcurrency ({r['path']}; client: {r.get('client', 'python')}), ms:\n",
                table(["clients", "count", "p50", "p90", "p99", "requests/s"],
                      [[k, v["count"], v["p50"], v["p90"], v["p99"], v["requests_per_s"]]
                       for k, v in r["by_clients"].items()])]
    if kind == "overlap":
        return [f"\nOverlap on / off throughput: {r['on_over_off']} (requests/s {r['requests_per_s']}); "
                f"p50 on {r['latency']['on']['p50']:.3f} ms, off {r['latency']['off']['p50']:.3f} ms\n"]
    if name == "backends":
        return ["\n" + table(["model", "sequences", "tokens", "ranking (fastest first)", "µs"],
                             [[c["model"], c["sequences"], c["tokens"], ", ".join(c["ranking"]), c["us"]]
                              for c in r["cells"]])]
    return []


def markdown(result: dict) -> str:
    sections = result.get("sections", {})
    env = sections.get("preflight/versions", {}).get("result") or {}
    lines = [f"# GPU benchmark{' (dry run on CPU)' if result.get('dry_run') else ''}", "",
             f"Command: `{' '.join(result['command'])}`  ",
             f"Device: {env.get('device')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, transformers "
             f"{env.get('transformers')}, grpcio {env.get('grpcio')}, protobuf {env.get('protobuf')}; "
             f"{result.get('seconds')} s so far (budget {result.get('budget_s')} s).", ""]
    pre = result.get("preflight")
    if pre and not pre["passed"]:
        lines += [f"**Preflight failed at {pre['step']}:** {pre['error']}", ""]
    if "watchdog" in result:
        lines += [f"**Stopped by the watchdog** after {result['watchdog']['after_s']} s in "
                  f"{result['watchdog']['section']}.", ""]
    lines += ["## Sections", "",
              table(["section", "status", "seconds", "note"],
                    [[n, r["status"], r.get("seconds", ""), r.get("error") or r.get("reason") or ""]
                     for n, r in sections.items()])]
    for name, r in sections.items():
        if r["status"] in ("ok", "failed") and r.get("result") is not None:
            try:
                detail = _detail(name, r["result"])
            except (KeyError, TypeError, ValueError) as e:  # a report must never lose the JSON
                detail = [f"\n(no table: {e!r})\n"]
            if detail:
                lines += [f"\n## {name}", *detail]
    return "\n".join(lines) + "\n"
