"""The replay's constants, measured on a real Tulip on the simulated device
(BGE-M3 on one H200, modelled; docs/simulated-device.md): the capacity the
replica itself reports (``tulip_capacity_tokens_per_second``, the figure
the autoscaler divides by) under a saturating batch load, the latency of a
64-token query alone, the time from process start to serving, and the
modelled time of one full step."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from bench.harness.timing import Stats
from bench.sim.latency import token_ids
from rose.sim import DEFAULT_COST


def metric(tulip, name: str, labels: str = "") -> float:
    for line in tulip.metrics().splitlines():
        if line.startswith(f"{name}{labels} "):
            return float(line.split()[1])
    raise KeyError(f"{name}{labels} not in Tulip's /metrics")


def measure(fleet, quick: bool) -> dict:
    t0 = time.monotonic()
    tulip, _log = fleet.tulip("autoscale")
    started_s = time.monotonic() - t0
    query = [token_ids(64, 1)]
    rounds = 30 if quick else 300
    with tulip.client() as c:
        for _ in range(3):
            c.embed(query)
        lat = []
        for _ in range(rounds):
            s = time.perf_counter()
            c.embed(query)
            lat.append(time.perf_counter() - s)
    idle = Stats.of(lat).to_dict()
    # Saturation: 4 clients x requests of 32 x 512-token passages, batch class.
    docs = [token_ids(512, 100 + i) for i in range(32)]
    n = 4 if quick else 40
    before = metric(tulip, "tulip_tokens_total")

    def client(_):
        with tulip.client() as c:
            for _ in range(n):
                c.embed(docs, priority="batch")

    s = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(client, range(4)))
    wall = time.perf_counter() - s
    tokens = metric(tulip, "tulip_tokens_total") - before
    capacity = metric(tulip, "tulip_capacity_tokens_per_second")
    fleet.stop(tulip)
    full_step_tokens = 16384
    return {"capacity_tokens_per_s": round(capacity),
            "throughput_tokens_per_s": round(tokens / wall),
            "query_64_idle_ms": idle, "start_to_serving_s": round(started_s, 2),
            "full_step_ms": round(DEFAULT_COST.seconds([512] * (full_step_tokens // 512)) * 1e3, 3),
            "full_step_tokens": full_step_tokens}
