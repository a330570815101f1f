"""The request path with an XLM-R (Unigram) tokenizer: Ivy's in-house
tokenizer feeds Tulip the ids Hugging Face would, on multilingual text.

A 2-layer random-weight XLM-R embedder (real XLM-R vocabulary and
tokenizer) is served by Tulip; Ivy tokenizes; the vectors and token counts
must match sentence-transformers (which tokenizes with Hugging Face) on the
same weights. A single wrong id changes a random-weight model's vector."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import corpus_lines
from tests.models import tiny_xlmr
from tests.servers import Ivy, Tulip


@pytest.fixture(scope="module")
def xlmr_dir(tmp_path_factory):
    return tiny_xlmr(tmp_path_factory.mktemp("models") / "xlmr", pooling="cls", m3_heads=False)


@pytest.fixture(scope="module")
def ivy_xlmr(xlmr_dir, log_dir):
    tulip = Tulip(str(xlmr_dir), log_dir=log_dir)
    ivy = Ivy([tulip.url], str(xlmr_dir), log_dir=log_dir, max_inputs=128, max_body_bytes=1 << 20)
    yield ivy
    ivy.stop()
    tulip.stop()


def texts() -> list[str]:
    """Every language of the multilingual corpus (first 300 chars of two
    passages each) plus the adversarial lines (controls, zero-width and
    unassigned code points, special-token strings, long repeats)."""
    miracl = [line[:300] for line in corpus_lines("calibration_miracl.txt")[::10]]
    hostile = [line for line in corpus_lines("calibration.txt") if line.strip()][:40]
    return miracl + hostile + ["<s> literal </s> and <mask>", "▁▁ spaced   out  ", "ﾊﾟｰﾃｨｰ ＡＢＣ ①"]


def test_xlmr_embeddings_and_token_counts_match_hugging_face(ivy_xlmr, xlmr_dir):
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    batch = texts()
    status, body = ivy_xlmr.post_json("/v1/embeddings", {"input": batch})
    assert status == 200, body
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float64)

    st = SentenceTransformer(str(xlmr_dir), device="cpu")
    want = st.encode(batch, convert_to_numpy=True, normalize_embeddings=True).astype(np.float64)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.999, [batch[i] for i in np.argsort(cos)[:3]]

    hf = Tokenizer.from_file(str(xlmr_dir / "tokenizer.json"))
    expected_tokens = sum(len(e.ids) for e in hf.encode_batch(batch))
    assert body["usage"]["prompt_tokens"] == expected_tokens
