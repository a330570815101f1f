"""The graph dispatcher: bucket choice and the cold → warm → captured state
machine (no tensors involved, so it is tested on the CPU)."""

from __future__ import annotations

import pytest

from rose.interface import OutputKind
from rose.step.graphs import Action, Dispatcher, GraphKey, GraphSettings, State

DENSE = OutputKind.DENSE


def test_buckets_are_fine_then_coarse_and_always_leave_filler():
    s = GraphSettings(max_tokens=2048, fine_step=64, fine_limit=1024, coarse_step=256)
    assert s.bucket(1) == 64
    assert s.bucket(63) == 64
    assert s.bucket(64) == 128  # at least one filler token
    assert s.bucket(1000) == 1024
    assert s.bucket(1023) == 1024
    assert s.bucket(1024) == 1280
    assert s.bucket(2047) == 2048
    assert s.bucket(2048) is None  # would need 2048 + filler
    assert s.buckets()[:3] == [64, 128, 192]
    assert s.buckets()[-2:] == [1792, 2048]
    assert all(s.bucket(t) in s.buckets() for t in range(1, 2048))


def test_settings_reject_inconsistent_grids():
    with pytest.raises(ValueError):
        GraphSettings(fine_step=64, fine_limit=1000)
    with pytest.raises(ValueError):
        GraphSettings(max_tokens=0)


def test_state_machine_warmup_capture_replay():
    d = Dispatcher(GraphSettings())
    key = d.key(DENSE, 2, 100)
    assert key == GraphKey(DENSE, 2, 128)
    assert d.state(key) is State.COLD
    assert d.hit(key) is Action.WARMUP
    assert d.state(key) is State.WARM
    assert d.hit(key) is Action.CAPTURE
    d.captured(key)
    assert d.state(key) is State.CAPTURED
    assert [d.hit(key) for _ in range(3)] == [Action.REPLAY] * 3
    assert d.counts() == {"cold": 0, "warm": 0, "captured": 1, "failed": 0}


def test_failed_capture_stays_on_static_buffers():
    d = Dispatcher(GraphSettings())
    key = d.key(DENSE, 1, 10)
    d.hit(key)
    assert d.hit(key) is Action.CAPTURE
    d.failed(key)
    assert d.state(key) is State.FAILED
    assert d.hit(key) is Action.WARMUP


def test_configurations_are_per_kind_sequence_count_and_bucket():
    d = Dispatcher(GraphSettings())
    assert d.key(DENSE, 1, 10) == d.key(DENSE, 1, 60)
    assert d.key(DENSE, 1, 10) != d.key(DENSE, 2, 10)
    assert d.key(DENSE, 1, 10) != d.key(OutputKind.SPARSE, 1, 10)
    assert d.key(DENSE, 1, 10) != d.key(DENSE, 1, 70)


def test_too_large_or_disabled_runs_eagerly():
    d = Dispatcher(GraphSettings(max_tokens=512, max_sequences=4))
    assert d.key(DENSE, 5, 10) is None
    assert d.key(DENSE, 1, 600) is None
    assert d.hit(None) is Action.EAGER
    off = Dispatcher(GraphSettings(), enabled=False)
    assert off.key(DENSE, 1, 10) is None


def test_graph_key_parsing():
    assert GraphKey.parse("1x128") == GraphKey(DENSE, 1, 128)
    assert GraphKey.parse("sparse:4x512") == GraphKey(OutputKind.SPARSE, 4, 512)
    with pytest.raises(ValueError):
        GraphKey.parse("4by512")
