"""Sparse, multi-vector and rerank outputs end to end: Ivy in front of two
Tulip replicas serving tiny random-weight models (a BGE-M3-style XLM-R
embedder with sparse and multi-vector heads, and an XLM-R cross-encoder).
Chunks are cut small so every request spans both replicas; Ivy's answers
(HTTP and gRPC) must equal the replicas' own output for the same token ids
from the Hugging Face tokenizer."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from bench.harness import tiny_models as models
from bench.harness.fixtures import corpus_lines
from tests.support.reference import hf_tokenizer
from tests.support.servers import Ivy, start_tulips
from tulip.client import load_stubs

pytestmark = pytest.mark.slow

TEXTS = corpus_lines("calibration_miracl.txt")[:10:2] + ["short query", "another one"]
QUERY = "what is the capital of France?"


@pytest.fixture(scope="module")
def m3(tmp_path_factory, log_dir):
    model = models.tiny_xlmr(tmp_path_factory.mktemp("models") / "m3")
    replicas = start_tulips(2, str(model), log_dir=log_dir, threads=1)
    ivy = Ivy([t.url for t in replicas], str(model), log_dir=log_dir, chunk_tokens=64)
    ids = [e.ids for e in hf_tokenizer(model).encode_batch(TEXTS)]
    yield ivy, replicas[0], ids
    ivy.stop()
    for t in replicas:
        t.stop()


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, log_dir):
    model = models.tiny_reranker(tmp_path_factory.mktemp("models") / "rerank", arch="xlm-roberta")
    replicas = start_tulips(2, str(model), log_dir=log_dir, threads=1)
    ivy = Ivy([t.url for t in replicas], str(model), log_dir=log_dir, chunk_tokens=96)
    yield ivy, replicas[0], model
    ivy.stop()
    for t in replicas:
        t.stop()


def grpc_stub(ivy):
    pb2, pb2_grpc = load_stubs("ivy")
    channel = grpc.insecure_channel(ivy.grpc_target)
    return pb2, pb2_grpc.IvyStub(channel), channel


def test_sparse_weights_match_the_replica(m3):
    ivy, tulip, ids = m3
    status, body = ivy.post_json("/embed_sparse", {"inputs": TEXTS, "truncate": True})
    assert status == 200, body
    with tulip.client() as c:
        want = c.embed(ids, kind="sparse").values
    assert len(body) == len(TEXTS)
    for got, ref in zip(body, want):
        assert [v["index"] for v in got] == sorted(ref)
        assert np.allclose([v["value"] for v in got], [ref[k] for k in sorted(ref)], atol=1e-5)
    pb2, stub, channel = grpc_stub(ivy)
    with channel:
        reply = stub.EmbedSparse(pb2.EmbedRequest(inputs=TEXTS, truncate=True), timeout=60)
    for got, ref in zip(reply.embeddings, body):
        assert list(got.indices) == [v["index"] for v in ref]
        assert np.allclose(got.values, [v["value"] for v in ref], atol=1e-6)


def test_multi_vectors_match_the_replica(m3):
    ivy, tulip, ids = m3
    status, body = ivy.post_json("/embed_all", {"inputs": TEXTS})
    assert status == 200, body
    with tulip.client() as c:
        want = c.embed(ids, kind="multi_vector").values
    for got, ref in zip(body, want):
        assert np.allclose(np.array(got, dtype=np.float32), ref, atol=1e-5)
    pb2, stub, channel = grpc_stub(ivy)
    with channel:
        reply = stub.EmbedAll(pb2.EmbedRequest(inputs=TEXTS), timeout=60)
    data = np.frombuffer(reply.data, dtype="<f4").reshape(-1, reply.dim)
    assert list(reply.row_counts) == [len(r) for r in want]
    assert np.allclose(data, np.concatenate(want), atol=1e-5)


def test_dense_and_info_on_the_m3_model(m3):
    ivy, tulip, ids = m3
    status, body = ivy.post_json("/embed", {"inputs": TEXTS})
    assert status == 200
    with tulip.client() as c:
        want = c.embed(ids).values
    assert np.allclose(np.array(body, dtype=np.float32), want, atol=1e-5)
    status, info = ivy.request("GET", "/info")[0], ivy.get("/info")[1]
    assert status == 200 and b'"sparse"' in info and b'"multi_vector"' in info
    assert ivy.post_json("/rerank", {"query": "q", "texts": ["t"]})[0] == 424


def test_rerank_matches_the_replica_best_first(reranker):
    ivy, tulip, model = reranker
    pairs = [e.ids for e in hf_tokenizer(model).encode_batch([(QUERY, t) for t in TEXTS])]
    with tulip.client() as c:
        want = c.embed(pairs, kind="score").values[:, 0]
        raw = c.embed(pairs, kind="score", raw_scores=True).values[:, 0]
    status, body = ivy.post_json("/rerank", {"query": QUERY, "texts": TEXTS, "return_text": True})
    assert status == 200, body
    assert [r["index"] for r in body] == list(np.argsort(-want, kind="stable"))
    for r in body:
        assert np.isclose(r["score"], want[r["index"]], atol=1e-5)
        assert r["text"] == TEXTS[r["index"]]
    status, body = ivy.post_json("/rerank", {"query": QUERY, "texts": TEXTS, "raw_scores": True})
    assert status == 200 and all("text" not in r for r in body)
    assert np.allclose(sorted(r["score"] for r in body), sorted(raw), atol=1e-5)
    pb2, stub, channel = grpc_stub(ivy)
    with channel:
        reply = stub.Rerank(pb2.RerankRequest(query=QUERY, texts=TEXTS), timeout=60)
    assert [r.index for r in reply.ranks] == [r["index"] for r in sorted(body, key=lambda r: -r["score"])]


def test_rerank_truncation(reranker):
    ivy, tulip, model = reranker
    long_text = " ".join(corpus_lines("calibration_miracl.txt")[:20])
    status, body = ivy.post_json("/rerank", {"query": QUERY, "texts": [long_text], "truncate": False})
    assert status == 422 and body["error_type"] == "Validation" and "at most 512" in body["error"]
    status, body = ivy.post_json("/rerank", {"query": QUERY, "texts": [long_text, "short"], "truncate": True})
    assert status == 200, body
    pairs = [e.ids for e in hf_tokenizer(model, 512).encode_batch([(QUERY, long_text), (QUERY, "short")])]
    with tulip.client() as c:
        want = c.embed(pairs, kind="score").values[:, 0]
    got = {r["index"]: r["score"] for r in body}
    assert np.allclose([got[0], got[1]], want, atol=1e-5)


def test_reranker_info_and_refusals(reranker):
    ivy, _, _ = reranker
    status, info = ivy.get("/info")
    assert status == 200 and b'"reranker"' in info
    status, body = ivy.post_json("/embed", {"inputs": "x"})
    assert status == 424 and body["error_type"] == "Backend"
    # No per-token states from a cross-encoder (TEI's /embed_all is for
    # embedding models).
    status, body = ivy.post_json("/embed_all", {"inputs": "x"})
    assert status == 424 and "does not produce token_states" in body["error"], body
    status, body = ivy.post_json("/rerank", {"query": "", "texts": ["t"]})
    assert status == 422 and "`query` is an empty string" in body["error"]


def test_cohere_shaped_rerank(reranker):
    """/v1/rerank (and /rerank given `documents`) in the Cohere/Jina shape:
    results best first with relevance_score, top_n, return_documents,
    {text} documents, usage, and OpenAI-shaped errors."""
    ivy, tulip, model = reranker
    pairs = [e.ids for e in hf_tokenizer(model).encode_batch([(QUERY, t) for t in TEXTS])]
    with tulip.client() as c:
        want = c.embed(pairs, kind="score").values[:, 0]
    order = [int(i) for i in np.argsort(-want, kind="stable")]
    status, body = ivy.post_json("/v1/rerank", {"query": QUERY, "documents": TEXTS, "top_n": 2,
                                                "return_documents": True})
    assert status == 200, body
    assert [r["index"] for r in body["results"]] == order[:2]
    for r in body["results"]:
        assert np.isclose(r["relevance_score"], want[r["index"]], atol=1e-5)
        assert r["document"] == {"text": TEXTS[r["index"]]}
    assert body["usage"]["total_tokens"] == sum(len(p) for p in pairs)
    status, body = ivy.post_json("/rerank", {"query": QUERY, "documents": [{"text": t} for t in TEXTS]})
    assert status == 200, body
    assert [r["index"] for r in body["results"]] == order
    assert all("document" not in r for r in body["results"])
    status, body = ivy.post_json("/v1/rerank", {"model": "another-model", "query": QUERY, "documents": TEXTS})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    for bad in ({"query": QUERY, "documents": [1]}, {"query": QUERY, "documents": TEXTS, "top_n": 0},
                {"query": QUERY, "documents": "one string"}):
        status, body = ivy.post_json("/v1/rerank", bad)
        assert status == 422 and body["error"]["param"] in ("documents", "top_n"), body
