"""Outputs beyond embeddings on the wire: a sequence classifier's logits
(CLASSIFY, label names in Info) and SPLADE's vocabulary weights (SPARSE
pairs), served by real processes against `transformers` and
`sentence-transformers` on the same random weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from bench.harness import tiny_models as models
from tests.support.reference import cross_encoder_logits
from tests.support.servers import Ivy, Tulip

TEXTS = ["What is an embedding?", "A vector that captures the meaning of a text.",
         "Search engines rank documents by the similarity of their vectors to the query's vector.", "a"]
LABELS = ("no", "yes", "maybe")


CLASSIFIERS = {
    "bert": lambda d: models.tiny_reranker(d, arch="bert", labels=LABELS),
    "deberta-v2": lambda d: models.tiny_deberta_v2(d, seed=18, labels=LABELS),
}


@pytest.mark.parametrize("arch", sorted(CLASSIFIERS))
def test_a_classifier_serves_one_logit_per_label(arch, tmp_path, log_dir):
    model_dir = CLASSIFIERS[arch](tmp_path / "classifier")
    tok = tokenizer_of(model_dir)
    encodings = [tok.encode(t) for t in TEXTS]
    pair = tok.encode(TEXTS[0], TEXTS[1])
    want = cross_encoder_logits(model_dir, [e.ids for e in encodings + [pair]],
                                [e.type_ids for e in encodings + [pair]], all_labels=True)
    tulip = Tulip(str(model_dir), log_dir=log_dir, threads=1)
    try:
        with tulip.client() as c:
            info = c.info()
            assert list(info.labels) == list(LABELS)
            assert c.pb2.OUTPUT_KIND_CLASSIFY in info.kinds
            got = c.embed([e.ids for e in encodings], kind="classify").values
            with pytest.raises(Exception) as e:
                c.embed([encodings[0].ids], kind="dense")
            assert "does not produce dense" in str(e.value)
        ivy = Ivy([tulip.url], tokenizer=False, log_dir=log_dir)
        try:
            single = ivy.post_json("/predict", {"inputs": TEXTS[0]})
            batch = ivy.post_json("/predict", {"inputs": TEXTS})
            pairs = ivy.post_json("/predict", {"inputs": [[TEXTS[0], TEXTS[1]]], "raw_scores": True})
            info = ivy.get("/info")
            grpc_texts, grpc_pair = predict_over_grpc(ivy)
        finally:
            ivy.stop()
    finally:
        tulip.stop()
    assert got.shape == (len(TEXTS), len(LABELS))
    np.testing.assert_allclose(got, want[:len(TEXTS)].numpy(), atol=1e-4)
    # Through Ivy, TEI's /predict: labels best first, softmax unless raw.
    probs = torch.softmax(want, dim=-1).numpy()

    def as_dict(preds):
        scores = [p["score"] for p in preds]
        assert scores == sorted(scores, reverse=True)
        return {p["label"]: p["score"] for p in preds}

    assert single[0] == 200 and batch[0] == 200 and pairs[0] == 200, (single, batch, pairs)
    for i, preds in enumerate([single[1]] + batch[1]):
        row = 0 if i == 0 else i - 1
        got_row = as_dict(preds)
        np.testing.assert_allclose([got_row[label] for label in LABELS], probs[row], atol=1e-4)
    (pair_preds,) = pairs[1]
    np.testing.assert_allclose([as_dict(pair_preds)[label] for label in LABELS], want[-1].numpy(), atol=1e-4)
    model_type = json.loads(info[1])["model_type"]
    assert model_type == {"classifier": {"id2label": {"0": "no", "1": "yes", "2": "maybe"},
                                         "label2id": {"no": 0, "yes": 1, "maybe": 2}}}
    # The same through ivy.v1's Predict.
    for preds, row in zip(grpc_texts.results, probs[:len(TEXTS)]):
        got_row = {p.label: p.score for p in preds.predictions}
        assert [p.score for p in preds.predictions] == sorted(got_row.values(), reverse=True)
        np.testing.assert_allclose([got_row[label] for label in LABELS], row, atol=1e-4)
    (pair_row,) = grpc_pair.results
    np.testing.assert_allclose([{p.label: p.score for p in pair_row.predictions}[label] for label in LABELS],
                               want[-1].numpy(), atol=1e-4)


def test_a_deberta_cross_encoder_reranks_through_ivy(tmp_path, log_dir):
    """A one-label DebertaV2ForSequenceClassification (mxbai-rerank style)
    serves as a score model: gRPC SCORE logits and Ivy's /rerank raw scores
    within 1e-3 of transformers on the same (query, document) pairs."""
    model_dir = models.tiny_deberta_v2(tmp_path / "deberta-rerank", seed=19)
    query = "what is an embedding"
    pairs = [tokenizer_of(model_dir).encode(query, t) for t in TEXTS]
    want = cross_encoder_logits(model_dir, [p.ids for p in pairs], [p.type_ids for p in pairs])
    assert want.std() > 1e-2, "scores must differ between documents for the check to mean anything"
    tulip = Tulip(str(model_dir), log_dir=log_dir, threads=1)
    try:
        with tulip.client() as c:
            assert list(c.info().kinds) == [c.pb2.OUTPUT_KIND_SCORE]
            got = c.embed([p.ids for p in pairs], kind="score", raw_scores=True).values[:, 0]
        ivy = Ivy([tulip.url], tokenizer=False, log_dir=log_dir)
        try:
            status, body = ivy.post_json("/rerank", {"query": query, "texts": TEXTS, "raw_scores": True})
        finally:
            ivy.stop()
    finally:
        tulip.stop()
    np.testing.assert_allclose(got, want.numpy(), atol=1e-3)
    assert status == 200, body
    assert [r["index"] for r in body] == list(np.argsort(-want.numpy(), kind="stable"))
    np.testing.assert_allclose([r["score"] for r in sorted(body, key=lambda r: r["index"])], want.numpy(), atol=1e-3)


def predict_over_grpc(ivy):
    """ivy.v1 Predict: the texts, then the first two as a pair (raw)."""
    import grpc

    from tulip.client import load_stubs

    pb2, pb2_grpc = load_stubs("ivy")
    with grpc.insecure_channel(ivy.grpc_target) as channel:
        stub = pb2_grpc.IvyStub(channel)
        texts = stub.Predict(pb2.PredictRequest(inputs=[pb2.PredictInput(text=t) for t in TEXTS]), timeout=30)
        pair = stub.Predict(pb2.PredictRequest(inputs=[pb2.PredictInput(text=TEXTS[0], text_pair=TEXTS[1])],
                                               raw_scores=True), timeout=30)
        with pytest.raises(grpc.RpcError) as e:
            stub.Predict(pb2.PredictRequest(inputs=[pb2.PredictInput(text="a", text_pair="b"),
                                                    pb2.PredictInput(text="c")]), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return texts, pair


def tokenizer_of(model_dir) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest.mark.parametrize("arch", ["bert", "xlm-roberta"])
def test_splade_weights_through_ivy_match_sentence_transformers(arch, tmp_path, log_dir):
    from sentence_transformers import SparseEncoder

    model_dir = models.tiny_splade(tmp_path / arch, arch=arch)
    want = SparseEncoder(str(model_dir), device="cpu").encode(TEXTS, convert_to_tensor=True).to_dense().float()
    tulip = Tulip(str(model_dir), log_dir=log_dir, threads=1)
    try:
        ivy = Ivy([tulip.url], tokenizer=False, log_dir=log_dir)
        try:
            status, body = ivy.post_json("/embed_sparse", {"inputs": TEXTS})
        finally:
            ivy.stop()
    finally:
        tulip.stop()
    assert status == 200, body
    got = torch.zeros_like(want)
    for row, pairs in enumerate(body):
        indices = [p["index"] for p in pairs]
        assert indices == sorted(indices) and all(p["value"] > 0 for p in pairs)
        for p in pairs:
            got[row, p["index"]] = p["value"]
    cos = torch.nn.functional.cosine_similarity(got.double(), want.double())
    assert cos.min() >= 0.999, cos
    # The same vocabulary entries carry weight (tiny ones may round to zero).
    strong = want > 1e-3 * want.max()
    assert torch.equal(strong, strong & (got > 0))


def test_qwen3_reranker_through_ivy_rerank_uses_the_models_prompt(tmp_path, log_dir):
    """Ivy writes each (query, document) pair into Qwen3-Reranker's prompt
    (the template Tulip's Info carries) and the scores equal
    logit(yes) - logit(no) of transformers' Qwen3ForCausalLM on the model
    card's formatting."""
    from transformers import AutoModelForCausalLM

    from rose.config import ModelSpec
    from tests.support.reference import qwen3_rerank_ids

    model_dir = models.tiny_qwen3_reranker(tmp_path / "qwen3-rerank", seed=9)
    query = "what is the capital of france"
    seqs = qwen3_rerank_ids(model_dir, query, TEXTS)
    yes, no = ModelSpec.from_dir(model_dir).score_tokens
    lm = AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    with torch.inference_mode():
        last = torch.stack([lm(input_ids=torch.tensor([s])).logits[0, -1] for s in seqs])
    want = (last[:, yes] - last[:, no]).numpy()
    assert want.std() > 1e-2, "scores must differ between documents for the check to mean anything"
    tulip = Tulip(str(model_dir), log_dir=log_dir, threads=1)
    try:
        ivy = Ivy([tulip.url], tokenizer=False, log_dir=log_dir)
        try:
            status, body = ivy.post_json("/rerank", {"query": query, "texts": TEXTS, "raw_scores": True})
            too_long = ivy.post_json("/rerank", {"query": query, "texts": ["word " * 9000], "truncate": False})
        finally:
            ivy.stop()
    finally:
        tulip.stop()
    assert status == 200, body
    got = np.zeros(len(TEXTS), dtype=np.float32)
    for r in body:
        got[r["index"]] = r["score"]
    np.testing.assert_allclose(got, want, atol=1e-3)
    assert too_long[0] == 422 and "prompt" in too_long[1]["error"], too_long
