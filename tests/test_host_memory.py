"""Tulip returns the C heap's free memory after enough tokens of CPU steps
(``--malloc-trim-tokens``, tulip/src/host_memory.rs), with real processes:
the trims happen and are counted, answers after them still match
sentence-transformers, and 0 turns them off."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.conftest import corpus_lines
from tests.servers import Tulip


def _trims(tulip: Tulip) -> float:
    for line in tulip.metrics().splitlines():
        if line.startswith("tulip_malloc_trims_total "):
            return float(line.split()[1])
    raise AssertionError("tulip_malloc_trims_total is not exported")


@pytest.fixture(scope="module")
def batches(minilm_dir):
    tok = Tokenizer.from_file(f"{minilm_dir}/tokenizer.json")
    tok.no_padding()
    tok.no_truncation()
    texts = [t for t in corpus_lines("botchan.txt")[500:700] if len(tok.encode(t).ids) <= 128][:96]
    ids = [e.ids for e in tok.encode_batch(texts)]
    return texts, [ids[i:i + 32] for i in range(0, len(ids), 32)]


def test_trims_after_enough_tokens_and_answers_stay_exact(minilm_dir, log_dir, batches, st_minilm):
    texts, groups = batches
    tulip = Tulip(minilm_dir, log_dir=log_dir, malloc_trim_tokens=256)
    try:
        with tulip.client() as c:
            got = np.concatenate([c.embed(g).values for g in groups])
        assert _trims(tulip) >= len(groups) - 1, "every batch of 32 lines is over 256 tokens"
    finally:
        tulip.stop()
    want = st_minilm.encode(texts, normalize_embeddings=True)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.999


def test_zero_never_trims(minilm_dir, log_dir, batches):
    _, groups = batches
    tulip = Tulip(minilm_dir, log_dir=log_dir, malloc_trim_tokens=0)
    try:
        with tulip.client() as c:
            for g in groups:
                c.embed(g)
        assert _trims(tulip) == 0
    finally:
        tulip.stop()
