"""The flat token axis: a mixed-length batch (lengths 1 to 512, 18
sequences) gives each sequence exactly what it gets alone (fp32, <= 1e-5
max abs), for every family and output, with every attention backend
available on this machine."""

from __future__ import annotations

import pytest
import torch

from rose import Engine
from rose.attention import available_backends

LENGTHS = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 512, 7, 100, 300, 450]
BACKENDS = sorted(available_backends("cpu"))

CASES = [  # (model fixture, output kind, longest length the model takes)
    ("bert_dir", "dense", 256),
    ("xlmr_dir", "dense", 512),
    ("xlmr_dir", "sparse", 512),
    ("xlmr_dir", "multi_vector", 512),
    ("reranker_xlmr_dir", "score", 512),
    ("reranker_bert_dir", "score", 512),
    ("qwen3_dir", "dense", 512),
    ("bidir_dir", "dense", 512),
]


def random_sequences(vocab: int, cap: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for n in LENGTHS:
        n = min(n, cap)
        ids = torch.randint(4, min(vocab, 30000), (n,), generator=g)
        ids[0] = 0 if n > 1 else ids[0]
        seqs.append(ids.tolist())
    # Separators inside, so BERT pairs get a second segment.
    for s in seqs[5:]:
        s[len(s) // 2] = 102
    return seqs


def split_rows(out: torch.Tensor, seqs: list[list[int]], kind: str) -> list[torch.Tensor]:
    rows = {"dense": lambda n: 1, "score": lambda n: 1, "sparse": lambda n: n, "multi_vector": lambda n: n - 1}[kind]
    parts, start = [], 0
    for s in seqs:
        parts.append(out[start:start + rows(len(s))])
        start += rows(len(s))
    assert start == out.shape[0]
    return parts


@pytest.fixture(scope="module")
def engines(request):
    cache: dict = {}

    def get(fixture: str, backend: str) -> Engine:
        key = (fixture, backend)
        if key not in cache:
            cache[key] = Engine.from_dir(request.getfixturevalue(fixture), device="cpu", dtype="float32",
                                         attention=backend)
        return cache[key]

    return get


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fixture,kind,cap", CASES)
def test_batch_equals_each_alone(engines, fixture, kind, cap, backend):
    e = engines(fixture, backend)
    seqs = random_sequences(e.info.vocab_size, cap)
    assert len(seqs) >= 16 and min(map(len, seqs)) == 1 and max(map(len, seqs)) == cap
    batch = split_rows(e.embed(seqs, kind=kind), seqs, kind)
    for i, s in enumerate(seqs):
        alone = e.embed([s], kind=kind)
        assert batch[i].shape == alone.shape
        if alone.numel():
            diff = (batch[i] - alone).abs().max().item()
            assert diff <= 1e-5, f"sequence {i} (length {len(s)}): max abs diff {diff:.2e}"


@pytest.mark.parametrize("fixture,kind", [("xlmr_dir", "dense"), ("qwen3_dir", "dense")])
def test_backends_agree_on_models(engines, fixture, kind):
    """Whole models give the same outputs whichever backend attends."""
    seqs = random_sequences(250002, 512, seed=1)
    outs = {b: engines(fixture, b).embed(seqs, kind=kind) for b in BACKENDS}
    ref = outs["sdpa"]
    for b, out in outs.items():
        assert (out - ref).abs().max().item() <= 1e-5, b


def test_pplx_int8_batch_equals_alone_up_to_rounding(pplx_dir):
    """With the int8 mapping, float noise can only flip a rounding."""
    e = Engine.from_dir(pplx_dir, device="cpu", dtype="float32")
    seqs = random_sequences(e.info.vocab_size, 512, seed=2)
    batch = e.embed(seqs)
    alone = torch.cat([e.embed([s]) for s in seqs])
    diff = (batch - alone).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01


@pytest.mark.parametrize("fixture,kind,cap", CASES)
def test_static_buffers_with_filler_equal_eager(engines, request, fixture, kind, cap):
    """The graph path pads each batch with a filler segment: every family
    and output kind must give the real rows exactly as the eager path
    (with a capture-safe backend, as graphs need)."""
    backend = "sdpa_padded"
    static = Engine.from_dir(request.getfixturevalue(fixture), device="cpu", dtype="float32",
                             attention=backend, static_on_cpu=True)
    eager = engines(fixture, backend)
    seqs = random_sequences(eager.info.vocab_size, min(cap, 200), seed=3)[:9]
    want = eager.embed(seqs, kind=kind)
    for _ in range(3):  # warm-up, "capture", replay: the same buffers each time
        got = static.embed(seqs, kind=kind)
        assert got.shape == want.shape
        assert (got - want).abs().max().item() <= 1e-5
    assert sum(static.runner.stats.steps[a] for a in ("warmup", "capture", "replay")) == 3
