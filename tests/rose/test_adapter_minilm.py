"""A real LoRA adapter, trained here on the embedded all-MiniLM-L6-v2
(``tests/data/adapters/minilm-halves``, made by ``python -m
bench.harness.lora_adapters``): ROSE serves it as PEFT's merged model
computes it, and it does what it was trained for."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from bench.harness.fixtures import DATA  # noqa: E402
from bench.harness.lora_adapters import halves, merged_st  # noqa: E402
from rose import Engine  # noqa: E402
from tests.support.reference import assert_close_vectors, st_inputs  # noqa: E402

ADAPTER = DATA / "adapters" / "minilm-halves"


@pytest.fixture(scope="module")
def served(minilm_dir):
    e = Engine.from_dir(minilm_dir, device="cpu", dtype="float32")
    e.load_adapter("halves", ADAPTER)
    return e


def test_matches_peft_merged(served, minilm_dir, texts):
    st = merged_st(minilm_dir, ADAPTER)
    pairs = halves()
    texts = texts + [t for p in pairs for t in p]
    want = st.encode(texts, convert_to_tensor=True).float()
    seqs = st_inputs(st, texts)
    assert_close_vectors(served.embed(seqs, adapters=["halves"] * len(seqs)), want)
    (info,) = served.adapters()
    assert (info.rank, info.layers, info.targets) == (4, 6, ("attention.self.query", "attention.self.value"))


def test_pairs_what_it_was_trained_to(served, minilm_dir):
    """Each passage's first half finds its second half among the 16: the
    adapter gets them all, the base model does not, by a wider margin."""
    pairs = halves()
    seqs = st_inputs(merged_st(minilm_dir), [t for p in pairs for t in p])
    results = {}
    for name in (None, "halves"):
        v = served.embed(seqs, adapters=[name] * len(seqs))
        sim = v[0::2] @ v[1::2].T
        top = (sim.argmax(1) == torch.arange(len(pairs))).float().mean().item()
        margin = (sim.diag() - (sim - 9 * torch.eye(len(pairs))).max(1).values).mean().item()
        results[name] = (top, margin)
    assert results["halves"][0] == 1.0 > results[None][0]
    assert results["halves"][1] > results[None][1] + 0.2
