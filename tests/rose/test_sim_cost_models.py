"""The simulated device's two named cost models (``--sim-cost roofline`` and
``--sim-cost published``): each reproduces the published figures it was
derived from, is chosen by name, and says its name wherever it is reported."""

from __future__ import annotations

import pytest

from rose.sim import CostModel, SimSettings
from rose.sim.cost import DEFAULT, MODELS, PUBLISHED_ONLINE_P50_S


def test_the_published_model_goes_through_the_three_published_points():
    m = MODELS["published"]
    for length, p50 in PUBLISHED_ONLINE_P50_S.items():
        assert m.seconds([length]) == pytest.approx(p50, rel=1e-9), length
    assert (m.t0, m.a, m.b) == pytest.approx((1.3766e-3, 1.173e-6, 2.02e-10), rel=1e-3)
    # The published batch figure follows: ~1,499 embeddings/s on 100 x 512.
    assert 100 / m.seconds([512] * 100) == pytest.approx(1499, abs=1)


def test_the_roofline_model_is_the_default_and_faster_than_the_published_one():
    r, p = MODELS["roofline"], MODELS["published"]
    assert DEFAULT is r and CostModel.parse("") is r
    assert r.t0 == pytest.approx(0.15e-3) and r.a == pytest.approx(1 / (2100 * 512))
    assert r.seconds([4096]) == pytest.approx(9.57e-3, rel=0.02)  # b fitted: 4,096 tokens decide it
    assert r.seconds([128]) == pytest.approx(0.275e-3, rel=0.01)
    assert 100 / r.seconds([512] * 100) == pytest.approx(1768, abs=2)
    for lengths in ([8], [128], [512], [512] * 100, [2048]):
        assert r.seconds(lengths) < p.seconds(lengths), lengths


def test_models_are_chosen_by_name_and_report_it(tmp_path):
    assert CostModel.parse("published") is MODELS["published"]
    assert SimSettings.from_flags(cost="published").cost.name == "published"
    assert MODELS["published"].describe().startswith("published: t0=1.377 ms")
    assert MODELS["roofline"].to_dict()["name"] == "roofline"
    # Constants given by hand are the same model whatever it is called.
    assert CostModel.parse("0.00015,1e-6,0") == CostModel(0.00015, 1e-6, 0.0, name="x")
    with pytest.raises(ValueError, match="roofline, published"):
        CostModel.parse("fastest")
