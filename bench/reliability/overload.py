"""Overload: ten times Ivy's ``--max-concurrent-requests`` worth of
clients. The excess must be refused at once with 429, accepted requests
must keep their latency, Ivy's memory must stay bounded and full service
must be back within a second of the load ending."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from bench.harness.httpclient import HttpClient
from bench.harness.results import REPO
from bench.reliability.memory import RssSampler
from bench.reliability.soak import percentile

PATH = "/v1/embeddings"


def load(port: int, clients: int, seconds: float, processes: int, backoff_ms: float) -> tuple[list, float, float]:
    """``clients`` closed-loop clients over ``processes`` processes; returns
    ((start, ms, status) per request, start, end) on the monotonic clock."""
    payload = json.dumps({"input": "how do I keep memory flat under load?"})
    start = time.monotonic() + 3.0  # time for every process to start and connect
    end = start + seconds
    per = [clients // processes + (i < clients % processes) for i in range(processes)]
    procs = [subprocess.Popen([sys.executable, "-m", "bench.reliability.load_worker", str(port), PATH, payload,
                               str(n), repr(start), repr(end), str(backoff_ms)],
                              stdout=subprocess.PIPE, cwd=REPO) for n in per if n]
    out = []
    for p in procs:
        data, _ = p.communicate(timeout=seconds + 120)
        if p.returncode != 0:
            raise RuntimeError(f"load worker exited {p.returncode}")
        out.extend(pickle.loads(data))
    return out, start, end


def full_service(port: int, limit: int, since: float, timeout: float = 30.0) -> float | None:
    """Seconds from ``since`` until ``limit`` concurrent requests all get 200."""
    payload = {"input": "are you back?"}
    clients = [HttpClient("127.0.0.1", port, timeout=30) for _ in range(limit)]
    request = clients[0].prepare(PATH, payload)
    try:
        with ThreadPoolExecutor(limit) as pool:
            while time.monotonic() - since < timeout:
                if all(s == 200 for s, _ in pool.map(lambda c: c.send(request), clients)):
                    return round(time.monotonic() - since, 3)
                time.sleep(0.01)
    finally:
        for c in clients:
            c.close()
    return None


def run(ivy, limit: int, *, seconds: float, at_limit_seconds: float, processes: int = 4,
        backoff_ms: float = 20.0, rss_every: float = 1.0) -> dict:
    """``ivy`` was started with ``--max-concurrent-requests limit``."""
    at_limit, *_ = load(ivy.port, limit, at_limit_seconds, min(processes, limit), backoff_ms)
    with RssSampler(lambda: {"ivy": ivy.proc.pid}, rss_every) as rss:
        over, start, end = load(ivy.port, 10 * limit, seconds, processes, backoff_ms)
        # The workers have exited; their last requests ended at most a
        # request's time after `end`.
        recovered = full_service(ivy.port, limit, max(end, max(t + ms / 1e3 for t, ms, _ in over)))
    statuses = Counter(s for _, _, s in over)
    limit_ok = [ms for _, ms, s in at_limit if s == 200]
    ok = [ms for _, ms, s in over if s == 200]
    refused = [ms for _, ms, s in over if s == 429]
    ivy_rss = [s["ivy"] for s in rss.samples if "ivy" in s]
    return {
        "params": {"limit": limit, "clients": 10 * limit, "seconds": seconds, "processes": processes,
                   "backoff_after_429_ms": backoff_ms, "at_limit_seconds": at_limit_seconds},
        "at_limit": {"requests": len(at_limit), "statuses": dict(Counter(s for _, _, s in at_limit)),
                     "p50_ms": percentile(limit_ok, 50), "p99_ms": percentile(limit_ok, 99)},
        "overload": {"requests": len(over), "statuses": {str(k): v for k, v in sorted(statuses.items())},
                     "failed": sum(v for k, v in statuses.items() if k not in (200, 429)),
                     "accepted_p50_ms": percentile(ok, 50), "accepted_p99_ms": percentile(ok, 99),
                     "refused_p50_ms": percentile(refused, 50), "refused_p99_ms": percentile(refused, 99)},
        "ivy_rss_mib": {"before": ivy_rss[0] if ivy_rss else None, "peak": max(ivy_rss) if ivy_rss else None,
                        "after": ivy_rss[-1] if ivy_rss else None},
        "rss_samples": rss.samples,
        "full_service_after_s": recovered,
    }
