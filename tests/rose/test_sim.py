"""The simulated device in-process: its cost model, its stream, its events
and faults, and its outputs for every output kind a model declares."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from bench.harness.tiny_models import tiny_reranker, tiny_splade, tiny_xlmr
from rose import Batch, DeviceError, OutputKind
from rose.sim import CostModel, SimEngine, SimSettings, busy_fraction, fit, overlapping, read_log
from rose.sim import cost as cost_module
from rose.sim.events import SimEvent
from rose.sim.faults import parse as parse_faults
from tests.support.servers import default_model_dir


def test_the_default_cost_comes_from_the_published_figures():
    c = cost_module.DEFAULT
    assert c.t0 == pytest.approx(0.15e-3)
    assert c.a == pytest.approx(1 / (2100 * 512))
    # b: the least-squares fit of the published p50s; 4,096 tokens decides it.
    assert c.seconds([4096]) == pytest.approx(9.57e-3, rel=0.02)
    # 100 x 512 stays under the compute roof's time (attention is extra).
    assert c.seconds([512] * 100) > 100 / 2100


def test_cost_parsing_from_flags_and_files(tmp_path):
    assert CostModel.parse("") == cost_module.DEFAULT
    assert CostModel.parse("0.001,2e-6,0") == CostModel(0.001, 2e-6, 0.0)
    f = tmp_path / "cost.json"
    f.write_text(json.dumps({"t0": 1e-4, "a": 1e-6, "b": 1e-10}))
    assert CostModel.parse(str(f)) == CostModel(1e-4, 1e-6, 1e-10)
    for bad in ("1,2", "a,b,c", "-1,0,0", str(tmp_path / "missing.json")):
        with pytest.raises(ValueError):
            CostModel.parse(bad)


def test_fit_recovers_the_constants_from_synthetic_steps():
    truth = CostModel(2e-4, 9e-7, 3e-10)
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(60):
        lengths = [int(x) for x in rng.integers(16, 2048, size=rng.integers(1, 16))]
        steps.append((lengths, truth.seconds(lengths) * (1 + rng.normal(0, 0.005))))
    got = fit(steps)
    assert got.t0 == pytest.approx(truth.t0, rel=0.3)
    assert got.a == pytest.approx(truth.a, rel=0.05)
    assert got.b == pytest.approx(truth.b, rel=0.1)
    # A term that the data does not support is clamped at 0, not negative.
    flat = fit([([n], 1e-3) for n in (10, 100, 1000, 2000)])
    assert min(flat.t0, flat.a, flat.b) >= 0 and flat.t0 == pytest.approx(1e-3)


def test_event_handles_are_tagged_and_complete_when_ended_and_written():
    """Complete once the modelled end has passed and the rows are written;
    a failed step's event raises torch's text (no timing window: ends are
    far in the past or the future)."""
    now = time.monotonic_ns()
    later = SimEvent(now + 60 * 10**9)
    assert later.cuda_event & 1 and later.end_ns == now + 60 * 10**9
    later.written()
    assert not later.query()  # not before its end
    ended = SimEvent(now)
    assert not ended.query()  # not before its rows are written
    ended.written()
    assert ended.query()
    failed = SimEvent(now, 700)
    failed.written()
    with pytest.raises(RuntimeError, match="illegal memory access"):
        failed.query()


def test_fault_specs():
    assert [(f.after, f.kind, f.code) for f in parse_faults("sticky@5, oom@2,400@7")] == [
        (5, "sticky", 700), (2, "oom", 0), (7, "code", 400)]
    for bad in ("sticky", "boom@3", "sticky@x", "5000@1"):
        with pytest.raises(ValueError):
            parse_faults(bad)


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory):
    return tiny_xlmr(tmp_path_factory.mktemp("m3"), m3_heads=True)


def _engine(path, **settings) -> SimEngine:
    return SimEngine.from_dir(path, settings=SimSettings.from_flags(**settings))


def _ids(rng, n):
    return [0] + [int(x) for x in rng.integers(5, 30000, size=n)] + [2]


def test_every_declared_kind_batched_equals_alone(m3_dir, tmp_path):
    rng = np.random.default_rng(1)
    seqs = [_ids(rng, n) for n in (3, 40, 9, 120)]
    # BERT-sized vocabularies keep the directories quick to write.
    dirs = [m3_dir, tiny_reranker(tmp_path / "rr", arch="bert"),
            tiny_reranker(tmp_path / "cls", arch="bert", labels=("a", "b", "c")), tiny_splade(tmp_path / "splade")]
    seen = set()
    for d in dirs:
        engine = _engine(d, cost="0,0,0")
        for kind in engine.info.kinds:
            seen.add(kind)
            together = engine.embed(seqs, kind).numpy()
            alone = np.concatenate([engine.embed([s], kind).numpy() for s in seqs])
            assert np.array_equal(together, alone), kind
            assert np.isfinite(together).all() and np.abs(together).sum() > 0, kind
            again = _engine(d, cost="0,0,0").embed(seqs, kind).numpy()
            assert np.array_equal(together, again), f"{kind} is not a function of the token ids"
    assert seen >= {"dense", "sparse", "multi_vector", "score", "classify", "sparse_vocab"}


def test_output_shapes_and_options_follow_the_model(m3_dir):
    engine = _engine(m3_dir, cost="0,0,0")
    seqs = [[0, 5, 6, 7, 2], [0, 9, 2]]
    dense = engine.embed(seqs).numpy()
    assert dense.shape == (2, engine.info.dimension)
    assert np.allclose(np.linalg.norm(dense, axis=1), 1.0, atol=1e-5)
    short = engine.embed(seqs, dimensions=[8, 8], normalize=[True, False]).numpy()
    assert (short[:, 8:] == 0).all() and np.linalg.norm(short[0]) == pytest.approx(1.0, abs=1e-5)
    sparse = engine.embed(seqs, OutputKind.SPARSE).numpy()
    assert sparse.shape == (8, 1) and sparse[0, 0] == 0 and sparse[4, 0] == 0
    mv = engine.embed(seqs, OutputKind.MULTI_VECTOR).numpy()
    assert mv.shape == (6, engine.info.multi_vector_dimension)
    different = engine.embed([[0, 6, 5, 7, 2]]).numpy()  # same ids, another order
    assert not np.allclose(different[0], dense[0])


def test_steps_queue_on_one_stream_and_the_log_shows_them(tmp_path):
    log = tmp_path / "sim.jsonl"
    # Steps long enough that the second launch comes while the first runs,
    # however loaded the machine.
    engine = _engine(default_model_dir(), cost="0.3,0,0", log_path=str(log), launch_us=100)
    first = engine.step(Batch.from_lists([[101, 7, 102]]))
    second = engine.step(Batch.from_lists([[101, 8, 102]]))
    steps = read_log(log)
    assert [s["step"] for s in steps] == [1, 2]
    assert steps[1]["start"] == steps[0]["end"], "a step launched while another runs starts when it ends"
    assert steps[1]["launch"] - steps[0]["launch"] >= 100_000, "the launch cost is spent on the host"
    assert overlapping(steps) == 1
    assert second.event_handle & 1, "a tagged (simulated) event handle"
    second.synchronize()
    assert time.monotonic_ns() >= steps[1]["end"]
    assert busy_fraction(steps) == pytest.approx(1.0)
    for lazy in (first, second):
        lazy.release()
    assert engine.runner.device.pool.in_use == 0


def test_faults_take_the_cuda_error_paths(tmp_path):
    engine = _engine(default_model_dir(), cost="0,0,0", faults="oom@1,400@2,sticky@3")
    batch = lambda: Batch.from_lists([[101, 7, 102]])  # noqa: E731
    engine.step(batch()).synchronize()
    with pytest.raises(torch.OutOfMemoryError):  # not sticky: the next step runs
        engine.step(batch())
    with pytest.raises(RuntimeError, match="invalid resource handle") as e:
        engine.step(batch()).synchronize()
    assert not isinstance(e.value, DeviceError)
    with pytest.raises(DeviceError, match="illegal memory access"):
        engine.step(batch()).synchronize()
    with pytest.raises(DeviceError):  # the context is gone for good
        engine.step(batch())


def test_bad_settings_fail_at_start(tmp_path):
    for kw in ({"faults": "boom@1"}, {"cost": "1,2"}, {"launch_us": -1}):
        with pytest.raises(ValueError):
            _engine(default_model_dir(), **kw)
