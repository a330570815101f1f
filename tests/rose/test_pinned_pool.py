"""The pinned-buffer pool: never hands out a buffer whose copy may still be
in flight, and reaches a steady state (no growth) over many steps."""

from __future__ import annotations

import random

from rose.step.staging import PinnedPool


class Event:
    """Stands in for a CUDA event where there is no GPU: completes when told."""

    def __init__(self):
        self.done = False

    def query(self) -> bool:
        return self.done


def test_buffer_is_not_reused_before_its_event_completes():
    pool = PinnedPool(pin=False)
    a = pool.acquire(1000)
    ev = Event()
    pool.release(a, ev)
    b = pool.acquire(1000)
    assert b.data_ptr() != a.data_ptr()
    pool.release(b)
    ev.done = True
    got = {pool.acquire(1000).data_ptr() for _ in range(2)}
    assert a.data_ptr() in got


def test_no_buffer_handed_out_twice_and_no_leak_over_10k_steps():
    pool = PinnedPool(pin=False)
    rng = random.Random(0)
    inflight: list[tuple[object, Event]] = []
    held: set[int] = set()
    for step in range(10_000):
        nbytes = rng.choice([1536, 6000, 50_000])
        buf = pool.acquire(nbytes)
        assert buf.numel() >= nbytes
        assert buf.data_ptr() not in held, f"step {step}: buffer handed out while in flight"
        held.add(buf.data_ptr())
        inflight.append((buf, Event()))
        # Up to 4 steps in flight; the oldest completes first, as on a stream.
        if len(inflight) > rng.randint(1, 4):
            old, ev = inflight.pop(0)
            pool.release(old, ev)
            ev.done = rng.random() < 0.9  # sometimes released before completion
            if ev.done:
                held.discard(old.data_ptr())
        for o, e in list(pool._pending):
            if not e.done:
                e.done = rng.random() < 0.5
                if e.done:
                    held.discard(o.data_ptr())
    for old, ev in inflight:
        ev.done = True
        pool.release(old, ev)
    for _, e in pool._pending:
        e.done = True
    pool.acquire(1)  # reclaims everything pending
    assert pool.in_use == 1
    # Three size classes, a handful of buffers each: bounded by what was ever
    # in flight at once, not by the number of steps.
    assert pool.allocated <= 3 * 12
