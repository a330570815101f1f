"""Priority classes at GPU speed, on the simulated device: the order of the
steps, read from the device's log (``--sim-log``), never their times.

A batch request keeps steps of a bounded size on the device while a query
arrives: with the GPU defaults the query takes the in-flight slot kept for
it and runs right after the one batch step on the device; with both slots
open to batch work (the control) it waits for a step to end and then runs
behind a second batch step. Its step carries batch work only up to the
bound, and batch work still advances under a steady stream of queries.
Cancellation and drain with steps in flight are ``test_sim_device.py``'s,
which run with these defaults."""

from __future__ import annotations

import threading
import time

import pytest

from rose.sim import read_log
from tests.support.servers import Tulip

# 1 ms a step plus 0.2 ms a token: a batch step of 3 x 100 tokens is 61 ms,
# long against the host path even on a loaded two-core machine.
COST = "0.001,2e-4,0"
DOC = [101] + [2000 + i for i in range(98)] + [102]  # 100 tokens
QUERY = [101, 2054, 2003, 1996, 3437, 102, 102]  # 7 tokens: no batch step has that many
BATCH_TOKENS = 300
FLAGS = dict(device="sim", sim_cost=COST, graphs="false", batch_step_tokens=BATCH_TOKENS, batch_step_ms=0,
             max_batch_sequences=64)


def _sim(tmp_path, log_dir, name: str, **flags) -> tuple[Tulip, object]:
    log = tmp_path / f"{name}.jsonl"
    return Tulip(log_dir=log_dir, sim_log=str(log), **{**FLAGS, **flags}), log


def _is_query(step: dict) -> bool:
    """Carries queries: batch documents are 100 tokens, queries 7 (up to 14
    of them in a step stay told apart)."""
    return step["tokens"] % 100 != 0


def _batch_in_background(tulip: Tulip, docs: int) -> threading.Thread:
    def send():
        with tulip.client() as c:
            c.embed_raw([DOC] * docs, priority="batch")

    t = threading.Thread(target=send)
    t.start()
    return t


def _query_mid_step(tulip: Tulip, log) -> tuple[int, dict]:
    """Sends the query while a batch step has at least 25 ms left on the
    device (and at most 40 ms run); returns the send time and that step."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = time.monotonic_ns()
        running = [s for s in read_log(log) if s["start"] <= now < s["end"] and not _is_query(s)]
        if running and now - running[0]["start"] < 40e6 and running[0]["end"] - now > 25e6:
            with tulip.client() as c:
                c.embed_raw([QUERY], priority="interactive")
            return now, running[0]
        time.sleep(0.002)
    raise AssertionError("no batch step was on the device")


@pytest.mark.parametrize("kept_slot", [True, False], ids=["gpu-defaults", "both-slots-batch"])
def test_a_query_runs_right_after_the_batch_step_on_the_device(tmp_path, log_dir, kept_slot):
    flags = {} if kept_slot else {"batch_inflight": 0, "batch_launch_ahead": "false"}
    tulip, log = _sim(tmp_path, log_dir, "slot", **flags)
    try:
        with tulip.client() as c:
            c.embed_raw([QUERY], priority="interactive")  # interactive traffic is active from here
        batch = _batch_in_background(tulip, 30)  # 10 steps of 300 tokens
        sent, running = _query_mid_step(tulip, log)
        batch.join(60)
        steps = read_log(log)
        [query] = [s for s in steps if _is_query(s) and s["launch"] > sent]
        after = [s for s in steps if s["launch"] > sent]
        # Batch steps keep their bound: every one has 300 tokens or fewer.
        assert all(s["tokens"] <= BATCH_TOKENS for s in steps), steps
        if kept_slot:
            # The next step launched, at once (the batch step still on the
            # device), carrying the query alone, and next on the device.
            assert after[0] is query, after[:3]
            assert query["launch"] < running["end"]
            assert query["start"] == running["end"]
            assert query["tokens"] == len(QUERY)
        else:
            # The control: launched only once a step ended, behind another
            # batch step that was already waiting on the device.
            assert query["launch"] >= running["end"]
            assert any(s["start"] >= running["end"] and s["end"] <= query["start"] and not _is_query(s)
                       for s in steps), "the query was not behind a second batch step"
    finally:
        assert tulip.stop() == 0


def test_a_querys_step_carries_batch_work_only_up_to_the_bound(tmp_path, log_dir):
    # Fill a query's step with batch work up to the batch step bound.
    tulip, log = _sim(tmp_path, log_dir, "fill", interactive_fill_ms="inf")
    try:
        with tulip.client() as c:
            c.embed_raw([QUERY], priority="interactive")
        batch = _batch_in_background(tulip, 30)
        sent, _ = _query_mid_step(tulip, log)
        batch.join(60)
        [query] = [s for s in read_log(log) if _is_query(s) and s["launch"] > sent]
        assert len(QUERY) < query["tokens"] <= BATCH_TOKENS, query
    finally:
        assert tulip.stop() == 0


def test_batch_work_advances_under_a_steady_query_stream(tmp_path, log_dir):
    """Six clients keep queries coming back to back; a batch request still
    finishes while they do, its steps in the log between theirs."""
    tulip, log = _sim(tmp_path, log_dir, "stream")
    stop = threading.Event()
    answered_after: list[int] = []
    done = threading.Event()

    def stream():
        with tulip.client() as c:
            while not stop.is_set():
                c.embed_raw([QUERY], priority="interactive")
                if done.is_set():
                    answered_after.append(1)

    clients = [threading.Thread(target=stream) for _ in range(6)]
    try:
        for t in clients:
            t.start()
        time.sleep(0.3)
        began = time.monotonic_ns()
        with tulip.client() as c:
            c.embed_raw([DOC] * 9, priority="batch")
        done.set()
        finished = time.monotonic_ns()
        time.sleep(0.3)  # queries still answered after it prove the stream was on
        stop.set()
        for t in clients:
            t.join(60)
        assert answered_after, "the stream stopped before the batch request finished"
        steps = [s for s in read_log(log) if began <= s["launch"] <= finished]
        batch_steps = [s for s in steps if s["tokens"] >= 100]
        assert sum(s["tokens"] // 100 for s in batch_steps) == 9, batch_steps
        assert sum(1 for s in steps if _is_query(s)) >= len(batch_steps), "no queries ran meanwhile"
    finally:
        stop.set()
        assert tulip.stop() == 0


def test_the_priority_flags_default_per_device_and_read_the_environment(monkeypatch):
    from tulip.launcher import CPU_PRIORITY, GPU_PRIORITY, parser, priority_settings

    gpu = priority_settings(parser().parse_args([]), gpu=True)
    cpu = priority_settings(parser().parse_args([]), gpu=False)
    assert {k: gpu[k] for k in GPU_PRIORITY} == GPU_PRIORITY
    assert {k: cpu[k] for k in CPU_PRIORITY} == CPU_PRIORITY
    monkeypatch.setenv("TULIP_BATCH_STEP_MS", "2.5")
    monkeypatch.setenv("TULIP_BATCH_LAUNCH_AHEAD", "false")
    args = parser().parse_args(["--batch-inflight", "0", "--interactive-fill-ms", "inf"])
    got = priority_settings(args, gpu=True)
    assert (got["batch_step_ms"], got["launch_ahead"], got["batch_inflight"]) == (2.5, False, 0)
    assert got["interactive_fill_ms"] == float("inf")
