"""``autoscale.md`` and ``autoscale.png``."""

from __future__ import annotations

from pathlib import Path

from bench.harness.results import table


def markdown(d: dict) -> str:
    m, c, f = d["measured"], d["chosen"], d["fixed"]
    rule = c["rule"]
    saved = 1 - c["replica_hours"] / f["replica_hours"] if f["replica_hours"] else 0.0
    out = [
        "Compressed time: a fluid model replays "
        f"{d['seconds_replayed'] / 3600:.0f} h of a day in one-second ticks (bench/autoscale/replay.py); "
        "its constants are measured on a real Tulip on the simulated device (BGE-M3 on one H200, "
        "modelled, not measured on a GPU), the cold start is assumed.",
        "",
        table(["constant", "value", "source"], [
            ["capacity (tokens/s)", m["capacity_tokens_per_s"], "tulip_capacity_tokens_per_second at saturation"],
            ["throughput (tokens/s)", m["throughput_tokens_per_s"], "tulip_tokens_total / wall time, same run"],
            ["query alone p50 / p99 (ms)", f"{m['query_64_idle_ms']['p50']:.2f} / {m['query_64_idle_ms']['p99']:.2f}",
             "64 tokens, Tulip gRPC"],
            ["full step (ms)", m["full_step_ms"], f"cost model, {m['full_step_tokens']} tokens"],
            ["cold start (s)", d["assumed"]["cold_start_s"], "assumed: pod start, weights, graph capture"],
            ["process start to serving (s)", m["start_to_serving_s"], "this machine, sim device (no weights)"],
        ]),
        "",
        f"Goal: query p99 over the day <= {d['p99_goal_ms']} ms"
        f" ({'met' if d['met_goal'] else 'NOT met by any rule tried; the best is shown'}).",
        "",
        table(["interactive target (s)", "scale-down window (s)", "replica-hours", "p99 (ms)", "p50 (ms)",
               "max replicas", "scale events", "bulk job (s)"],
              [[r["rule"]["interactive_target_s"], r["rule"]["down_window"], r["replica_hours"], r["p99_ms"],
                r["p50_ms"], r["max_replicas"], r["scale_events"], r["bulk_job_s"]] for r in d["sweep"]]),
        "",
        "Choice: the rule with the fewest scale events among those within 3 % of the cheapest rule that "
        "meets the goal (each scale-up is a cold start, each scale-down a drain). Scale-up pods per period, "
        "the poll and scrape intervals and the cooldown are fixed, not swept.",
        "",
        f"Chosen (the chart's defaults): interactive target {rule['interactive_target_s']} s, batch target "
        f"{d['batch_target_s']} s, scale-up {rule['up_pods']} pods (or 100 %) per {rule['up_period']} s, "
        f"scale-down {rule['down_pods']} pod per {rule['down_period']} s after a {rule['down_window']} s window, "
        f"min {rule['min_replicas']}, max {rule['max_replicas']}, cooldown to zero {rule['cooldown']} s.",
        "",
        table(["pool", "replica-hours", "p99 (ms)", "p50 (ms)", "held queries (cold start)", "longest hold (s)",
               "bulk job (s)"],
              [["autoscaled", c["replica_hours"], c["p99_ms"], c["p50_ms"], c["held_queries"], c["longest_hold_s"],
                c["bulk_job_s"]],
               [f"fixed, {f['rule']['fixed']} replicas (the autoscaled peak)", f["replica_hours"], f["p99_ms"],
                f["p50_ms"], 0, 0, f["bulk_job_s"]]]),
        "",
        f"The autoscaled pool used {saved:.0%} fewer replica-hours than the fixed pool sized for its peak.",
    ]
    return "\n".join(out)


def plot(d: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c, f = d["chosen"], d["fixed"]
    hours = [s["t"] / 3600 for s in c["series"]]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    a1.step(hours, [s["replicas"] + s["starting"] for s in c["series"]], where="post", label="autoscaled (asked)")
    a1.step(hours, [s["replicas"] for s in c["series"]], where="post", label="autoscaled (serving)")
    a1.step(hours, [s["replicas"] for s in f["series"]], where="post", label="fixed pool", linestyle="--")
    a1.plot(hours, [s["interactive_load"] for s in c["series"]], label="query load (replicas' worth)", alpha=0.6)
    a1.set_ylabel("replicas")
    a1.legend(fontsize=8)
    a2.plot(hours, [s["p99_ms"] for s in c["series"]], label="autoscaled", linewidth=0.8)
    a2.plot(hours, [s["p99_ms"] for s in f["series"]], label="fixed", linewidth=0.8)
    a2.axhline(d["p99_goal_ms"], color="grey", linestyle=":", label="goal")
    a2.set_yscale("log")
    a2.set_ylabel("query p99 (ms, per minute)")
    a2.set_xlabel("hour of day")
    a2.legend(fontsize=8)
    fig.suptitle("Tulip pool over a replayed day (simulated device, compressed time)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
