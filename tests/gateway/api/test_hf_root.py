"""Hugging Face's `InferenceClient` pointed at Ivy's base URL, as a user
writes it (`InferenceClient(base_url="http://ivy:8080")`): every task posts
to `/`, which Ivy serves as text-embeddings-inference does, by the model's
kind (embed, embed_sparse, predict, rerank; similarity when the deployment
says so or the body asks), with `POST /invocations` (SageMaker) the same and
`GET /`, `GET /ping` as health checks open without the API key."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bench.harness import tiny_models as models
from tests.support.servers import Ivy, Tulip
from tests.support.vectors import cosines

TEXTS = ["The cat sat on the mat.", "Vector search finds neighbours."]
OTHERS = ["A feline rested on the rug.", "Stock markets fell sharply today.", TEXTS[0]]
LABELS = ("no", "yes", "maybe")


@pytest.fixture(scope="module")
def hub():
    hub = pytest.importorskip("huggingface_hub")
    # conftest sets HF_HUB_OFFLINE (there is no Hub here), which makes the
    # client refuse every URL, a local server's included.
    patch = pytest.MonkeyPatch()
    patch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    yield hub
    patch.undo()


def client(hub, ivy):
    return hub.InferenceClient(base_url=ivy.url)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory, log_dir):
    """A classifier, a cross-encoder and a SPLADE model, each on its own
    Tulip and Ivy (one model per Ivy, as TEI deploys them)."""
    root = tmp_path_factory.mktemp("hf-root-models")
    dirs = {
        "classifier": models.tiny_reranker(root / "classifier", arch="bert", labels=LABELS),
        "reranker": models.tiny_reranker(root / "reranker", seed=3, arch="bert"),
        "splade": models.tiny_splade(root / "splade"),
    }
    with ThreadPoolExecutor(len(dirs)) as pool:
        futures = {k: pool.submit(Tulip, str(d), log_dir=log_dir, threads=1) for k, d in dirs.items()}
        tulips = {k: f.result() for k, f in futures.items()}
    ivys = {k: Ivy([t.url], tokenizer=False, log_dir=log_dir, api_key="sekrit") for k, t in tulips.items()}
    yield ivys
    for p in [*ivys.values(), *tulips.values()]:
        p.stop()


KEY = {"Authorization": "Bearer sekrit"}


def test_feature_extraction_at_the_base_url(hub, ivy_minilm, st_minilm):
    got = client(hub, ivy_minilm).feature_extraction(TEXTS[0])
    ref = st_minilm.encode([TEXTS[0]], normalize_embeddings=True)
    assert got.shape == (1, 384) and cosines(got, ref).min() >= 0.999
    short = client(hub, ivy_minilm).feature_extraction(TEXTS[1], dimensions=64, normalize=True)
    assert short.shape == (1, 64)
    # SageMaker's path is the same route.
    status, body = ivy_minilm.post_json("/invocations", {"inputs": TEXTS})
    assert status == 200 and np.allclose(body, ivy_minilm.post_json("/embed", {"inputs": TEXTS})[1], atol=1e-6)


def test_sentence_similarity_at_the_base_url(hub, ivy_minilm, st_minilm):
    """The body says what it wants, so an embedder's `/` serves it without
    `--task`."""
    got = client(hub, ivy_minilm).sentence_similarity(TEXTS[0], other_sentences=OTHERS)
    ref = st_minilm.encode([TEXTS[0], *OTHERS], normalize_embeddings=True)
    assert np.allclose(got, ref[1:] @ ref[0], atol=2e-3) and got[2] == pytest.approx(1.0, abs=1e-4)


def test_task_flag_makes_root_the_similarity(hub, tulip_minilm, minilm_dir, log_dir):
    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, env={"IVY_TASK": "sentence-similarity"})
    try:
        got = client(hub, ivy).sentence_similarity(TEXTS[0], other_sentences=OTHERS)
        status, want = ivy.post_json("/similarity", {"inputs": {"source_sentence": TEXTS[0], "sentences": OTHERS}})
        assert status == 200 and np.allclose(got, want, atol=1e-6)
        # An embedding body is now the wrong shape, said clearly.
        status, body = ivy.post_json("/", {"inputs": "x"})
        assert status == 422 and body["error_type"] == "Validation"
    finally:
        ivy.stop()


def test_text_classification_at_the_base_url(hub, kinds):
    ivy = kinds["classifier"]
    c = hub.InferenceClient(base_url=ivy.url, api_key="sekrit")
    got = c.text_classification(TEXTS[0])
    status, want = ivy.post_json("/predict", {"inputs": TEXTS[0]}, headers=KEY)
    assert status == 200 and [p.label for p in got] == [p["label"] for p in want]
    assert np.allclose([p.score for p in got], [p["score"] for p in want], atol=1e-6)
    # The Hub's parameters: top_k, and a function over the raw logits.
    top = c.text_classification(TEXTS[0], top_k=2)
    assert [p.label for p in top] == [p["label"] for p in want[:2]]
    status, raw = ivy.post_json("/predict", {"inputs": TEXTS[0], "raw_scores": True}, headers=KEY)
    logits = np.array([p["score"] for p in raw], dtype=np.float32)
    sig = c.text_classification(TEXTS[0], function_to_apply="sigmoid")
    assert np.allclose([p.score for p in sig], 1 / (1 + np.exp(-logits)), atol=1e-6)
    none = c.text_classification(TEXTS[0], function_to_apply="none")
    assert np.allclose([p.score for p in none], logits, atol=1e-6)
    # TEI's own body at `/` keeps TEI's answer (one flat list).
    assert ivy.post_json("/", {"inputs": TEXTS[0]}, headers=KEY) == (200, want)
    status, body = ivy.post_json("/", {"inputs": "x", "parameters": {"top_k": 0}}, headers=KEY)
    assert status == 422 and "top_k" in body["error"]


def test_rerank_shape_at_the_base_url(kinds):
    ivy = kinds["reranker"]
    body = {"query": "what is a cat?", "texts": [*OTHERS, TEXTS[1]], "return_text": True}
    status, got = ivy.post_json("/", body, headers=KEY)
    assert status == 200 and got == ivy.post_json("/rerank", body, headers=KEY)[1]
    assert [r["index"] for r in got] != [] and {r["text"] for r in got} == set(body["texts"])
    assert ivy.post_json("/invocations", body, headers=KEY) == (200, got)
    # An embedding body at a reranker's `/` is refused by the rerank route.
    status, err = ivy.post_json("/", {"inputs": "x"}, headers=KEY)
    assert status == 422 and "query" in err["error"]


def test_sparse_model_root_is_embed_sparse(hub, kinds):
    ivy = kinds["splade"]
    status, got = ivy.post_json("/", {"inputs": TEXTS}, headers=KEY)
    assert status == 200 and got == ivy.post_json("/embed_sparse", {"inputs": TEXTS}, headers=KEY)[1]
    assert all(isinstance(v, dict) and {"index", "value"} <= v.keys() for v in got[0])


def test_health_paths_are_open_and_post_needs_the_key(kinds):
    ivy = kinds["classifier"]
    for path in ("/", "/ping", "/health"):
        assert ivy.get(path) == (200, b"ok"), path
    status, body = ivy.post_json("/", {"inputs": "x"})
    assert status == 401 and body["error_type"] == "Unauthorized"
    status, _ = ivy.post_json("/ping", {})
    assert status == 405
