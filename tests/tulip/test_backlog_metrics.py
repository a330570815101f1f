"""The autoscaling signal Tulip exports (docs/operations.md, "Autoscaling"):
tokens waiting and in flight per priority class, the measured capacity and
the backlog in seconds, read from a real replica on the simulated device
whose slow steps make a backlog that lasts long enough to be scraped."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.servers import Tulip, wait_for

# 0.25 s a step whatever its size, one step at a time, two sequences a
# step: 8 requests of 2 x 10 tokens hold the replica for about 2 s.
FLAGS = dict(device="sim", sim_cost="0.25,0,0", max_inflight=1, max_batch_sequences=2, inline_steps="false")
SEQ = [101] + [2000 + i for i in range(8)] + [102]  # 10 tokens


def series(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(tulip_(?:class_waiting_tokens|class_inflight_tokens|class_backlog_seconds|'
                     r'capacity_tokens_per_second))(\{class="(\w+)"\})? (\S+)$', line)
        if m:
            out[m.group(1) + (f"/{m.group(3)}" if m.group(3) else "")] = float(m.group(4))
    return out


@pytest.fixture(scope="module")
def tulip(log_dir):
    t = Tulip(log_dir=log_dir, **FLAGS)
    yield t
    assert t.stop() == 0


def test_an_idle_replica_reports_both_classes_at_zero(tulip):
    s = series(tulip.metrics())
    for cls in ("interactive", "batch"):
        for name in ("tulip_class_waiting_tokens", "tulip_class_inflight_tokens", "tulip_class_backlog_seconds"):
            assert s[f"{name}/{cls}"] == 0, (name, cls, s)
    assert "tulip_capacity_tokens_per_second" in s


def test_backlog_is_outstanding_tokens_over_measured_capacity(tulip):
    def send(i: int, priority: str):
        with tulip.client() as c:
            return c.embed([SEQ, SEQ], priority=priority).values.shape

    seen: list[dict[str, float]] = []

    def backlog_seen() -> bool:
        s = series(tulip.metrics())
        if s["tulip_class_waiting_tokens/batch"] > 0 and s["tulip_capacity_tokens_per_second"] > 0:
            seen.append(s)
        return len(seen) >= 2

    with ThreadPoolExecutor(10) as pool:
        # One step first, so a capacity is measured before the backlog builds.
        assert send(0, "batch") == (2, 384)
        futures = [pool.submit(send, i, "batch") for i in range(8)]
        futures += [pool.submit(send, i, "interactive") for i in range(2)]
        wait_for(backlog_seen, "a batch backlog with a measured capacity on /metrics", 60, every=0.05)
        assert [f.result(timeout=120) for f in futures] == [(2, 384)] * 10
    for s in seen:
        capacity = s["tulip_capacity_tokens_per_second"]
        for cls in ("interactive", "batch"):
            outstanding = s[f"tulip_class_waiting_tokens/{cls}"] + s[f"tulip_class_inflight_tokens/{cls}"]
            assert s[f"tulip_class_backlog_seconds/{cls}"] == pytest.approx(outstanding / capacity, rel=1e-6)
        # Tokens are whole requests' worth: 2 sequences of 10 tokens each.
        assert s["tulip_class_waiting_tokens/batch"] % 10 == 0
        assert s["tulip_class_waiting_tokens/batch"] + s["tulip_class_inflight_tokens/batch"] <= 8 * 20
    # Drained: nothing outstanding, the capacity stays for the next scrape.
    wait_for(lambda: all(v == 0 for k, v in series(tulip.metrics()).items() if k != "tulip_capacity_tokens_per_second"),
             "the backlog to drain", 30)
    after = series(tulip.metrics())
    assert after["tulip_capacity_tokens_per_second"] > 0
