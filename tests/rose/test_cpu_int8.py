"""int8 steps on the CPU fast path (rose/cpu/int8.py): the fast path's
export quantized to int8, taking its buckets where the gate finds the
output exact enough (cosine 0.999 against the float32 step), float32
elsewhere.

On MiniLM, real text: every vector stays within the gate of float32,
whichever way its step ran, and the gate measured the int8 copy; on a
random BERT, whose int8 output passes, steps run in int8; a bar the int8
output cannot reach (1.0) leaves the bucket on the float32 session; a
cross-encoder never gets int8; the quantized copy is cached under its own
key and reused; auto follows the CPU's dot products; served, Tulip counts
the int8 steps under their own label."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from bench.harness import tiny_models as models
from rose import Batch, Engine
from rose.cpu import Int8Settings, OnnxSettings
from rose.cpu.cache import ExportCache
from rose.cpu.gated import FIDELITY, State
from rose.cpu.int8 import dot_products
from tests.support.reference import assert_close_vectors
from tests.support.servers import Tulip
from tests.support.steps import step

from .conftest import tokenize

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

def runtimes(cache: str | None, max_tokens: int = 64, **int8) -> list:
    """The fast path and its int8 copy, forced on (as --cpu-int8 true), so
    that a CPU without dot products runs these tests too."""
    return [OnnxSettings(max_tokens=max_tokens, cache_dir=cache),
            Int8Settings(max_tokens=max_tokens, cache_dir=cache, require_dot=False, **int8)]


def built(engine: Engine, seqs: list[list[int]], **options):
    """A bucket's first step, every gated runtime's build and gate, the
    second step: (mode, output) of each."""
    first = step(engine, seqs, **options)
    assert all(r.wait(600) for r in engine.gated())
    return first, step(engine, seqs, **options)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("int8-cache"))


@pytest.fixture(scope="module")
def tiny(bert_dir, cache):
    return Engine.from_dir(bert_dir, device="cpu", dtype="float32", cpu_runtimes=runtimes(cache))


def test_minilm_real_text_stays_within_the_gate(minilm_dir, texts):
    """Every bucket's int8 output is measured against float32 and runs in
    int8 only where all its rows reach 0.999; each vector served, int8 or
    float32, is within 0.999 of the float32 step. (On this model dynamic
    int8 measured 0.97-0.995 per row: a working copy, which the gate keeps
    off its buckets.)"""
    # The user's cache, at test_cpu_fast_path.py's size: one float32 export.
    e = Engine.from_dir(minilm_dir, device="cpu", dtype="float32", cpu_runtimes=runtimes(None, 128))
    exact = Engine.from_dir(minilm_dir, device="cpu", dtype="float32")
    int8 = e.runner.runtime("onnx_int8")
    ids = tokenize(minilm_dir, [" ".join(texts)])[0]
    cut = [[*ids[i:i + n - 2]] for i, n in ((1, 9), (40, 27), (80, 20), (120, 30))]
    wrap = [[ids[0], *c, ids[-1]] for c in cut]  # [CLS] real text [SEP]
    int8_steps = 0
    for seqs in ([wrap[0]], [wrap[1]], wrap[2:]):  # buckets 16, 32, 64 (of up to 128)
        bucket = int8.key(Batch.from_lists(seqs))
        (_, out1), (mode, out2) = built(e, seqs)
        assert bucket is not None and int8.state(bucket) in (State.READY, State.FAILED), seqs
        cos = int8.gates[bucket]
        assert 0.95 < cos <= 1.0 + 1e-9, cos  # a working int8 copy, measured
        assert mode == ("onnx_int8" if cos >= FIDELITY else "onnx"), (mode, cos)
        int8_steps += mode == "onnx_int8"
        want = step(exact, seqs)[1]
        assert_close_vectors(out1, want)
        assert_close_vectors(out2, want)
    assert sorted(int8.gates) == [16, 32, 64]
    assert e.runner.stats.steps["onnx_int8"] == int8_steps


def test_random_bert_runs_in_int8(tiny, bert_dir, texts):
    """A model whose int8 output passes: its steps run in int8 and stay
    within the gate of float32, per-sequence options included."""
    exact = Engine.from_dir(bert_dir, device="cpu", dtype="float32")
    seqs = tokenize(bert_dir, texts[:2], max_length=24)
    (mode1, out1), (mode2, out2) = built(tiny, seqs)
    int8 = tiny.runner.runtime("onnx_int8")
    bucket = int8.key(Batch.from_lists(seqs))
    assert (mode1, mode2) == ("eager", "onnx_int8"), int8.gates
    assert FIDELITY <= int8.gates[bucket] < 1.0  # quantized, not a float32 copy
    assert_close_vectors(out2, step(exact, seqs)[1])
    mode, got = step(tiny, seqs, dimensions=[32, 0], normalize=[False, True])
    want = step(exact, seqs, dimensions=[32, 0], normalize=[False, True])[1]
    assert mode == "onnx_int8" and torch.count_nonzero(got[0, 32:]) == 0
    assert_close_vectors(got, want)
    assert torch.allclose(got[1].norm(), torch.tensor(1.0), atol=1e-4)
    assert tiny.runner.stats.steps["onnx_int8"] == 2


def test_a_bar_int8_cannot_reach_leaves_the_bucket_float32(bert_dir, cache, caplog):
    """The same int8 copy against a bar of 1.0 (the gate's own knob, not a
    stand-in): the bucket is refused, and its steps run on the float32
    session from then on."""
    e = Engine.from_dir(bert_dir, device="cpu", dtype="float32", cpu_runtimes=runtimes(cache, fidelity=1.0))
    seqs = [[101, 2054, 2003, 2019, 7861, 8270, 4667, 1029, 102]]
    with caplog.at_level(logging.INFO, logger="rose.cpu"):
        (m1, out1), (m2, out2) = built(e, seqs)
    int8 = e.runner.runtime("onnx_int8")
    assert (m1, m2) == ("eager", "onnx")
    assert int8.state(16) is State.FAILED and FIDELITY <= int8.gates[16] < 1.0  # met the real bar
    assert "int8 CPU fast path: bucket 16 tokens fails the fidelity gate" in caplog.text
    assert int8.counts()["failed"] == 1 and e.runner.stats.steps["onnx_int8"] == 0
    assert_close_vectors(out2, out1, 0.999999)  # float32 both


def test_a_cross_encoder_never_gets_int8(tmp_path, caplog):
    """A reranker's score is not a vector: int8 is refused, in one line,
    while its float32 fast path stays."""
    with caplog.at_level(logging.INFO, logger="rose.cpu"):
        e = Engine.from_dir(models.tiny_reranker(tmp_path / "rr"), device="cpu", dtype="float32",
                            cpu_runtimes=runtimes(str(tmp_path / "cache")))
    assert e.runner.runtime("onnx_int8") is None and e.runner.runtime("onnx") is not None
    assert "onnx_int8" not in e.info.step_modes
    assert "int8 CPU fast path off: its gate judges an embedder's vectors" in caplog.text


def test_the_int8_copy_is_cached_under_its_own_key_and_reused(tiny, bert_dir, cache, caplog):
    """Beside the float32 export, its own entry (its recipe in the key);
    a new engine loads it without exporting or quantizing again."""
    tiny.warm()
    caplog.clear()
    metas = [json.loads((p / "meta.json").read_text()) for _, _, p in ExportCache(cache).entries()]
    assert sorted(m.get("int8_per_channel", "-") for m in metas) == ["-", "1"], metas
    with caplog.at_level(logging.INFO, logger="rose.cpu"):
        again = Engine.from_dir(bert_dir, device="cpu", dtype="float32", cpu_runtimes=runtimes(cache))
        assert again.warm()["onnx_int8"] == {16: "ready", 32: "ready", 64: "ready"}
    assert "int8 CPU fast path: int8 copy reused from the cache" in caplog.text
    assert "into the cache" not in caplog.text  # neither exported nor quantized again
    assert len(ExportCache(cache).entries()) == 2


def test_auto_follows_the_cpu_s_dot_products(bert_dir, cache):
    """auto (the flag's auto: require_dot) turns int8 on exactly where the
    CPU has int8 dot products; the 7-bit weights are for the others."""
    auto = Engine.from_dir(bert_dir, device="cpu", dtype="float32",
                           cpu_runtimes=[OnnxSettings(cache_dir=cache), Int8Settings(cache_dir=cache)])
    assert (auto.runner.runtime("onnx_int8") is not None) is (dot_products() is not None)
    assert Int8Settings().recipe()["int8_reduce_range"] == ("0" if dot_products() else "1")


def _steps(tulip: Tulip, mode: str) -> float:
    for line in tulip.metrics().splitlines():
        if line.startswith(f'tulip_steps_total{{mode="{mode}"}}'):
            return float(line.split()[1])
    return 0.0


def test_served_tulip_counts_int8_steps(tiny, bert_dir, cache, log_dir):
    """Served with --cpu-int8 true (warmed from the cache the engines
    filled): a query runs in int8, Tulip accepts the engine's new label and
    counts the step under it, and the vector matches float32."""
    tiny.warm()  # the cache holds both copies: the server only loads them
    seqs = [[101, 2054, 2003, 2019, 7861, 8270, 4667, 1029, 102]]
    exact = Engine.from_dir(bert_dir, device="cpu", dtype="float32")
    tulip = Tulip(str(bert_dir), log_dir=log_dir, cpu_fast_path="true", cpu_int8="true", cpu_fast_path_warm="true",
                  cpu_fast_path_max_tokens=64, cache_dir=cache, timeout=600)
    try:
        with tulip.client() as c:
            got = torch.tensor(np.array(c.embed(seqs).values, dtype=np.float32)).reshape(1, -1)
        assert _steps(tulip, "onnx_int8") == 1
    finally:
        tulip.stop()
    assert_close_vectors(got, step(exact, seqs)[1])
