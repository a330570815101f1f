"""Fitting the simulated device's cost model to real timings
(``bench/gpu/calibrate.py``), on synthetic timings whose constants are known."""

from __future__ import annotations

import json

import pytest

from bench.gpu import calibrate
from rose.sim import CostModel

TRUTH = CostModel(0.4e-3, 1.1e-6, 2.5e-10)


def gpu_json(tmp_path, lengths, noise=0.0):
    """A GPU run's gpu.json with a ``bge-m3/graphs`` section timed by TRUTH."""
    cells = {str(n): {"rose graphs": {"p50": TRUTH.seconds([n]) * 1e3 * (1 + noise * (-1) ** i)},
                      "rose eager": {"p50": 99.0}} for i, n in enumerate(lengths)}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"sections": {"bge-m3/graphs": {"status": "ok", "result": {
        "sweep": cells, "eager_vs_graphs": {}}}}}))
    return path


def test_the_constants_of_a_gpu_run_are_recovered(tmp_path):
    lengths = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    result = calibrate.calibrate(calibrate.points_from_gpu_json(gpu_json(tmp_path, lengths, noise=0.002), "bge-m3"))
    assert result["t0"] == pytest.approx(TRUTH.t0, rel=0.05)
    assert result["a"] == pytest.approx(TRUTH.a, rel=0.1)
    assert result["b"] == pytest.approx(TRUTH.b, rel=0.1)
    assert result["points"] == 9 and result["max_relative_error"] < 0.01


def test_the_command_writes_what_sim_cost_reads(tmp_path):
    out = tmp_path / "cost.json"
    assert calibrate.main(["--from", str(gpu_json(tmp_path, [64, 512, 2048, 4096])), "--out", str(out)]) == 0
    model = CostModel.parse(str(out))
    assert model.seconds([4096]) == pytest.approx(TRUTH.seconds([4096]), rel=1e-6)


def test_a_run_without_the_section_is_refused(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"sections": {"minilm/online": {}}}))
    with pytest.raises(ValueError, match="bge-m3/graphs"):
        calibrate.points_from_gpu_json(path, "bge-m3")
    assert calibrate.main(["--from", str(path)]) == 2


def test_a_live_engine_grid_is_fitted(minilm_dir):
    """The GPU bundle's section on the CPU: real steps over a small grid."""
    from bench.gpu.checks import engine

    cells = calibrate.grid([16, 64, 128], [1, 4], max_tokens=512)
    points = calibrate.measure(engine(minilm_dir, "cpu", "float32"), cells, rounds=2)
    assert [len(ls) for ls, _ in points] == [n for n, _ in cells]
    result = calibrate.calibrate(points)
    assert min(result["t0"], result["a"], result["b"]) >= 0 and result["points"] == len(cells)
