"""Tulip on the simulated device (``--device sim``): the GPU-only paths of
the real server (steps in flight at once, the completion thread waiting on
events without the GIL, cancellation and drain with steps on the device,
device errors) exercised on any machine. The device's event log
(``--sim-log``) shows what ran when; nothing here asserts a duration."""

from __future__ import annotations

import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from rose.sim import overlapping, read_log
from rose.sim.events import SimEvent
from tests.support.servers import Tulip

# Steps of a few milliseconds (plus 0.1 ms per token): long against the
# host path even on a loaded two-core machine, so steps overlap when Tulip
# lets them.
COST = "0.004,1e-4,0"


def sequences(i: int) -> list[list[int]]:
    rng = random.Random(i)
    return [[101] + [rng.randrange(1000, 29000) for _ in range(rng.randint(2, 30))] + [102]
            for _ in range(rng.randint(1, 3))]


def _sim(tmp_path, name: str, log_dir, **flags) -> tuple[Tulip, object]:
    log = tmp_path / f"{name}.jsonl"
    flags = {"device": "sim", "sim_cost": COST, "sim_log": str(log), "max_batch_sequences": 2, **flags}
    return Tulip(log_dir=log_dir, **flags), log


@pytest.fixture(scope="module")
def servers(tmp_path_factory, log_dir):
    """The same simulated replica with overlap (2 steps in flight) and without."""
    tmp = tmp_path_factory.mktemp("sim")
    two, two_log = _sim(tmp, "inflight2", log_dir, max_inflight=2)
    try:
        one, one_log = _sim(tmp, "inflight1", log_dir, max_inflight=1)
    except BaseException:
        two.stop()
        raise
    yield {2: (two, two_log), 1: (one, one_log)}
    assert two.stop() == 0
    assert one.stop() == 0


def _many(tulip: Tulip, n: int = 24) -> list[np.ndarray]:
    def one(i: int):
        with tulip.client() as c:
            return c.embed(sequences(i)).values

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def test_two_steps_in_flight_only_with_overlap_and_the_same_outputs(servers):
    results = {}
    for inflight, (tulip, log) in servers.items():
        results[inflight] = _many(tulip)
        steps = read_log(log)
        assert len(steps) >= 12
        ends = [s["end"] for s in steps]
        assert ends == sorted(ends), "steps complete in launch order on one stream"
        if inflight == 2:
            assert overlapping(steps) > 0, "no step was launched while the one before was on the device"
        else:
            assert overlapping(steps) == 0, "--max-inflight 1 launched a step before the last one ended"
        assert "tulip_inflight_steps 0" in tulip.metrics()
    for a, b in zip(results[1], results[2]):
        assert np.array_equal(a, b)


def test_batched_equals_alone_and_rows_stay_in_order(servers):
    tulip, _ = servers[2]
    seqs = [s for i in range(5) for s in sequences(100 + i)]  # several steps of 2 sequences
    with tulip.client() as c:
        together = c.embed(seqs).values
        alone = np.concatenate([c.embed([s]).values for s in seqs])
        info = c.info()
    assert together.shape == (len(seqs), 384) and info.device == "sim"
    assert np.array_equal(together, alone)
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)


def test_answers_wait_for_the_modelled_end_of_their_step(servers):
    """The completion path really waits on the event: a sequential client's
    answer never arrives before the end of the step that carried it."""
    tulip, log = servers[2]
    with tulip.client() as c:
        for i in range(6):
            sent = time.monotonic_ns()
            c.embed([[101, 2000 + i, 102]])
            got = time.monotonic_ns()
            mine = [s for s in read_log(log) if sent <= s["launch"] <= got]
            assert len(mine) == 1, mine
            assert got >= mine[0]["end"]


def test_a_client_cancelled_while_its_step_is_on_the_device(tmp_path, log_dir):
    tulip, log = _sim(tmp_path, "cancel", log_dir, sim_cost="0.8,0,0", max_inflight=2)
    try:
        with tulip.client() as c:
            fut = c.stub.Embed.future(c.request([[101, 7, 8, 102]]), timeout=30)
            deadline = time.monotonic() + 10
            while not read_log(log) and time.monotonic() < deadline:
                time.sleep(0.01)
            [step] = read_log(log)
            assert time.monotonic_ns() < step["end"], "the step already ended: the test proves nothing"
            assert fut.cancel()
            # The replica keeps serving, and the cancelled step's slot is freed.
            out = c.embed([[101, 9, 102]]).values
            assert out.shape == (1, 384)
        assert len(read_log(log)) == 2
        assert "tulip_inflight_steps 0" in tulip.metrics()
    finally:
        assert tulip.stop() == 0


def test_sigterm_drains_steps_in_flight(tmp_path, log_dir):
    tulip, log = _sim(tmp_path, "drain", log_dir, sim_cost="0.3,0,0", max_inflight=2, drain_timeout=60)
    results: list[object] = [None] * 6

    def one(i: int):
        try:
            with tulip.client() as c:
                results[i] = c.embed(sequences(i)).values
        except grpc.RpcError as e:
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    # Every request accepted, and steps on the device, before the signal.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (
            "tulip_active_requests 6" in tulip.metrics() and len(read_log(log)) >= 2):
        time.sleep(0.01)
    signalled = time.monotonic_ns()
    tulip.signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert tulip.stop(timeout=60) == 0
    steps = read_log(log)
    assert sum(1 for s in steps if s["launch"] < signalled < s["end"]) >= 1, "no step was on the device at SIGTERM"
    for i, r in enumerate(results):
        assert isinstance(r, np.ndarray), f"client {i}: {r}"


def test_a_device_error_that_is_not_sticky_fails_its_step_only(tmp_path, log_dir):
    # oom: the launch raises; 400: the event reports an error on the
    # completion path. Both fail their request; the replica keeps serving.
    tulip, _ = _sim(tmp_path, "faults", log_dir, sim_faults="oom@1,400@3", max_inflight=2)
    try:
        codes = []
        with tulip.client() as c:
            for i in range(5):
                try:
                    c.embed([[101, 3000 + i, 102]])
                    codes.append("ok")
                except grpc.RpcError as e:
                    codes.append(e.code().name)
                    assert "simulated" in e.details(), e.details()
        assert codes == ["ok", "INTERNAL", "ok", "INTERNAL", "ok"]
        assert tulip.alive()
    finally:
        assert tulip.stop() == 0


@pytest.mark.parametrize("fault", ["sticky@2", "719@2"])
def test_a_sticky_device_error_ends_the_replica(tmp_path, log_dir, fault):
    """Through the completion thread (a queued step), as a real sticky CUDA
    error: the request fails and the process exits with status 70."""
    tulip, _ = _sim(tmp_path, "sticky", log_dir, sim_faults=fault, inline_steps="false")
    with tulip.client() as c:
        c.embed([[101, 5, 102]])
        c.embed([[101, 6, 102]])
        with pytest.raises(grpc.RpcError) as e:
            c.embed([[101, 7, 102]])
    assert e.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE)
    deadline = time.monotonic() + 20
    while tulip.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "device failure" in tulip.log()
    assert tulip.stop(timeout=5) == 70


def test_wait_event_waits_on_a_simulated_event():
    """The wait Tulip's completion thread performs: until the end has passed
    and the rows are written, with the CUDA error a failed step reports, and
    a timeout for an event that never completes."""
    from tulip._native import wait_event

    end = time.monotonic_ns() + 20_000_000
    event = SimEvent(end)
    event.written()
    wait_event(event.cuda_event)
    assert time.monotonic_ns() >= end
    failed = SimEvent(time.monotonic_ns(), 700)
    failed.written()
    with pytest.raises(RuntimeError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        wait_event(failed.cuda_event)
    unwritten = SimEvent(time.monotonic_ns())
    with pytest.raises(TimeoutError):
        wait_event(unwritten.cuda_event, timeout_s=0.01)
