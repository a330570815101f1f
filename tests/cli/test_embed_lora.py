"""``tulip-rose embed --model NAME`` with a LoRA adapter (docs/api.md, "LoRA
adapters"): against a real Tulip on the embedded MiniLM started with
``--lora`` and an Ivy over it, the output equals Ivy's ``/v1/embeddings``
with that model (not the base model's vectors); ``IVY_MODEL`` is the
flag's default; the model is in the resume manifest; an unknown model is a
usage error with Ivy's message before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench.harness import lora_adapters as lora
from bench.harness.fixtures import corpus_lines
from tests.support.http import embed
from tests.support.servers import REPO, Ivy, Tulip

pytestmark = pytest.mark.slow

TEXTS = corpus_lines("botchan.txt")[300:324]


def cli(*args, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tulip_rose_cli", "embed", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def ivy(tmp_path_factory, minilm_dir, log_dir):
    """A Tulip serving MiniLM with the adapter ``legal`` loaded at start,
    and an Ivy over it."""
    adapter = lora.random_adapter(minilm_dir, tmp_path_factory.mktemp("lora") / "legal", r=8, seed=1)
    tulip = Tulip(minilm_dir, log_dir=log_dir, threads=1, lora=f"legal={adapter}")
    ivy = Ivy([tulip.url], minilm_dir, log_dir=log_dir, max_inputs=64)
    yield ivy
    ivy.stop()
    tulip.stop()


def test_an_adapters_vectors_and_the_resume(ivy, tmp_path):
    src, out = tmp_path / "docs.txt", tmp_path / "vectors.parquet"
    # An empty row 13: --strict stops there, leaving finished batches.
    src.write_text("".join(t + "\n" for t in [*TEXTS[:12], "", *TEXTS[12:]]))
    args = [src, "--out", out, "--url", ivy.url, "--batch-size", 4, "--concurrency", 1]
    strict = cli(*args, "--model", "legal", "--strict")
    assert strict.returncode == 1, strict.stderr
    # The model is in the resume manifest: it changes every vector.
    base = cli(*args)
    assert base.returncode == 2 and "model: was 'legal', now None" in base.stderr, base.stderr
    run = cli(*args, env={"IVY_MODEL": "legal"})
    assert run.returncode == 5, run.stderr
    assert "resuming: " in run.stderr
    got = np.array(pq.read_table(out).column("embedding").to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(got, embed(ivy, TEXTS, model="legal"), atol=1e-6)
    assert np.abs(got - embed(ivy, TEXTS)).max() > 0.01  # not the base model's


def test_an_unknown_model_is_a_usage_error_before_anything_is_written(ivy, tmp_path):
    src, out = tmp_path / "docs.txt", tmp_path / "vectors.parquet"
    src.write_text("Hello.\n")
    r = cli(src, "--out", out, "--url", ivy.url, "--model", "nonexistent")
    assert r.returncode == 2, r.stderr
    assert "--model 'nonexistent'" in r.stderr and "does not exist here" in r.stderr and "`legal`" in r.stderr, \
        r.stderr
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()
