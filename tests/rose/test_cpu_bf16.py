"""The bfloat16 twin (rose/cpu/bf16.py): CPU steps the fast path does not
take run on a bfloat16 copy of the model once their token bucket is gated.

Fidelity per bucket against sentence-transformers on the same weights
(MiniLM, steps from one query to 16 documents: buckets 16 to 4096) and per
family against the float32 step; a bucket the gate refuses stays float32;
off, unavailable (no AMX under auto) and cross-encoders mean float32 with
nothing built; served, Tulip counts the twin's steps and they match
sentence-transformers. Skipped where the CPU has no bfloat16 arithmetic."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
import torch

from bench.harness import tiny_models as models
from rose import Engine
from rose.cpu import Bf16Settings, OnnxSettings, bf16, gated
from rose.cpu.gated import FIDELITY, State
from tests.support.reference import assert_close_vectors, st_inputs
from tests.support.servers import REPO, Tulip
from tests.support.steps import run_twice, step

from .conftest import tokenize

if bf16.missing(require_amx=False):
    pytest.skip(f"no bfloat16 twin here: {bf16.missing(require_amx=False)}", allow_module_level=True)

FORCED = [Bf16Settings(require_amx=False)]  # --cpu-bf16 true


@pytest.fixture(scope="module")
def minilm_twin(minilm_dir):
    return Engine.from_dir(minilm_dir, device="cpu", dtype="float32", cpu_runtimes=FORCED)


def test_minilm_buckets_match_sentence_transformers(minilm_twin, st_minilm, texts):
    """One query up to 16 full-length documents in a step: each bucket's
    first step is float32, the next runs on the twin, and both match
    sentence-transformers."""
    e = minilm_twin
    docs = [" ".join(texts[i:] + texts[:i]) for i in range(16)]  # every one cut at 256 tokens
    steps = [texts[:1], texts[3:4], texts[:4], docs[:2], docs[:5], docs[:9], docs]
    for group in steps:
        seqs = st_inputs(st_minilm, group)
        want = st_minilm.encode(group, convert_to_tensor=True).float()
        bucket = e.runner.runtime("bf16").settings.bucket(sum(len(s) for s in seqs))
        cold = e.runner.runtime("bf16").state(bucket) is State.COLD
        (mode1, out1), (mode2, out2) = run_twice(e, e.runner.runtime("bf16"), seqs)
        assert mode1 == ("eager" if cold else "bf16")
        assert e.runner.runtime("bf16").state(bucket) is State.READY, e.runner.runtime("bf16").gates
        assert e.runner.runtime("bf16").gates[bucket] >= FIDELITY
        assert mode2 == "bf16"
        assert_close_vectors(out1, want)
        assert_close_vectors(out2, want)
    assert max(e.runner.runtime("bf16").gates) == 4096


def test_options_and_other_outputs(minilm_twin, st_minilm):
    """Matryoshka dimensions and normalisation per sequence hold on the
    twin; token states (not its output) stay float32."""
    e = minilm_twin
    texts = ["how long does sourdough take to rise", "What is an embedding?"]
    seqs = st_inputs(st_minilm, texts)
    run_twice(e, e.runner.runtime("bf16"), seqs)
    mode, got = step(e, seqs, dimensions=[64, 0], normalize=[False, True])
    assert mode == "bf16"
    full = st_minilm.encode(texts, convert_to_tensor=True, normalize_embeddings=False).float()
    assert torch.count_nonzero(got[0, 64:]) == 0
    assert_close_vectors(got[:1, :64], full[:1, :64])
    assert_close_vectors(got[1:], torch.nn.functional.normalize(full[1:], dim=-1))
    assert torch.allclose(got[1].norm(), torch.tensor(1.0), atol=1e-3)
    mode, states = step(e, seqs[:1], "token_states")
    assert mode == "eager" and states.shape == (len(seqs[0]), 384)


@pytest.mark.parametrize("family", ["xlmr", "qwen3", "nomic_bert", "modernbert", "splade"])
def test_families_match_float32(family, tmp_path, texts):
    """BGE-M3's shape (XLM-R), a causal Qwen3 embedder, nomic-bert and
    ModernBERT (rotary), and SPLADE's vocabulary weights: the twin's step
    stays within the gate of the float32 step on steps of 1 to 8 real
    passages."""
    make = {"xlmr": models.tiny_xlmr, "qwen3": models.tiny_qwen3, "nomic_bert": models.tiny_nomic_bert,
            "modernbert": models.tiny_modernbert, "splade": models.tiny_splade}[family]
    d = make(tmp_path / family)
    exact = Engine.from_dir(d, device="cpu", dtype="float32")
    e = Engine.from_dir(d, device="cpu", dtype="float32", cpu_runtimes=FORCED)
    kind = e.runner.runtime("bf16").kind.value
    for group in (texts[:1], texts[:3], texts[4:12]):
        seqs = tokenize(d, group)
        _, (mode, got) = run_twice(e, e.runner.runtime("bf16"), seqs, kind)
        assert mode == "bf16", e.runner.runtime("bf16").gates
        assert_close_vectors(got, step(exact, seqs, kind)[1])


def test_beside_the_fast_path(minilm_dir, st_minilm):
    """With the twin on, the CPU fast path is off unless given a size
    (auto: the twin takes small steps too); given one, ONNX Runtime takes
    the steps up to it and the twin the rest."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    auto = Engine.from_dir(minilm_dir, device="cpu", dtype="float32", cpu_runtimes=[OnnxSettings(), *FORCED])
    assert auto.runner.runtime("onnx") is None and auto.runner.runtime("bf16") is not None
    both = Engine.from_dir(minilm_dir, device="cpu", dtype="float32",
                           cpu_runtimes=[OnnxSettings(max_tokens=16), *FORCED])
    assert both.warm()["onnx"] == {16: "ready"}
    texts = ["What is an embedding?", "how long does sourdough take to rise in a cold kitchen overnight "
             "before it is baked in a very hot oven"]
    seqs = st_inputs(st_minilm, texts)
    assert len(seqs[0]) <= 16 < len(seqs[1])
    want = st_minilm.encode(texts, convert_to_tensor=True).float()
    for i, mode in ((0, "onnx"), (1, "bf16")):
        run_twice(both, both.runner.runtime("bf16"), seqs[i:i + 1])
        got_mode, got = step(both, seqs[i:i + 1])
        assert got_mode == mode
        assert_close_vectors(got, want[i:i + 1])


def test_gate_refusal_stays_float32(minilm_dir, monkeypatch, caplog):
    """A bucket whose twin output misses the gate runs float32 from then
    on (an unreachable gate, so that every bucket misses it)."""
    monkeypatch.setattr(gated, "FIDELITY", 1.5)
    e = Engine.from_dir(minilm_dir, device="cpu", dtype="float32", cpu_runtimes=FORCED)
    seqs = [[101, 2054, 2003, 2019, 7861, 8270, 4667, 1029, 102]]
    with caplog.at_level(logging.WARNING, logger="rose.cpu"):
        (m1, out1), (m2, out2) = run_twice(e, e.runner.runtime("bf16"), seqs)
    assert (m1, m2) == ("eager", "eager")
    twin = e.runner.runtime("bf16")
    # Refused by the gate, not by a broken twin: its output met the real bar.
    assert twin.state(16) is State.FAILED and FIDELITY <= twin.gates[16] <= 1.0 + 1e-9
    assert "fails the fidelity gate" in caplog.text
    assert torch.equal(out1, out2)
    assert e.runner.stats.steps["bf16"] == 0


def test_off_and_refused_mean_float32(minilm_dir, tmp_path):
    """Off (the Python default), and refused for a cross-encoder, whose
    logits a cosine cannot judge: no twin, every step float32."""
    e = Engine.from_dir(minilm_dir, device="cpu", dtype="float32")
    assert e.runner.runtime("bf16") is None and e.warm() == {}
    seqs = [[101, 2054, 2003, 102]]
    assert [step(e, seqs)[0] for _ in range(3)] == ["eager"] * 3
    r = Engine.from_dir(models.tiny_reranker(tmp_path / "rr"), device="cpu", dtype="float32", cpu_runtimes=FORCED)
    assert r.runner.runtime("bf16") is None


def test_auto_without_amx_stays_float32(minilm_dir):
    """Under auto, a CPU without AMX tiles (one is faked in a fresh
    interpreter) gets no twin, says why once, and runs float32; forced on,
    the same CPU gets it."""
    code = (
        "import logging, torch; logging.basicConfig(level=logging.INFO)\n"
        "torch.cpu._is_amx_tile_supported = lambda: False\n"
        "from rose import Engine, Batch\n"
        "from rose.cpu import Bf16Settings\n"
        f"auto = Engine.from_dir({str(minilm_dir)!r}, device='cpu', dtype='float32', cpu_runtimes=[Bf16Settings()])\n"
        "assert auto.runner.runtime('bf16') is None\n"
        "modes = [auto.step(Batch.from_lists([[101, 2000, 2001, 102]])).info.mode for _ in range(3)]\n"
        "assert modes == ['eager'] * 3, modes\n"
        f"forced = Engine.from_dir({str(minilm_dir)!r}, device='cpu', dtype='float32', "
        "cpu_runtimes=[Bf16Settings(require_amx=False)])\n"
        "assert forced.runner.runtime('bf16') is not None\n"
        "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout + res.stderr
    assert "bfloat16 steps off: this CPU has no AMX tiles" in res.stderr


def _steps(tulip: Tulip, mode: str) -> float:
    for line in tulip.metrics().splitlines():
        if line.startswith(f'tulip_steps_total{{mode="{mode}"}}'):
            return float(line.split()[1])
    return 0.0


def test_served_on_and_off(minilm_dir, log_dir, st_minilm, texts):
    """Served: with the twin warmed at start-up a 12-document request runs
    on it and matches sentence-transformers; with it off no step does."""
    docs = [" ".join(texts[i:] + texts[:i]) for i in range(12)]
    seqs = st_inputs(st_minilm, docs)
    want = st_minilm.encode(docs, convert_to_tensor=True).float()
    on = Tulip(minilm_dir, log_dir=log_dir, cpu_bf16="true", cpu_fast_path_warm="true", max_batch_tokens=4096,
               timeout=900)
    off = Tulip(minilm_dir, log_dir=log_dir, cpu_bf16="false")
    try:
        for tulip, twin in ((on, True), (off, False)):
            with tulip.client() as c:
                got = torch.tensor(np.array(c.embed(seqs).values, dtype=np.float32)).reshape(len(seqs), -1)
            assert_close_vectors(got, want)
            assert (_steps(tulip, "bf16") >= 1) is twin
    finally:
        on.stop()
        off.stop()
