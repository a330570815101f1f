"""A day replayed against the scaling rule, in one-second ticks with time
compressed (a day of 86,400 ticks runs in seconds). A fluid model: work is
tokens per second, not individual requests; its constants are measured on
a real replica on the simulated device (``calibrate.py``): the capacity
Tulip reports, the query latency at idle, the time of a full step.

Per tick: each class's arrivals join its backlog; the ready replicas serve
interactive tokens first, then batch tokens, up to their capacity. A bulk
job's tokens reach the replicas only as Ivy lets them (batch chunks in
flight per replica); the rest waits in its client. Every ``poll`` seconds
the autoscaler applies the rule the chart renders to the metrics as the
last scrape saw them: desired = max(ceil(interactive backlog s / its
target), ceil(batch backlog s / its target)); KEDA activates a pool at
zero on held requests and empties it after ``cooldown`` idle seconds; the
HPA behaviour bounds each step (scale-up: ``up_pods`` per ``up_period``;
scale-down: the highest recommendation of the last ``down_window`` seconds,
``down_pods`` per ``down_period``). A replica serves ``cold_start`` seconds
after it is asked for.

Latency of a tick's queries: the idle p99, plus the interactive backlog
ahead of them per replica, plus M/D/1's mean wait rho / (2 (1 - rho))
steps scaled by ln(100) for a p99 (random arrivals), plus half a full step
while batch work runs (a query waits for the step on the device). What a
replica reports as outstanding interactive work follows Little's law:
arrival rate x time in the replica."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass
class Trace:
    """A day's offered load: interactive load by hour (in capacities of one
    replica, linear between points) and one bulk job."""

    points: list[tuple[float, float]] = field(default_factory=lambda: [
        (0, 0.1), (1, 0.0), (5, 0.0), (6, 0.1), (7, 0.6), (9, 2.4), (11, 2.7), (12, 2.4), (14, 2.6),
        (17, 2.4), (19, 1.2), (22, 0.3), (24, 0.1)])
    # The noon bulk job: its size in replica-hours of work.
    bulk_replica_hours: float = 4.0
    bulk_start_hour: float = 12.0

    def interactive(self, t: float) -> float:
        h = (t / 3600.0) % 24
        for (h0, v0), (h1, v1) in zip(self.points, self.points[1:]):
            if h0 <= h <= h1:
                return v0 + (v1 - v0) * (h - h0) / (h1 - h0)
        return self.points[-1][1]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Rule:
    """The chart's scaling rule (values.yaml, tulip.autoscaling)."""

    interactive_target_s: float
    batch_target_s: float
    min_replicas: int = 0
    max_replicas: int = 8
    poll: int = 15              # KEDA pollingInterval
    scrape: int = 15            # Prometheus scrape interval
    up_pods: int = 4
    up_period: int = 15
    down_window: int = 300
    down_pods: int = 1
    down_period: int = 60
    cooldown: int = 300         # KEDA cooldownPeriod (to zero only)


@dataclass
class Replica:
    capacity: float             # tokens/s (Tulip's tulip_capacity_tokens_per_second)
    idle_p99_s: float           # a query alone, p99
    step_s: float               # one full step
    cold_start_s: float         # asked for -> serving
    batch_cap_tokens: int       # Ivy: batch chunks per replica x chunk tokens
    query_tokens: int = 64


def query_latency(rho: float, backlog_s: float, batch_running: bool, r: Replica) -> float:
    rho = min(rho, 0.98)
    # A query step takes about the idle latency; a batch step a full step.
    queueing = rho / (2 * (1 - rho)) * r.idle_p99_s * math.log(100)
    return r.idle_p99_s + backlog_s + queueing + (0.5 * r.step_s if batch_running else 0.0)


def replay(trace: Trace, replica: Replica, rule: Rule | None = None, fixed: int = 0,
           seconds: int = 86400, every: int = 60) -> dict:
    """One day under ``rule``, or (rule None) a fixed pool of ``fixed``."""
    C = replica.capacity
    ready = fixed if rule is None else rule.min_replicas
    starting: list[int] = []            # when each asked-for replica serves
    queued_i = 0.0                      # interactive tokens beyond capacity (overload)
    on_replicas_b = 0.0                 # batch tokens on the replicas (Ivy's cap)
    job_start = int(trace.bulk_start_hour * 3600)
    job_waiting = 0.0
    job_done_at = None
    scraped = {"interactive": 0.0, "batch": 0.0, "held": 0.0}
    recs: list[tuple[int, int]] = []
    last_up = last_down = -10**9
    last_active = -10**9
    replica_seconds = 0.0
    hist: dict[float, float] = {}
    queries = held_queries = held_wait = 0.0
    max_used = ready
    events = 0                          # scale-ups and scale-downs
    series = []
    for t in range(seconds):
        while starting and starting[0] <= t:
            starting.pop(0)
            ready += 1
        if t == job_start:
            job_waiting = trace.bulk_replica_hours * 3600 * C
        arrive = trace.interactive(t) * C
        budget = ready * C
        want_i = queued_i + arrive
        done_i = min(want_i, budget)
        queued_i = want_i - done_i
        done_b = min(job_waiting, budget - done_i)
        job_waiting -= done_b
        # Ivy keeps at most batch_cap_tokens of a job on each replica.
        on_replicas_b = min(job_waiting, ready * replica.batch_cap_tokens)
        if t > job_start and job_done_at is None and job_waiting <= 0:
            job_done_at = t
        n_q = arrive / replica.query_tokens
        interactive_s = 0.0
        if ready:
            rho = done_i / budget
            lat = query_latency(rho, queued_i / ready / C, done_b > 0, replica)
            # Little's law, summed over the replicas: arrivals x time inside.
            interactive_s = (arrive * (lat - replica.idle_p99_s / 2) + queued_i) / C
        elif n_q:
            wait = (starting[0] - t) if starting else replica.cold_start_s + rule.poll if rule else 1e9
            lat = replica.idle_p99_s + wait
            held_queries += n_q
            held_wait = max(held_wait, wait)
        if n_q:
            key = round(lat * 1000, 1)
            hist[key] = hist.get(key, 0.0) + n_q
            queries += n_q
        if arrive or job_waiting:
            last_active = t
        replica_seconds += ready + len(starting)
        if t % (rule.scrape if rule else 15) == 0:
            scraped = {"interactive": interactive_s, "batch": on_replicas_b / C if ready else 0.0,
                       "held": n_q if not ready else 0.0}
        current = ready + len(starting)
        if rule is not None and t % rule.poll == 0:
            desired = max(math.ceil(scraped["interactive"] / rule.interactive_target_s - 1e-9),
                          math.ceil(scraped["batch"] / rule.batch_target_s - 1e-9))
            if current == 0:
                # KEDA: any trigger above its activation value wakes the pool.
                desired = 1 if (scraped["held"] > 0 or job_waiting > 0) else 0
            elif rule.min_replicas == 0 and t - last_active >= rule.cooldown:
                desired = 0
            else:
                desired = min(max(desired, rule.min_replicas, 1), rule.max_replicas)
            recs = [(w, d) for w, d in recs if t - w < rule.down_window] + [(t, desired)]
            if desired > current and t - last_up >= rule.up_period:
                add = min(desired - current, max(rule.up_pods, current))  # Pods or 100 %
                starting += [t + int(replica.cold_start_s)] * add
                last_up = t
                events += 1
            elif desired == 0 and current > 0:
                starting.clear()
                ready = 0
                events += 1
            elif desired < current:
                target = max(d for _, d in recs)
                if target < current and t - last_down >= rule.down_period:
                    remove = min(current - target, rule.down_pods)
                    while remove and starting:
                        starting.pop()
                        remove -= 1
                    ready -= remove
                    last_down = t
                    events += 1
        max_used = max(max_used, ready + len(starting))
        if t % every == 0:
            series.append({"t": t, "replicas": ready, "starting": len(starting),
                           "interactive_load": round(arrive / C, 3),
                           "batch_backlog_s": round(on_replicas_b / C, 4),
                           "bulk_left_replica_s": round(job_waiting / C, 1),
                           "p99_ms": round(lat * 1000, 2) if n_q else None})
    return {"rule": asdict(rule) if rule else {"fixed": fixed},
            "replica_hours": round(replica_seconds / 3600, 2),
            "p99_ms": _quantile(hist, queries, 0.99), "p50_ms": _quantile(hist, queries, 0.50),
            "queries": round(queries), "held_queries": round(held_queries),
            "longest_hold_s": held_wait, "max_replicas": max_used, "scale_events": events,
            "bulk_job_s": (job_done_at - job_start) if job_done_at is not None else None,
            "series": series}


def _quantile(hist: dict[float, float], total: float, q: float) -> float | None:
    if total <= 0:
        return None
    seen = 0.0
    for k in sorted(hist):
        seen += hist[k]
        if seen >= q * total:
            return k
    return max(hist)
