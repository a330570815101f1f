"""Soak: mixed traffic at a steady rate for a long time, RSS of every
process sampled, latency compared between the start and the end."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench.harness.httpclient import HttpClient
from bench.reliability import traffic
from bench.reliability.memory import RssSampler, growth


def percentile(values, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if len(values) else None


def run(kinds: list[traffic.Kind], ports: dict[str, int], pids, *, seconds: float, rate: float,
        warmup: float, window: float, rss_every: float = 10.0, workers: int = 16) -> dict:
    """Sends ``rate`` requests/s drawn from ``kinds`` for ``seconds``
    (open loop: a request is due at its time whatever the others do) from
    ``workers`` threads, each with its own kept-alive connection per
    gateway. ``ports`` maps a kind's gateway name to its HTTP port."""
    draw = traffic.drawer(kinds)
    local = threading.local()
    records: list[tuple[float, str, int, int, float]] = []  # (t, kind, expected, status, ms)
    lock = threading.Lock()

    def send(kind: traffic.Kind, request: bytes) -> None:
        clients = getattr(local, "clients", None)
        if clients is None:
            clients = local.clients = {g: HttpClient("127.0.0.1", p, timeout=120) for g, p in ports.items()}
        start = time.monotonic()
        try:
            status, _ = clients[kind.gateway].send(request)
        except OSError:
            status = 0
            clients[kind.gateway].close()
        ms = (time.monotonic() - start) * 1e3
        with lock:
            records.append((start - t0, kind.name, kind.expect, status, ms))

    with RssSampler(pids, rss_every) as rss, ThreadPoolExecutor(workers) as pool:
        t0 = time.monotonic()
        i = 0
        while (due := i / rate) < seconds:
            delay = t0 + due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            kind, request = draw()
            pool.submit(send, kind, request)
            i += 1
    return summarize(records, rss.samples, seconds=seconds, warmup=warmup, window=window, rate=rate)


def summarize(records, samples, *, seconds: float, warmup: float, window: float, rate: float) -> dict:
    unexpected = Counter()
    statuses = Counter()
    for _, name, expect, status, _ in records:
        statuses[f"{name}: {status}"] += 1
        if status != expect:
            unexpected[f"{name}: got {status}, expected {expect}"] += 1
    ok = [(t, name, ms) for t, name, expect, status, ms in records if status == 200 == expect]

    def p99_between(a: float, b: float, kind: str | None = None):
        return percentile([ms for t, n, ms in ok if a <= t < b and (kind is None or n == kind)], 99)

    first = (warmup, warmup + window)
    last = (seconds - window, seconds)
    kinds = sorted({n for _, n, _ in ok})
    windows = {k or "all": {"first_p99_ms": p99_between(*first, k), "last_p99_ms": p99_between(*last, k)}
               for k in [None, *kinds]}
    for w in windows.values():
        w["ratio"] = round(w["last_p99_ms"] / w["first_p99_ms"], 3) if w["first_p99_ms"] and w["last_p99_ms"] else None
    bin_s = max(window / 6, 10.0)
    timeline = [{"t": round(b + bin_s / 2, 1), "p99_ms": p99_between(b, b + bin_s),
                 "query_p99_ms": p99_between(b, b + bin_s, "query")}
                for b in np.arange(0, seconds, bin_s)]
    return {
        "params": {"seconds": seconds, "rate_per_s": rate, "warmup_s": warmup, "window_s": window},
        "requests": len(records),
        "unexpected": dict(unexpected),
        "unexpected_total": sum(unexpected.values()),
        "statuses": dict(sorted(statuses.items())),
        "p99_windows": windows,
        "latency_timeline": timeline,
        "rss_samples": samples,
        "rss": growth(samples, warmup),
    }
