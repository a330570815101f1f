"""``python -m bench autoscale [--quick]``: the Tulip pool's autoscaling
replayed over a day before a cluster sees it. A real replica on the
simulated device gives the constants (``calibrate.py``); a fluid model
replays a day-shaped trace (a night with no traffic, the morning ramp, a
bulk indexing job at noon) against the chart's scaling rule in compressed
time (``replay.py``), for a sweep of thresholds; the chart's defaults are
the cheapest rule that meets the latency goal. Results: ``autoscale.md``,
``autoscale.json``, ``autoscale.png``."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.autoscale import calibrate, report
from bench.autoscale.replay import Replica, Rule, Trace, replay
from bench.harness.results import now
from bench.sim.replicas import Fleet, bge_m3_dir

TITLE = "Autoscaling the Tulip pool: a day replayed against the scaling rule (simulated device, compressed time)"

# The goal the thresholds are chosen for: query p99 over the day (an
# embedding's share of a search request's budget).
P99_GOAL_MS = 50.0
# Assumed for a GPU pod (not measurable here): scheduling on a warm node,
# loading BGE-M3's 2.3 GB of weights, capturing the graphs.
COLD_START_S = 90
# Ivy's defaults: batch chunks per replica x chunk tokens.
BATCH_CAP_TOKENS = 4 * 2048
# Extra replica-hours accepted for a rule that scales less often.
COST_SLACK = 0.03
INTERACTIVE_TARGETS = [0.002, 0.005, 0.01, 0.02, 0.05]
DOWN_WINDOWS = [120, 300, 600]


def run_suite(writer, args) -> int:
    work = Path(tempfile.mkdtemp(prefix="bench-autoscale-"))
    try:
        return _run(writer, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the replicas' logs and model: the results have what counts


def _run(writer, args, work: Path) -> int:
    quick = args.mode == "quick"
    started = now()
    load_before = os.getloadavg()
    fleet = Fleet(Path(args.model) if args.model else bge_m3_dir(work), work)
    t = time.monotonic()
    try:
        measured = calibrate.measure(fleet, quick)
    finally:
        fleet.close()
    print(f"autoscale: calibrated in {time.monotonic() - t:.0f} s: {measured}", flush=True)
    replica = Replica(capacity=measured["capacity_tokens_per_s"],
                      idle_p99_s=measured["query_64_idle_ms"]["p99"] / 1e3,
                      step_s=measured["full_step_ms"] / 1e3, cold_start_s=COLD_START_S,
                      batch_cap_tokens=BATCH_CAP_TOKENS)
    trace = Trace()
    seconds = 6 * 3600 + 3600 * 8 if quick else 86400  # quick: midnight to 14:00
    # The batch target: below what one replica reports while a job runs
    # (Ivy's cap / capacity), so a bulk job doubles the pool each period.
    batch_target = round(0.5 * BATCH_CAP_TOKENS / replica.capacity, 4)
    targets = INTERACTIVE_TARGETS[1:3] if quick else INTERACTIVE_TARGETS
    windows = DOWN_WINDOWS[1:2] if quick else DOWN_WINDOWS
    sweep = []
    for ti in targets:
        for w in windows:
            r = replay(trace, replica, Rule(ti, batch_target, down_window=w), seconds=seconds)
            print(f"autoscale: target {ti}s window {w}s: {r['replica_hours']} replica-h, p99 {r['p99_ms']} ms",
                  flush=True)
            sweep.append(r)
    meeting = [r for r in sweep if r["p99_ms"] is not None and r["p99_ms"] <= P99_GOAL_MS]
    cheapest = min(meeting or sweep, key=lambda r: (r["replica_hours"], r["p99_ms"]))
    # Among rules within a few percent of the cheapest, the one that churns
    # least (every scale-up is a cold start, every scale-down a drain).
    close = [r for r in (meeting or sweep) if r["replica_hours"] <= cheapest["replica_hours"] * (1 + COST_SLACK)]
    chosen = min(close, key=lambda r: (r["scale_events"], r["replica_hours"]))
    peak = chosen["max_replicas"]
    fixed = replay(trace, replica, None, fixed=peak, seconds=seconds)
    data = {"quick": quick, "seconds_replayed": seconds, "load_average_before": [round(x, 2) for x in load_before],
            "measured": measured, "assumed": {"cold_start_s": COLD_START_S, "batch_cap_tokens": BATCH_CAP_TOKENS},
            "p99_goal_ms": P99_GOAL_MS, "trace": trace.to_dict(), "batch_target_s": batch_target,
            "sweep": [{k: v for k, v in r.items() if k != "series"} for r in sweep],
            "chosen": chosen, "fixed": fixed, "met_goal": bool(meeting)}
    md = report.markdown(data)
    path = writer.write("autoscale", TITLE, data, md, [], started)
    report.plot(data, writer.out_dir / "autoscale.png")
    print(path.read_text())
    return 0
