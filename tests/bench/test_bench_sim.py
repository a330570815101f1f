"""``python -m bench sim --quick``: every section of the simulated-device
benchmark runs end to end against real Tulip and Ivy processes and writes
its results (the benchmark dry run; no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.servers import REPO


@pytest.mark.slow
def test_sim_quick_run(tmp_path):
    res = subprocess.run([sys.executable, "-m", "bench", "sim", "--quick", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    record = json.loads((tmp_path / "sim.json").read_text())
    r = record["results"]
    assert record["gates"] and all(g["passed"] for g in record["gates"])
    assert set(r["online"]) == {"128", "512", "4096"}
    for n, cell in r["online"].items():
        assert cell["tulip"]["device_ms"] > 0 and cell["ivy"]["device_ms"] > 0, n
    assert set(r["scoring"]) == {"5", "25", "50"}
    assert r["saturation"]["on"]["steps"] > 0 and r["saturation"]["off"]["overlapping_launches"] == 0
    assert set(r["fanout"]["levels"]) == {"1", "2"}
    for lv in r["fanout"]["levels"].values():  # the CPU attributed per process
        assert lv["cpu"]["processes"]["ivy"]["cpu_s"] > 0 and "clients" in lv["cpu_cores"]
    assert "host" in r, "the host path profile needs the compiled load generator (make test builds it)"
    for path in ("tulip", "ivy"):
        assert r["host"][path]["cpu_us_per_request"]["tulip"] > 0, path
    assert r["host"]["ivy"]["cpu_us_per_request"]["ivy"] > 0
    # Isolation: a file set per cost model, every scenario measured.
    assert r["isolation"] == {m: f"sim-isolation-{m}.md" for m in ("roofline", "published")}
    for m in ("roofline", "published"):
        iso = json.loads((tmp_path / f"sim-isolation-{m}.json").read_text())["results"]
        assert iso["scenarios"].keys() == {"idle", "priority", "previous", "fcfs"}
        assert iso["params"]["cost_model"]["name"] == m
        for name, s in iso["scenarios"].items():
            assert s["queries"]["count"] > 0 and s["busy"] > 0, name
            assert name == "idle" or (s["batch_tokens_per_s"] > 0 and s["batch"]["count"] > 0), name
        assert len(iso["targets"]) == 3
        assert (tmp_path / f"sim-isolation-{m}.png").stat().st_size > 0
    assert r["launch_us"] > 0 and "t0" in r["cost_model"]
    md = (tmp_path / "sim.md").read_text()
    assert "modelled, not measured" in md and (tmp_path / "sim.png").stat().st_size > 0
