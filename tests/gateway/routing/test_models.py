"""Several models behind one Ivy (issue 29 item 1), with real processes: an
embedder, a cross-encoder and a classifier (tiny seeded models, each its own
Tulip) behind one Ivy started with the three URLs and no other flag but
``--default-model``. Ivy groups the replicas by the model each reports;
every route is answered by the pool of the model it names (the default
model when it names none), equal to that model's reference; a model that
cannot serve a route, or one not served, gets the existing 4xx naming it;
one pool's Tulip killed, the others keep serving. One Ivy and three Tulips
serve the whole module; the kill runs last."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.harness import tiny_models as models
from tests.support import reference as ref
from tests.support.servers import Ivy, Tulip, wait_for

pytestmark = pytest.mark.slow

EMBEDDER, RERANKER, CLASSIFIER = "org/embedder", "org/reranker", "org/classifier"
LABELS = ("negative", "positive")
TEXTS = ["the cat sat on the mat", "Paris is the capital of France", "a short one"]
QUERY = "what is the capital of france"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        EMBEDDER: models.tiny_bert(root / "embedder", seed=1),
        # Another tokenizer (XLM-R) than the two BERT ones: each pool has its own.
        RERANKER: models.tiny_reranker(root / "reranker", seed=2, arch="xlm-roberta"),
        CLASSIFIER: models.tiny_reranker(root / "classifier", seed=3, arch="bert", labels=LABELS),
    }


@pytest.fixture(scope="module")
def tulips(dirs, log_dir):
    with ThreadPoolExecutor(3) as pool:
        futures = {m: pool.submit(Tulip, str(d), log_dir=log_dir, model_id=m) for m, d in dirs.items()}
    started = {m: f.result() for m, f in futures.items()}
    yield started
    for t in started.values():
        if t.alive():
            t.stop()


@pytest.fixture(scope="module")
def ivy(tulips, log_dir):
    proc = Ivy([t.url for t in tulips.values()], tokenizer=False, log_dir=log_dir, default_model="embedder")
    # Ready means one replica; every pool must be up.
    wait_for(lambda: proc.metrics().get(_up(tulips[CLASSIFIER], CLASSIFIER)) == 1
             and proc.metrics().get(_up(tulips[RERANKER], RERANKER)) == 1, "every pool up", timeout=60)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def stubs():
    from tulip.client import load_stubs

    return load_stubs("ivy")


def _up(tulip: Tulip, model: str) -> str:
    return f'ivy_replica_up{{replica="{tulip.url}",model="{model}"}}'


def _tokenizer(model_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def reference_embeddings(model_dir) -> torch.Tensor:
    seqs = [e.ids for e in _tokenizer(model_dir).encode_batch(TEXTS)]
    return torch.stack([F.normalize(h.mean(0), dim=0) for h in ref.encoder_hidden(model_dir, seqs)])


def reference_logits(model_dir, inputs, all_labels=False) -> torch.Tensor:
    encs = _tokenizer(model_dir).encode_batch(inputs)
    return ref.cross_encoder_logits(model_dir, [e.ids for e in encs], [e.type_ids for e in encs], all_labels)


def test_v1_models_lists_every_model_with_the_openai_client(ivy):
    import openai

    client = openai.OpenAI(base_url=f"{ivy.url}/v1", api_key="unused")
    ids = [m.id for m in client.models.list()]
    assert ids[:2] == [EMBEDDER, "embedder"], ids  # the default model first
    assert sorted(ids) == sorted([EMBEDDER, "embedder", RERANKER, "reranker", CLASSIFIER, "classifier"]), ids
    # The client's own request, naming its model.
    reply = client.embeddings.create(model="embedder", input=TEXTS)
    assert reply.model == "embedder" and len(reply.data) == 3


def test_embeddings_come_from_the_embedders_pool(ivy, dirs):
    want = reference_embeddings(dirs[EMBEDDER])
    status, body = ivy.post_json("/v1/embeddings", {"model": EMBEDDER, "input": TEXTS})
    assert status == 200 and body["model"] == EMBEDDER, body
    ref.assert_close_vectors(torch.tensor([d["embedding"] for d in body["data"]]), want)
    # TEI routes name no model: the default one (`--default-model embedder`) ...
    status, tei = ivy.post_json("/embed", {"inputs": TEXTS})
    assert status == 200, tei
    ref.assert_close_vectors(torch.tensor(tei), want)
    # ... or the one named in the `model` extension field.
    status, named = ivy.post_json("/embed", {"inputs": TEXTS, "model": "embedder"})
    assert status == 200 and np.allclose(named, tei, atol=1e-6)


def test_rerank_comes_from_the_rerankers_pool(ivy, dirs, stubs):
    want = torch.sigmoid(reference_logits(dirs[RERANKER], [(QUERY, t) for t in TEXTS]))
    status, body = ivy.post_json("/v1/rerank", {"model": "reranker", "query": QUERY, "documents": TEXTS})
    assert status == 200 and body["model"] == "reranker", body
    got = torch.zeros(len(TEXTS))
    for r in body["results"]:
        got[r["index"]] = r["relevance_score"]
    assert torch.allclose(got, want, atol=1e-4), (got, want)
    status, tei = ivy.post_json("/rerank", {"model": RERANKER, "query": QUERY, "texts": TEXTS})
    assert status == 200, tei
    assert torch.allclose(torch.tensor([r["score"] for r in sorted(tei, key=lambda r: r["index"])]), want, atol=1e-4)
    pb2, pb2_grpc = stubs
    with grpc.insecure_channel(ivy.grpc_target) as channel:
        reply = pb2_grpc.IvyStub(channel).Rerank(pb2.RerankRequest(query=QUERY, texts=TEXTS, model=RERANKER), timeout=60)
    grpc_scores = torch.tensor([r.score for r in sorted(reply.ranks, key=lambda r: r.index)])
    assert torch.allclose(grpc_scores, want, atol=1e-4)


def test_predict_comes_from_the_classifiers_pool(ivy, dirs):
    want = torch.softmax(reference_logits(dirs[CLASSIFIER], TEXTS, all_labels=True), dim=-1)
    status, body = ivy.post_json("/predict", {"model": "classifier", "inputs": TEXTS})
    assert status == 200, body
    for one, probs in zip(body, want):
        got = {p["label"]: p["score"] for p in one}
        assert set(got) == set(LABELS)
        assert np.allclose([got[label] for label in LABELS], probs.numpy(), atol=1e-4), (got, probs)


def test_info_describes_the_model_asked_for(ivy):
    status, body = ivy.get("/info")
    info = json.loads(body)
    assert status == 200 and info["model_id"] == EMBEDDER and "embedding" in info["model_type"], info
    assert sorted(info["models"]) == sorted([EMBEDDER, "embedder", RERANKER, "reranker", CLASSIFIER, "classifier"])
    status, body = ivy.get("/info?model=classifier")
    info = json.loads(body)
    assert status == 200 and info["model_id"] == CLASSIFIER and info["served_model_name"] == "classifier", info
    assert info["model_type"]["classifier"]["id2label"] == {"0": "negative", "1": "positive"}
    status, body = ivy.get("/info?model=nope")
    assert status == 404 and b"`nope`" in body, body


def test_a_route_the_model_cannot_serve_and_an_unknown_model_are_4xx_naming_it(ivy, stubs):
    status, body = ivy.post_json("/v1/embeddings", {"model": "reranker", "input": "x"})
    assert 400 <= status < 500 and f"`{RERANKER}`" in body["error"]["message"], body
    status, body = ivy.post_json("/rerank", {"model": "embedder", "query": "q", "texts": ["x"]})
    assert 400 <= status < 500 and f"`{EMBEDDER}`" in body["error"], body
    status, body = ivy.post_json("/v1/embeddings", {"model": "gpt-4", "input": "x"})
    assert status == 404 and body["error"]["code"] == "model_not_found", body
    assert "`gpt-4`" in body["error"]["message"] and "`reranker`" in body["error"]["message"], body
    status, body = ivy.post_json("/embed", {"model": "gpt-4", "inputs": "x"})
    assert status == 404 and "`gpt-4`" in body["error"], body
    status, body = ivy.post_json("/embed", {"model": 3, "inputs": "x"})
    assert status in (400, 422) and "`model`" in body["error"], body
    pb2, pb2_grpc = stubs
    with grpc.insecure_channel(ivy.grpc_target) as channel:
        with pytest.raises(grpc.RpcError) as e:
            pb2_grpc.IvyStub(channel).Embed(pb2.EmbedRequest(inputs=["x"], model="gpt-4"), timeout=60)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "`gpt-4`" in e.value.details()


def test_metrics_carry_the_model(ivy, tulips):
    ivy.post_json("/v1/rerank", {"model": "reranker", "query": QUERY, "documents": TEXTS})
    ivy.post_json("/v1/embeddings", {"model": "gpt-4", "input": "x"})
    m = ivy.metrics()
    ok = f'ivy_requests_total{{api="openai",endpoint="rerank",status="200",error="none",model="{RERANKER}"}}'
    assert m[ok] >= 1
    # An unknown model is not a label value: the set stays bounded.
    assert m['ivy_requests_total{api="openai",endpoint="embeddings",status="404",error="model_not_found",model="none"}'] >= 1
    assert not any("gpt-4" in k for k in m)
    assert m[f'ivy_replica_tokens_total{{replica="{tulips[RERANKER].url}",model="{RERANKER}"}}'] > 0


def test_one_pool_killed_the_others_keep_serving(ivy, tulips):
    """Runs last in the module: it kills the reranker's Tulip."""
    tulips[RERANKER].kill()
    wait_for(lambda: ivy.metrics().get(_up(tulips[RERANKER], RERANKER)) == 0, "the reranker marked down", timeout=60)
    status, body = ivy.post_json("/v1/rerank", {"model": "reranker", "query": QUERY, "documents": TEXTS})
    assert status == 503 and f"model `{RERANKER}`" in body["error"]["message"], body
    assert tulips[RERANKER].url in body["error"]["message"], body
    # Still known (503, not 404), and the other pools still answer.
    status, body = ivy.get("/v1/models")
    assert status == 200 and RERANKER in [m["id"] for m in json.loads(body)["data"]], body
    status, body = ivy.post_json("/v1/embeddings", {"model": "embedder", "input": TEXTS})
    assert status == 200 and len(body["data"]) == 3, body
    status, body = ivy.post_json("/predict", {"model": "classifier", "inputs": TEXTS})
    assert status == 200 and len(body) == 3, body
    status, body = ivy.get("/ready")
    assert status == 200, body
