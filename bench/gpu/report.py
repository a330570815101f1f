"""``gpu.md``: the GPU run's JSON as tables."""

from __future__ import annotations

from bench.results import table


def _cells(by: dict, sides: list[str]) -> list[list]:
    rows = []
    for key in sorted(by, key=int):
        row = [key]
        for s in sides:
            c = by[key].get(s, {})
            row += [c.get("p50"), c.get("p99")]
        rows.append(row)
    return rows


def _model(name: str, m: dict) -> list[str]:
    out = [f"\n## {name}\n"]
    if "not_timed" in m:
        return out + [m["not_timed"]]
    for key, what in (("graphs_sweep", None), ("online", None), ("scoring", None), ("throughput", None),
                      ("concurrency", None), ("overlap", None)):
        sec = m.get(key)
        if sec is None:
            continue
        if "skipped" in sec or "error" in sec:
            out.append(f"- {key}: {sec.get('skipped') or sec.get('error')}")
    if "eager_vs_graphs" in m:
        sides = ["rose eager", "rose graphs", "transformers eager"]
        out += ["\nBatch 1, engine level (p50 / p99 ms):\n",
                table(["tokens", *[f"{s} {q}" for s in sides for q in ("p50", "p99")]],
                      _cells(m["eager_vs_graphs"], sides))]
    sweep = m.get("graphs_sweep", {})
    if "inflection_tokens" in sweep:
        out.append(f"\nKernel-launch inflection point (graphs save < 5% from here on): "
                   f"{sweep['inflection_tokens']} tokens\n")
        out.append(table(["tokens", "eager p50", "eager p99", "graphs p50", "graphs p99"],
                         _cells(sweep["sweep"], ["rose eager", "rose graphs"])))
    if isinstance(m.get("online"), dict) and "error" not in m["online"] and "skipped" not in m["online"]:
        out += ["\nOnline through Tulip (gRPC), p50 / p99 ms:\n",
                table(["tokens", "tulip p50", "tulip p99", "transformers p50", "transformers p99"],
                      _cells(m["online"], ["tulip", "transformers eager"]))]
    if isinstance(m.get("scoring"), dict) and "error" not in m["scoring"] and "skipped" not in m["scoring"]:
        out += ["\nScoring through Tulip, p50 / p99 ms:\n",
                table(["batch", "tulip p50", "tulip p99", "transformers p50", "transformers p99"],
                      _cells(m["scoring"], ["tulip", "transformers eager"]))]
    tp = m.get("throughput")
    if isinstance(tp, dict) and "error" not in tp and "skipped" not in tp:
        out += ["\nBatch embedding (embeddings/s):\n",
                table(["tokens", "tulip", "transformers", "ratio"],
                      [[k, v["tulip_embeddings_per_s"], v["transformers_embeddings_per_s"], v["ratio"]]
                       for k, v in tp.items()])]
    cc = m.get("concurrency")
    if isinstance(cc, dict) and "by_clients" in cc:
        out += [f"\nConcurrency ({cc['path']}), ms:\n",
                table(["clients", "count", "p50", "p90", "p99"],
                      [[k, v["count"], v["p50"], v["p90"], v["p99"]] for k, v in cc["by_clients"].items()])]
    ov = m.get("overlap")
    if isinstance(ov, dict) and "on_over_off" in ov:
        out += [f"\nOverlap on / off throughput: {ov['on_over_off']} "
                f"(requests/s {ov['requests_per_s']}); p50 on {ov['latency']['on']['p50']:.3f} ms, "
                f"off {ov['latency']['off']['p50']:.3f} ms\n"]
    return out


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [f"# GPU benchmark{' (dry run on CPU)' if result['dry_run'] else ''}", "",
             f"Command: `{' '.join(result['command'])}`  ",
             f"Device: {env['device']}, torch {env['torch']}, CUDA {env['cuda']}, transformers "
             f"{env['transformers']}; {result['seconds']} s in all.", "",
             "## Correctness gate (ROSE vs transformers, same weights, cosine ≥ 0.999)", "",
             table(["model", "backend", "dtype", "status", "min cosine / reason"],
                   [[g.get("model"), g.get("backend", "–"), g.get("dtype", "–"), g["status"],
                     g.get("min_cosine", g.get("reason"))] for g in result["gate"]]),
             "", "## Micro-checks", "",
             table(["check", "status", "detail"],
                   [[c["check"], c["status"], {k: v for k, v in c.items() if k not in ("check", "status")}]
                    for c in result["checks"]])]
    for name, m in result["models"].items():
        lines += _model(name, m)
    return "\n".join(lines) + "\n"
