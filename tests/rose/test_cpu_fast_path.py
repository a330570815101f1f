"""The CPU fast path (rose/cpu/onnx.py): small steps on ONNX Runtime from
ROSE's own export, built per token bucket in the background and gated.

Fidelity per bucket and per family against sentence-transformers on the
same weights (MiniLM, and a BGE-M3-shaped XLM-R with its sparse and
multi-vector heads); eager where the fast path cannot run (its runtime
missing, the option off, outputs and sizes it does not take); and, served,
that Tulip uses it when on and never loads ONNX Runtime when off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rose import Batch, Engine
from rose.cpu import OnnxSettings
from rose.cpu.gated import FIDELITY, State
from tests.support.reference import assert_close_vectors, st_inputs
from tests.support.servers import REPO, Ivy, Tulip
from tests.support.steps import run_twice, step

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

# Sequence lengths that land in every bucket up to 128 tokens, and a step
# larger than the fast path takes (128 tokens max here, to keep it short).
LENGTHS = (9, 16, 27, 50, 100, 160)
SETTINGS = OnnxSettings(max_tokens=128)


def _texts_of_lengths(st, corpus: list[str], lengths=LENGTHS) -> list[str]:
    """Real text cut to each target token count (special tokens included)."""
    long = " ".join(corpus)
    out = []
    for n in lengths:
        words = long.split()
        lo, hi = 1, len(words)
        while lo < hi:  # the fewest words that reach n tokens
            mid = (lo + hi) // 2
            if len(st_inputs(st, [" ".join(words[:mid])])[0]) >= n:
                hi = mid
            else:
                lo = mid + 1
        out.append(" ".join(words[:lo]))
    return out


@pytest.fixture(scope="module")
def minilm_fast(minilm_dir):
    return Engine.from_dir(minilm_dir, device="cpu", dtype="float32", cpu_runtimes=[SETTINGS])


def test_minilm_every_bucket_matches_sentence_transformers(minilm_fast, st_minilm, texts):
    e = minilm_fast
    queries = _texts_of_lengths(st_minilm, texts)
    want = st_minilm.encode(queries, convert_to_tensor=True).float()
    for text, n, ref in zip(queries, LENGTHS, want):
        seqs = st_inputs(st_minilm, [text])
        bucket = SETTINGS.bucket(len(seqs[0]))
        cold = bucket is None or e.runner.runtime("onnx").state(bucket) is State.COLD
        (mode1, out1), (mode2, out2) = run_twice(e, e.runner.runtime("onnx"), seqs)
        assert mode1 == ("eager" if cold else "onnx")  # the first hit of a bucket is eager
        assert_close_vectors(out1, ref.unsqueeze(0))
        if bucket is None:  # beyond --cpu-fast-path-max-tokens: the ragged eager path
            assert mode2 == "eager"
        else:
            assert e.runner.runtime("onnx").state(bucket) is State.READY, (n, e.runner.runtime("onnx").gates)
            assert e.runner.runtime("onnx").gates[bucket] >= FIDELITY
            assert mode2 == "onnx"
        assert_close_vectors(out2, ref.unsqueeze(0))
    assert e.runner.runtime("onnx").counts()["ready"] == 4  # 16, 32, 64, 128
    # Several sequences in one small step (Tulip batches concurrent queries).
    seqs = st_inputs(st_minilm, queries[:3])
    mode, out = step(e, seqs)
    assert mode == "onnx"
    assert_close_vectors(out, want[:3])


def test_options_and_other_outputs(minilm_fast, st_minilm):
    """Matryoshka dimensions and normalisation per sequence hold on the
    fast path; token states (not its output) run eagerly."""
    e = minilm_fast
    texts = ["how long does sourdough take to rise", "What is an embedding?"]
    seqs = st_inputs(st_minilm, texts)
    e.warm()
    lazy = e.step(Batch.from_lists(seqs, dimensions=[64, 0], normalize=[False, True]))
    got = lazy.tensor().clone()
    assert lazy.info.mode == "onnx"
    lazy.release()
    full = st_minilm.encode(texts, convert_to_tensor=True, normalize_embeddings=False).float()
    assert torch.count_nonzero(got[0, 64:]) == 0
    assert_close_vectors(got[:1, :64], full[:1, :64])
    assert_close_vectors(got[1:], torch.nn.functional.normalize(full[1:], dim=-1))
    mode, states = step(e, seqs[:1], "token_states")
    assert mode == "eager" and states.shape == (len(seqs[0]), 384)


def test_pinned_threads(minilm_dir, minilm_fast, st_minilm):
    """``pin``: ONNX Runtime's worker starts on the second of the process's
    CPUs and, before a step after an idle spell, moves off the calling
    thread's CPU; a step right after another leaves it free; the calling
    thread's own CPUs are left as they were; the same vectors. ``pinning.plan`` pins only where asked or where the process
    has exactly the step's thread count of CPUs."""
    import os
    import threading
    import time

    from rose.cpu import pinning

    cpus = pinning.allowed()
    if len(cpus) < 2:
        pytest.skip("pinning needs two CPUs")
    assert pinning.plan(len(cpus), None) == cpus
    assert pinning.plan(len(cpus), False) is None
    assert pinning.plan(1, True) is None
    assert pinning.plan(len(cpus) + 1, True) is None
    assert pinning.plan(2, True) == cpus[:2]
    assert pinning.plan(2, None) == (cpus if len(cpus) == 2 else None)

    # max_tokens as SETTINGS: the same export, reused from the cache.
    e = Engine.from_dir(minilm_dir, device="cpu", dtype="float32",
                        cpu_runtimes=[OnnxSettings(max_tokens=128, threads=2, pin=True)])
    e.warm()
    workers = e.runner.runtime("onnx")._runtime.workers
    assert workers is not None and len(workers.tids) == 1  # two threads: the caller and one worker
    seqs = st_inputs(st_minilm, ["how long does sourdough take to rise"])
    seen = {}

    def call(cpu: int):
        os.sched_setaffinity(0, {cpu})
        time.sleep(pinning.IDLE_S * 2)  # an idle spell: the step is pinned
        seen[cpu] = step(e, seqs), os.sched_getaffinity(0), os.sched_getaffinity(workers.tids[0])
        step(e, seqs)  # right after it: the scheduler places the worker
        seen[f"{cpu} again"] = os.sched_getaffinity(workers.tids[0])

    for cpu in (cpus[1], cpus[0]):
        t = threading.Thread(target=call, args=(cpu,))
        t.start()
        t.join()
        (mode, got), caller, worker = seen[cpu]
        assert mode == "onnx"
        assert caller == {cpu}
        assert worker == {cpus[0] if cpu == cpus[1] else cpus[1]}
        assert seen[f"{cpu} again"] == set(cpus[:2])
        assert_close_vectors(got, step(minilm_fast, seqs)[1])


def test_bge_m3_shape_dense_per_bucket(xlmr_dir, texts):
    """An XLM-R family model with BGE-M3's heads: dense on the fast path
    matches sentence-transformers per bucket; sparse and multi-vector
    outputs stay eager."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(xlmr_dir), device="cpu")
    e = Engine.from_dir(xlmr_dir, device="cpu", dtype="float32", cpu_runtimes=[SETTINGS])
    assert set(e.info.kinds) == {"dense", "sparse", "multi_vector"}
    queries = _texts_of_lengths(st, texts, LENGTHS[:-1])
    want = st.encode(queries, convert_to_tensor=True).float()
    for text, ref in zip(queries, want):
        seqs = st_inputs(st, [text])
        _, (mode, out) = run_twice(e, e.runner.runtime("onnx"), seqs)
        assert mode == "onnx", e.runner.runtime("onnx").gates
        assert_close_vectors(out, ref.unsqueeze(0))
    mode, out = step(e, st_inputs(st, queries[:2]))
    assert mode == "onnx"
    assert_close_vectors(out, want[:2])
    for kind in ("sparse", "multi_vector"):
        assert step(e, st_inputs(st, queries[:1]), kind)[0] == "eager"


def test_off_means_eager_and_nothing_built(minilm_dir, st_minilm, texts):
    e = Engine.from_dir(minilm_dir, device="cpu", dtype="float32")  # off by default in Python
    assert e.runner.runtime("onnx") is None
    seqs = st_inputs(st_minilm, texts[:1])
    assert [step(e, seqs)[0] for _ in range(3)] == ["eager"] * 3
    assert e.warm() == {}
    assert "onnx" not in e.runner.stats.steps


def test_runtime_missing_falls_back_to_eager(minilm_dir):
    """Without onnxruntime installed the option is accepted, logged, and
    every step runs eagerly (a fresh interpreter where it cannot import)."""
    code = (
        "import sys, logging; logging.basicConfig(level=logging.INFO)\n"
        "sys.modules['onnxruntime'] = None\n"
        "from rose import Engine, Batch\n"
        "from rose.cpu import OnnxSettings\n"
        f"e = Engine.from_dir({str(minilm_dir)!r}, device='cpu', dtype='float32', cpu_runtimes=[OnnxSettings()])\n"
        "assert e.runner.runtime('onnx') is None\n"
        "modes = [e.step(Batch.from_lists([[101, 2000, 2001, 102]])).info.mode for _ in range(3)]\n"
        "assert modes == ['eager'] * 3, modes\n"
        "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout + res.stderr
    assert "CPU fast path off: onnxruntime is not installed" in res.stderr


def _onnxruntime_loaded(pid: int) -> bool:
    return "onnxruntime" in Path(f"/proc/{pid}/maps").read_text()


def _onnx_steps(tulip: Tulip, mode: str = "onnx") -> float:
    for line in tulip.metrics().splitlines():
        if line.startswith(f'tulip_steps_total{{mode="{mode}"}}'):
            return float(line.split()[1])
    return 0.0


def _buckets(tulip: Tulip) -> dict[str, int]:
    """The fast path's buckets by state, from /metrics."""
    prefix = 'tulip_cpu_fast_path_buckets{runtime="onnx",state="'
    return {line[len(prefix):].split('"')[0]: int(float(line.split()[1]))
            for line in tulip.metrics().splitlines() if line.startswith(prefix)}


def test_served_on_and_off(minilm_dir, log_dir, st_minilm):
    """Served: with the fast path warmed at start-up a query's step runs on
    ONNX Runtime and matches sentence-transformers, and its buckets show as
    ready in the metrics and in Info; restarted over the export the first
    left in the cache (``--cpu-fast-path-warm`` auto, the default), its
    first query runs on ONNX Runtime too; with it off no step is, and ONNX
    Runtime is never loaded into the process."""
    texts = ["how long does sourdough take to rise", "What is an embedding?"]
    seqs = st_inputs(st_minilm, texts)
    want = st_minilm.encode(texts, convert_to_tensor=True).float()
    on = Tulip(minilm_dir, log_dir=log_dir, cpu_fast_path="true", cpu_fast_path_warm="true",
               cpu_fast_path_max_tokens=64, timeout=900)
    off = Tulip(minilm_dir, log_dir=log_dir)  # the test default: --cpu-fast-path false
    try:
        ready = {"cold": 0, "pending": 0, "ready": 3, "failed": 0}  # 16, 32, 64
        assert _buckets(on) == ready
        with on.client() as c:
            assert [(r.name, r.ready, r.cold) for r in c.info().cpu_runtimes] == [("onnx", 3, 0)]
        with off.client() as c:
            assert list(c.info().cpu_runtimes) == []
        assert _buckets(off) == {}
        for tulip, onnx in ((on, True), (off, False)):
            with tulip.client() as c:
                for i, s in enumerate(seqs):
                    got = torch.tensor(np.array(c.embed([s]).values, dtype=np.float32)).reshape(1, -1)
                    assert_close_vectors(got, want[i:i + 1])
            assert (_onnx_steps(tulip) >= 2) is onnx
            assert _onnxruntime_loaded(tulip.proc.pid) is onnx
    finally:
        on.stop()
        off.stop()
    again = Tulip(minilm_dir, log_dir=log_dir, cpu_fast_path="true", cpu_fast_path_max_tokens=64, timeout=900)
    ivy = None
    try:
        assert _buckets(again) == ready  # opened and gated from the cache before serving
        with again.client() as c:
            c.embed(seqs[:1])
        assert (_onnx_steps(again), _onnx_steps(again, "eager")) == (1, 0)
        # Ivy's /info asks its replicas when it is asked.
        ivy = Ivy([again.url], minilm_dir, log_dir=log_dir)
        status, body = ivy.get("/info")
        assert status == 200 and json.loads(body)["cpu_runtimes"] == {"onnx": ready}
    finally:
        if ivy is not None:
            ivy.stop()
        again.stop()


def test_warm_splits_buckets_longer_than_the_model_input(tmp_path):
    """Warming at start-up fills a bucket larger than the model's longest
    input (multilingual MiniLM: 128 tokens, bucket 256) with several
    sequences instead of refusing to load; the warmed bucket then serves a
    real two-sequence step as the eager path does."""
    import json

    from bench.harness.tiny_models import tiny_bert

    d = tiny_bert(tmp_path / "short")
    cfg = json.loads((d / "sentence_bert_config.json").read_text())
    (d / "sentence_bert_config.json").write_text(json.dumps({**cfg, "max_seq_length": 32}))
    e = Engine.from_dir(d, device="cpu", dtype="float32", cpu_runtimes=[OnnxSettings(max_tokens=64)])
    assert e.info.max_input_length == 32
    assert e.warm() == {"onnx": {16: "ready", 32: "ready", 64: "ready"}}
    seqs = [list(range(101, 131)), list(range(201, 229))]
    mode, got = step(e, seqs)
    assert mode == "onnx"
    eager = Engine.from_dir(d, device="cpu", dtype="float32")
    assert_close_vectors(got, step(eager, seqs)[1])
