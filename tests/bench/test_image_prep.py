"""``python -m bench image-prep --quick``: issue 48's image-preparation
benchmark runs end to end on three small photos (JPEG, PNG, WebP): the Rust
example is built and run, its tensors pass the gate against transformers'
PIL processors, every side is timed and the files are written (no timing
is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.servers import REPO


@pytest.mark.slow
def test_image_prep_quick_run(tmp_path):
    res = subprocess.run([sys.executable, "-m", "bench", "image-prep", "--quick", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    record = json.loads((tmp_path / "image-prep.json").read_text())
    r = record["results"]
    assert [g["side"] for g in record["gates"]] == ["ivy-imageprep (clip)", "ivy-imageprep (siglip)"]
    assert all(g["passed"] for g in record["gates"])
    sides = r["params"]["sides"]
    assert sides[:2] == ["ivy-imageprep", "transformers PIL"]
    names = {i["name"] for i in r["params"]["images"]}
    assert {i["format"] for i in r["params"]["images"]} == {"JPEG", "PNG", "WEBP"}
    for config in ("clip", "siglip"):
        assert set(r["images_per_second"][config]) == names
        for name, by_side in r["images_per_second"][config].items():
            assert set(by_side) == set(sides) and all(v > 0 for v in by_side.values()), (config, name)
            cell = r["agreement"][config][name]["ivy-imageprep"]
            assert cell["values"] == 3 * 224 * 224 and cell["passed"], (config, name)
            if not name.endswith(".jpg"):  # PNG and WebP: bit for bit
                assert cell["max_steps"] == 0 and cell["sum"] == cell["reference_sum"], (config, name)
    assert len(r["params"]["loadavg_before"]) == 3
    assert (tmp_path / "image-prep.png").stat().st_size > 0
    assert "ivy-imageprep / transformers PIL" in (tmp_path / "image-prep.md").read_text()
