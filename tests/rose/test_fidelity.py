"""Fidelity gate: every family and output ROSE serves, against
``transformers`` on the same weights (CPU, fp32). Dense, multi-vector and
score outputs: cosine >= 0.999 per vector; sparse weights: the same token
ids, values within 1e-3 relative."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rose import Engine
from tests.support import reference as ref
from tests.support.reference import assert_close_vectors

from .conftest import tokenize

COS = 0.999


def engine(model_dir, **kw) -> Engine:
    return Engine.from_dir(model_dir, device="cpu", dtype="float32", **kw)


def test_minilm_matches_sentence_transformers(minilm_dir, st_minilm, texts):
    feats = st_minilm.tokenize(texts)
    seqs = [ids[m.bool()].tolist() for ids, m in zip(feats["input_ids"], feats["attention_mask"])]
    want = st_minilm.encode(texts, convert_to_tensor=True, normalize_embeddings=False)
    e = engine(minilm_dir)
    assert (e.info.pooling, e.info.normalize_default, e.info.max_input_length) == ("mean", True, 256)
    assert_close_vectors(e.embed(seqs), want.float())


@pytest.mark.parametrize("fixture,pooling", [("bert_dir", "mean"), ("bert_cls_dir", "cls")])
def test_bert_dense(request, fixture, pooling, texts):
    model_dir = request.getfixturevalue(fixture)
    seqs = tokenize(model_dir, texts)
    e = engine(model_dir)
    assert e.info.pooling == pooling and e.info.kinds == ("dense",)
    want = torch.stack([F.normalize(ref.pool(h, pooling), dim=0) for h in ref.encoder_hidden(model_dir, seqs)])
    assert_close_vectors(e.embed(seqs), want)


def test_bert_dense_matches_sentence_transformers(bert_cls_dir, texts):
    """The sentence-transformers files are read as sentence-transformers
    reads them (CLS pooling, normalisation)."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(bert_cls_dir), device="cpu")
    feats = st.tokenize(texts)
    seqs = [ids[m.bool()].tolist() for ids, m in zip(feats["input_ids"], feats["attention_mask"])]
    assert_close_vectors(engine(bert_cls_dir).embed(seqs), st.encode(texts, convert_to_tensor=True).float())


@pytest.mark.parametrize("fixture,pooling", [("xlmr_dir", "cls"), ("e5_dir", "mean")])
def test_xlmr_dense(request, fixture, pooling, texts):
    model_dir = request.getfixturevalue(fixture)
    seqs = tokenize(model_dir, texts)
    e = engine(model_dir)
    assert e.info.pooling == pooling
    want = torch.stack([F.normalize(ref.pool(h, pooling), dim=0) for h in ref.encoder_hidden(model_dir, seqs)])
    assert_close_vectors(e.embed(seqs), want)


def test_xlmr_without_heads_is_dense_only(e5_dir):
    assert engine(e5_dir).info.kinds == ("dense",)


def _fold_sparse(weights: torch.Tensor, seqs: list[list[int]]) -> list[dict[int, float]]:
    """Per-token weights → {id: max weight} per sequence, as the host does."""
    out, start = [], 0
    for s in seqs:
        d: dict[int, float] = {}
        for i, w in zip(s, weights[start:start + len(s), 0].tolist()):
            if w > 0 and w > d.get(i, 0.0):
                d[i] = w
        out.append(d)
        start += len(s)
    return out


def test_m3_sparse(xlmr_dir, texts):
    seqs = tokenize(xlmr_dir, texts) + [[0, 3, 9725, 3, 9725, 1, 2]]  # <unk>, <pad>, a repeated id
    e = engine(xlmr_dir)
    assert set(e.info.kinds) == {"dense", "sparse", "multi_vector"}
    weights = e.embed(seqs, kind="sparse")
    assert weights.shape == (sum(map(len, seqs)), 1)
    head = torch.load(xlmr_dir / "sparse_linear.pt", weights_only=True)
    hidden = ref.encoder_hidden(xlmr_dir, seqs)
    got = _fold_sparse(weights, seqs)
    for i, (h, s) in enumerate(zip(hidden, seqs)):
        want = ref.m3_sparse(h, s, head, unused={0, 1, 2, 3})
        assert set(got[i]) == set(want), f"sequence {i}: ids differ"
        for tid, w in want.items():
            assert abs(got[i][tid] - w) <= 1e-3 * abs(w), f"sequence {i}, id {tid}: {got[i][tid]} vs {w}"
    assert any(got), "no token got a weight: the check would be vacuous"


def test_m3_multi_vector(xlmr_dir, texts):
    seqs = tokenize(xlmr_dir, texts) + [[0]]  # one token: no vectors
    e = engine(xlmr_dir)
    assert e.info.multi_vector_dimension == 32
    rows = e.embed(seqs, kind="multi_vector")
    assert rows.shape == (sum(len(s) - 1 for s in seqs), 32)
    assert torch.allclose(rows.norm(dim=1), torch.ones(rows.shape[0]), atol=1e-5)
    head = torch.load(xlmr_dir / "colbert_linear.pt", weights_only=True)
    want = torch.cat([ref.m3_colbert(h, head) for h in ref.encoder_hidden(xlmr_dir, seqs)])
    assert_close_vectors(rows, want)


@pytest.mark.parametrize("fixture", ["reranker_bert_dir", "reranker_xlmr_dir"])
def test_cross_encoder_scores(request, fixture, texts):
    from tokenizers import Tokenizer

    model_dir = request.getfixturevalue(fixture)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(256)
    queries = ["what is the capital of france", "Wie hoch ist der Berg?", "a"] * 6
    encs = tok.encode_batch(list(zip(queries, texts[: len(queries)])))
    seqs, types = [e.ids for e in encs], [e.type_ids for e in encs]
    if "bert" in fixture:
        assert any(1 in t for t in types), "the BERT pair encoding must mark the second segment"
    e = engine(model_dir)
    assert e.info.kinds == ("score",)
    got = e.embed(seqs, kind="score")
    logits = ref.cross_encoder_logits(model_dir, seqs, types)
    assert_close_vectors(got[:, :1].T, logits.unsqueeze(0))  # cosine over the score vector
    assert torch.allclose(got[:, 0], logits, rtol=1e-4, atol=1e-4)
    assert torch.allclose(got[:, 1], torch.sigmoid(logits), rtol=1e-4, atol=1e-4)


def test_bert_cross_encoder_needs_token_types(reranker_bert_dir, texts):
    """The second segment's token types change the scores, so deriving them
    from the separator is what makes the scores above match."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(reranker_bert_dir / "tokenizer.json"))
    encs = tok.encode_batch([("query one", t) for t in texts[:4]])
    seqs = [e.ids for e in encs]
    with_types = ref.cross_encoder_logits(reranker_bert_dir, seqs, [e.type_ids for e in encs])
    without = ref.cross_encoder_logits(reranker_bert_dir, seqs, [[0] * len(s) for s in seqs])
    assert (with_types - without).abs().max() > 1e-3


def test_qwen3_causal_last_token(qwen3_dir, texts):
    seqs = tokenize(qwen3_dir, texts)
    assert all(s[-1] == 151643 for s in seqs), "the tokenizer appends <|endoftext|>"
    e = engine(qwen3_dir)
    assert (e.info.pooling, e.info.normalize_default) == ("last", True)
    want = torch.stack([F.normalize(h[-1], dim=0) for h in ref.qwen3_hidden(qwen3_dir, seqs, bidirectional=False)])
    assert_close_vectors(e.embed(seqs), want)


def test_qwen3_bidirectional_mean(bidir_dir, texts):
    seqs = tokenize(bidir_dir, texts)
    e = engine(bidir_dir)
    assert not e.model.causal and e.info.pooling == "mean"
    want = torch.stack([h.mean(0) for h in ref.qwen3_hidden(bidir_dir, seqs, bidirectional=True)])
    assert_close_vectors(e.embed(seqs), want)
    causal = torch.stack([h.mean(0) for h in ref.qwen3_hidden(bidir_dir, seqs, bidirectional=False)])
    cos = F.cosine_similarity(e.embed(seqs), causal, dim=-1)
    assert cos.min() < COS, "a causal reference must not pass: the mask has to matter"


def test_pplx_tanh_int8(pplx_dir, texts):
    seqs = tokenize(pplx_dir, texts)
    e = engine(pplx_dir)
    assert (e.info.pooling, e.info.normalize_default) == ("mean", False)
    got = e.embed(seqs)
    want = torch.stack([torch.round(127 * torch.tanh(h.mean(0)))
                        for h in ref.qwen3_hidden(pplx_dir, seqs, bidirectional=True)])
    assert torch.equal(got, got.round()) and got.abs().max() <= 127
    assert_close_vectors(got, want)
    assert (got - want).abs().max() <= 1, "values may differ only where rounding falls either way"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fixture,kind", [
    ("bert_dir", "dense"), ("xlmr_dir", "sparse"), ("xlmr_dir", "multi_vector"),
    ("reranker_xlmr_dir", "score"), ("qwen3_dir", "dense"),
])
def test_half_precision_tracks_fp32(request, fixture, kind, dtype, texts):
    model_dir = request.getfixturevalue(fixture)
    seqs = tokenize(model_dir, texts[:6])
    full = Engine.from_dir(model_dir, device="cpu", dtype="float32").embed(seqs, kind=kind)
    half = Engine.from_dir(model_dir, device="cpu", dtype=dtype)
    assert half.info.dtype == dtype
    got = half.embed(seqs, kind=kind)
    if kind == "sparse":
        assert torch.allclose(got, full, rtol=0.05, atol=0.05)
    elif kind == "score":
        assert torch.allclose(got, full, atol=0.05)
    else:
        cos = F.cosine_similarity(got.double(), full.double(), dim=-1)
        assert cos.min() >= 0.99
