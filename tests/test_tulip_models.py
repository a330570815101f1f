"""What the launcher does with models whose outputs tulip.v1 cannot carry."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.models import tiny_reranker
from tests.servers import REPO


def test_classifier_is_refused_with_a_clear_error(tmp_path):
    d = tiny_reranker(tmp_path / "classifier", arch="bert", labels=("no", "yes", "maybe"))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "tulip", "--model", str(d), "--port", "0", "--metrics-port", "0"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "outputs (classify) have no tulip.v1 output kind yet" in r.stderr, r.stderr
