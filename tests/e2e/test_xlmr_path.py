"""The request path with an XLM-R (SentencePiece Unigram) tokenizer: Ivy in
front of a Tulip serving a tiny random-weight XLM-R embedder. Ivy's token
ids must equal Hugging Face `tokenizers` on the same tokenizer.json for
real multilingual text, and its embeddings must equal the engine's on
those ids."""

from __future__ import annotations

import numpy as np
import pytest

from bench.harness import tiny_models as models
from bench.harness.fixtures import corpus_lines
from rose import Engine
from tests.support.servers import Ivy, Tulip

pytestmark = pytest.mark.slow

TEXTS = corpus_lines("calibration_miracl.txt") + corpus_lines("calibration.txt")


@pytest.fixture(scope="module")
def xlmr(tmp_path_factory):
    return models.tiny_xlmr(tmp_path_factory.mktemp("models") / "xlmr", pooling="mean", m3_heads=False)


@pytest.fixture(scope="module")
def stack(xlmr, log_dir):
    tulip = Tulip(str(xlmr), log_dir=log_dir, threads=1)
    ivy = Ivy([tulip.url], str(xlmr), log_dir=log_dir)
    yield tulip, ivy
    ivy.stop()
    tulip.stop()


@pytest.fixture(scope="module")
def oracle(xlmr):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(xlmr / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def test_token_ids_match_hugging_face_on_multilingual_text(stack, oracle):
    _, ivy = stack
    for start in range(0, len(TEXTS), 32):
        chunk = TEXTS[start:start + 32]
        status, body = ivy.post_json("/tokenize", {"inputs": chunk, "add_special_tokens": True})
        assert status == 200, body
        for text, tokens in zip(chunk, body):
            assert [t["id"] for t in tokens] == oracle.encode(text).ids, text[:80]


def test_embeddings_equal_the_engine_on_oracle_ids(stack, oracle, xlmr):
    _, ivy = stack
    engine = Engine.from_dir(xlmr, device="cpu")
    limit = engine.info.max_input_length
    texts = TEXTS[::9]
    status, body = ivy.post_json("/v1/embeddings", {"input": texts})
    assert status == 200, body
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    ids = []
    for t in texts:
        enc = oracle.encode(t).ids
        # Truncation keeps the closing </s> (special tokens survive).
        ids.append(enc if len(enc) <= limit else enc[: limit - 1] + enc[-1:])
    want = engine.embed(ids).numpy()
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.999
