"""``python -m bench autoscale --quick``: a real Tulip on the simulated
device gives the constants, the replay runs a shortened day for a small
sweep and writes its results (the benchmark dry run; no timing is
asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.servers import REPO


@pytest.mark.slow
def test_autoscale_quick_run(tmp_path):
    res = subprocess.run([sys.executable, "-m", "bench", "autoscale", "--quick", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    r = json.loads((tmp_path / "autoscale.json").read_text())["results"]
    m = r["measured"]
    # The capacity is what Tulip itself reported under load.
    assert m["capacity_tokens_per_s"] > 0 and m["throughput_tokens_per_s"] > 0
    assert r["sweep"] and r["chosen"]["series"] and r["fixed"]["series"]
    chosen, fixed = r["chosen"], r["fixed"]
    assert fixed["rule"]["fixed"] == chosen["max_replicas"] >= 1
    # The night has no traffic: the pool went to zero, and queries that
    # arrived then were held for a cold start.
    assert min(s["replicas"] + s["starting"] for s in chosen["series"]) == 0
    assert chosen["held_queries"] > 0
    assert chosen["replica_hours"] < fixed["replica_hours"]
    md = (tmp_path / "autoscale.md").read_text()
    assert "Compressed time" in md and (tmp_path / "autoscale.png").stat().st_size > 0
