"""Long inputs embedded whole (`long_inputs: "pool"` / `"windows"`,
`--long-inputs`): overlapping windows of the model's length, each an
ordinary sequence, pooled by a token-weighted mean then normalized; checked
against the windows built here from the documented rule and embedded one by
one as token ids."""

from __future__ import annotations

import numpy as np
import pytest

from bench.harness.fixtures import corpus_lines
from tests.support.reference import hf_tokenizer
from tests.support.servers import Ivy

LONG = " ".join(corpus_lines("botchan.txt")[300:380])  # ~1,400 MiniLM tokens
SHORT = "The cat sat on the mat."
CLS, SEP, WINDOW = 101, 102, 256


def windows(tokenizer, text):
    """docs/api.md's rule: W = 256 - 2 content tokens, a stride of W - W//8."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    width = WINDOW - 2
    stride = width - width // 8
    out, start = [], 0
    while True:
        out.append([CLS, *ids[start:start + width], SEP])
        if start + width >= len(ids):
            return out
        start += stride


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return hf_tokenizer(minilm_dir)


def test_pooled_vector_is_the_weighted_mean_of_its_windows(ivy_minilm, tok):
    wins = windows(tok, LONG)
    assert len(wins) >= 4
    status, raw = ivy_minilm.post_json("/embed", {"inputs": wins, "normalize": False})
    assert status == 200, raw
    raw = np.array(raw, dtype=np.float64)
    weights = np.array([len(w) for w in wins], dtype=np.float64)
    mean = (raw * weights[:, None]).sum(0) / weights.sum()
    want = mean / np.linalg.norm(mean)
    status, got = ivy_minilm.post_json("/embed", {"inputs": [LONG, SHORT], "long_inputs": "pool"})
    assert status == 200, got
    np.testing.assert_allclose(got[0], want, atol=2e-5)
    # Not normalized when the request says so.
    status, unnorm = ivy_minilm.post_json("/embed", {"inputs": LONG, "long_inputs": "pool", "normalize": False})
    np.testing.assert_allclose(unnorm[0], mean, atol=2e-5)
    # Every window's vector when asked.
    status, every = ivy_minilm.post_json("/embed", {"inputs": [LONG, SHORT], "long_inputs": "windows",
                                                     "normalize": False})
    assert status == 200 and len(every) == 2 and len(every[0]) == len(wins) and len(every[1]) == 1
    np.testing.assert_allclose(every[0], raw, atol=2e-5)
    # Truncation (the default) sees the first window only.
    first = ivy_minilm.post_json("/embed", {"inputs": LONG})[1][0]
    assert np.dot(first, got[0]) < 0.999


def test_a_text_within_the_window_is_unchanged(ivy_minilm):
    plain = ivy_minilm.post_json("/embed", {"inputs": SHORT})[1]
    for mode in ("pool", "windows"):
        status, body = ivy_minilm.post_json("/embed", {"inputs": SHORT, "long_inputs": mode})
        assert status == 200 and np.array_equal(np.array(body).reshape(1, -1), plain), mode


def test_every_front_pools_alike(ivy_minilm):
    want = np.array(ivy_minilm.post_json("/embed", {"inputs": LONG, "long_inputs": "pool"})[1][0])
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": LONG, "long_inputs": "pool"})
    assert status == 200 and np.allclose(body["data"][0]["embedding"], want, atol=1e-6)
    status, body = ivy_minilm.post_json("/v2/embed", {"texts": [LONG], "long_inputs": "pool"})
    assert status == 200 and np.allclose(body["embeddings"]["float"][0], want, atol=1e-6)
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": LONG, "long_inputs": "windows"})
    assert status == 200 and len(body["data"][0]["embedding"]) >= 4
    # One vector per input only: windows refused, clearly.
    status, err = ivy_minilm.post_json("/v2/embed", {"texts": [LONG], "long_inputs": "windows"})
    assert status == 422 and "pool" in err["message"]
    status, err = ivy_minilm.post_json("/embed", {"inputs": LONG, "long_inputs": "all"})
    assert status == 422 and "long_inputs" in err["error"]


def test_server_default_and_token_limit_on_the_whole_input(tulip_minilm, minilm_dir, log_dir, ivy_minilm, tok):
    n = sum(len(w) for w in windows(tok, LONG))
    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, env={"IVY_LONG_INPUTS": "pool"},
              max_tokens_per_request=n + 40)
    try:
        want = ivy_minilm.post_json("/embed", {"inputs": LONG, "long_inputs": "pool"})[1]
        status, got = ivy.post_json("/embed", {"inputs": LONG})
        assert status == 200 and np.allclose(got, want, atol=1e-6)
        # Every window's tokens count against the limit.
        status, err = ivy.post_json("/embed", {"inputs": [LONG, LONG]})
        assert status == 422 and "over the limit" in err["error"], err
        status, _ = ivy.post_json("/embed", {"inputs": [LONG, LONG], "long_inputs": "truncate"})
        assert status == 200
    finally:
        ivy.stop()
