"""End to end through real processes: HTTP → Ivy → gRPC → Tulip → ROSE,
compared with sentence-transformers on the same model."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bench.harness.fixtures import corpus_lines
from tests.support import http
from tests.support.vectors import cosines


def texts_mixed() -> list[str]:
    """60 real lines: multilingual passages (long, truncated at 256 tokens)
    and short English prose."""
    miracl = corpus_lines("calibration_miracl.txt")[::12][:30]
    botchan = [line for line in corpus_lines("botchan.txt")[200:] if len(line) > 3][:30]
    texts = miracl + botchan
    assert len(texts) >= 50
    return texts


def embed(ivy, texts, **extra) -> np.ndarray:
    return http.embed(ivy, texts, model="sentence-transformers/all-MiniLM-L6-v2", **extra)


@pytest.fixture(scope="module")
def reference(st_minilm):
    texts = texts_mixed()
    return texts, st_minilm.encode(texts, convert_to_numpy=True, normalize_embeddings=True)


def test_batch_matches_sentence_transformers(ivy_minilm, reference):
    texts, ref = reference
    got = embed(ivy_minilm, texts)
    assert got.shape == (len(texts), 384)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    assert cosines(got, ref).min() >= 0.999


def test_one_by_one_matches_sentence_transformers(ivy_minilm, reference):
    texts, ref = reference
    got = np.concatenate([embed(ivy_minilm, t) for t in texts])
    assert cosines(got, ref).min() >= 0.999


def test_concurrent_requests_get_their_own_vectors(ivy_minilm, reference):
    texts, ref = reference
    picks = list(range(32))

    def one(i: int) -> np.ndarray:
        return embed(ivy_minilm, [texts[i], texts[(i + 7) % len(texts)]])

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, picks))
    for i, got in zip(picks, results):
        want = ref[[i, (i + 7) % len(texts)]]
        assert cosines(got, want).min() >= 0.999, f"request {i} got another request's vectors"


def test_usage_counts_prompt_tokens(ivy_minilm, st_minilm):
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": ["hello world", "a"]})
    assert status == 200
    # [CLS] hello world [SEP] + [CLS] a [SEP]
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert body["object"] == "list" and body["model"] == "sentence-transformers/all-MiniLM-L6-v2"


def test_dimensions_truncate_then_renormalise(ivy_minilm):
    full = embed(ivy_minilm, ["matryoshka dolls nest inside each other"])[0]
    short = embed(ivy_minilm, ["matryoshka dolls nest inside each other"], dimensions=64)[0]
    assert short.shape == (64,)
    assert np.isclose(np.linalg.norm(short), 1.0, atol=1e-5)
    want = full[:64] / np.linalg.norm(full[:64])
    assert np.allclose(short, want, atol=1e-5)


def test_base64_encoding_is_little_endian_float32(ivy_minilm):
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": "base64 please", "encoding_format": "base64"})
    assert status == 200
    vec = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(vec, embed(ivy_minilm, "base64 please")[0], atol=1e-6)


def test_long_input_is_truncated_like_sentence_transformers(ivy_minilm, st_minilm):
    text = " ".join(corpus_lines("botchan.txt")[300:420])  # thousands of tokens
    got = embed(ivy_minilm, [text])
    ref = st_minilm.encode([text], normalize_embeddings=True)
    assert cosines(got, ref).min() >= 0.999


def test_token_id_inputs(ivy_minilm, st_minilm):
    ids = st_minilm.tokenizer("token ids work too")["input_ids"]
    from_ids = embed(ivy_minilm, [ids])
    from_text = embed(ivy_minilm, ["token ids work too"])
    assert np.allclose(from_ids, from_text, atol=1e-6)


def test_info_health_ready(ivy_minilm):
    assert ivy_minilm.get("/health")[0] == 200
    assert ivy_minilm.get("/ready")[0] == 200
    status, _, body = ivy_minilm.request("GET", "/info")
    import json

    info = json.loads(body)
    assert status == 200
    assert info["max_input_length"] == 256 and info["dimension"] == 384
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
