"""Tulip with several engine steps in flight: many concurrent clients, small
batches, every client gets its own correct vectors; metrics and drain."""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import torch

from rose import Engine
from tests.support.servers import Tulip


@pytest.fixture(scope="module")
def reference(minilm_dir):
    return Engine.from_dir(minilm_dir, device="cpu")


def client_sequences(i: int) -> list[list[int]]:
    rng = random.Random(i)
    return [[101] + [rng.randrange(1000, 29000) for _ in range(rng.randint(1, 40))] + [102]
            for _ in range(rng.randint(1, 3))]


@pytest.mark.parametrize("inflight", [2, 4])
def test_64_concurrent_clients_get_their_own_vectors(minilm_dir, log_dir, reference, inflight):
    tulip = Tulip(minilm_dir, log_dir=log_dir, max_inflight=inflight, max_batch_sequences=4,
                  max_batch_tokens=128)
    try:
        def one(i: int):
            with tulip.client() as c:
                return c.embed(client_sequences(i)).values

        with ThreadPoolExecutor(64) as pool:
            results = list(pool.map(one, range(64)))
        for i, got in enumerate(results):
            want = reference.embed(client_sequences(i)).numpy()
            assert got.shape == want.shape
            assert np.abs(got - want).max() <= 1e-5, f"client {i} got another client's rows"
        text = tulip.metrics()
        steps = sum(float(v) for v in re.findall(r'tulip_steps_total\{mode="\w+"\} (\S+)', text))
        assert steps >= 64 * 1.5 / 4  # small batches: many steps
        assert re.search(r'tulip_requests_total\{code="ok"\} 64', text)
        assert "tulip_batch_tokens_bucket" in text and "tulip_step_duration_seconds_count" in text
    finally:
        assert tulip.stop() == 0


def test_sigterm_drains_in_flight_requests(minilm_dir, log_dir):
    tulip = Tulip(minilm_dir, log_dir=log_dir, max_batch_sequences=2, max_inflight=1, drain_timeout=60)
    long_batch = [[101] + [2000 + j for j in range(250)] + [102]] * 24  # several seconds of CPU work
    results: list[object] = []

    def call():
        try:
            with tulip.client() as c:
                results.append(c.embed(long_batch).values.shape)
        except grpc.RpcError as e:
            results.append(e.code())

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while "tulip_active_requests 3" not in tulip.metrics() and time.monotonic() < deadline:
        time.sleep(0.05)
    tulip.signal(signal.SIGTERM)
    time.sleep(0.3)
    # Draining: health says NOT_SERVING and new work is refused...
    with tulip.client() as c:
        check = c.channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=bytes,
                                      response_deserializer=bytes)
        assert check(b"", timeout=5) == b"\x08\x02"
        with pytest.raises(grpc.RpcError) as e:
            c.embed([[101, 102]])
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "draining" in e.value.details()
    # ... while every request already in flight completes.
    for t in threads:
        t.join(120)
    assert results == [(24, 384)] * 3
    assert tulip.proc.wait(60) == 0
    assert "stopped" in tulip.log()


def test_wait_event_without_an_event_returns_at_once():
    """Handle 0 is "no event": it returns even with no time at all to wait,
    where an event still pending times out at once (a simulated one, an
    hour away, so this holds on any machine, however loaded)."""
    from tulip._native import wait_event

    from rose.sim.events import SimEvent

    assert wait_event(0, timeout_s=0.0) is None
    pending = SimEvent(time.monotonic_ns() + 3600 * 10**9)
    with pytest.raises(TimeoutError):
        wait_event(pending.cuda_event, timeout_s=0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rust_waits_on_a_torch_event_from_another_thread_without_the_gil():
    from tulip._native import wait_event

    from rose.lazy import LazyTensor
    from rose.step.staging import PinnedPool

    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(40):  # long enough that the wait really waits
        a = (a @ a).tanh_()
    lazy = LazyTensor.copy_from_device(a[:8, :16].contiguous(), PinnedPool())
    event = lazy._event
    entered, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def waiter():
        entered.set()
        try:
            wait_event(lazy.event_handle, timeout_s=60)
        except BaseException as e:  # reported below, and the loop still ends
            errors.append(e)
        finally:
            done.set()

    t = threading.Thread(target=waiter)
    t.start()
    entered.wait(10)
    # Python ticks of this thread while the waiter is inside wait_event and
    # the event is still pending: if wait_event held the GIL, this thread
    # could not run at all until the event completed, and this stays 0.
    ticks_while_pending = 0
    while not done.wait(0.0005):
        if not event.query():
            ticks_while_pending += 1
    t.join(10)
    assert not errors, errors
    assert event.query()
    got = torch.frombuffer(bytearray(lazy.nbytes), dtype=torch.float32)
    got.copy_(lazy.tensor().reshape(-1))
    assert torch.equal(got.view(8, 16), a[:8, :16].cpu())
    assert ticks_while_pending > 0, "the main thread never ran while the wait was pending: the GIL was held"
    lazy.release()
