"""Late chunking end to end (`late_chunking: true`): Ivy over real Tulips,
chunk vectors against a reference written from `transformers` token states
with the same spans (tests/support/late_chunking.py), for every family that
pools tokens, documents longer than the model included; the API shapes
(OpenAI, TEI, ivy.v1) and bad input."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bench.harness import late_chunking_reference as ref
from bench.harness import tiny_models as models
from bench.harness.fixtures import corpus_lines
from tests.support.http import embeddings_reply, get_json
from tests.support.servers import Ivy, Tulip
from tulip_rose_cli.processes import wait_for

pytestmark = pytest.mark.slow

BERLIN = ["Berlin is the capital and largest city of Germany, both by area and by population.",
          "Its more than 3.85 million inhabitants make it the European Union's most populous city.",
          "The city is also one of the states of Germany, and is the third smallest state in the country.",
          "Zürich, München und Köln liegen woanders — 東京 auch."]

# Family → (builder, the span pooling the reference applies).
FAMILIES = {
    "xlmr": (lambda d: models.tiny_xlmr(d, m3_heads=False), "mean"),  # CLS-pooled: spans mean-pool
    "qwen3": (lambda d: models.tiny_qwen3(d), "last"),
    "mpnet": (models.tiny_mpnet, "mean"),
    "modernbert": (models.tiny_modernbert, "mean"),
    "nomic-bert": (models.tiny_nomic_bert, "mean"),
    "st-dense": (lambda d: models.st_pipeline(d / "st", models.tiny_bert(d / "bert"), dense=((96, "Tanh"),)), None),
}


WINDOW = 256


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def late(ivy, chunks, **extra):
    body = embeddings_reply(ivy, chunks, late_chunking=True, **extra)
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32), body


def long_document(n_lines: int) -> list[str]:
    return [line.strip() for line in corpus_lines("botchan.txt")[200:200 + n_lines] if line.strip()]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("late")
    return {name: build(root / name) for name, (build, _) in FAMILIES.items()}


@pytest.fixture(scope="module")
def families(family_dirs, log_dir):
    with ThreadPoolExecutor(3) as pool:
        futures = {n: pool.submit(Tulip, str(d), log_dir=log_dir, model_id=n, threads=1)
                   for n, d in family_dirs.items()}
    tulips = {n: f.result() for n, f in futures.items()}
    # A window of WINDOW tokens, below the models' own maxima.
    ivy = Ivy([t.url for t in tulips.values()], tokenizer=False, log_dir=log_dir, default_model="xlmr",
              max_input_length=WINDOW)
    wait_for(lambda: all(ivy.post_json("/v1/embeddings", {"input": "x", "model": n})[0] == 200 for n in tulips),
             "every model up", timeout=120)
    yield ivy
    ivy.stop()
    for t in tulips.values():
        t.stop()


def test_minilm_chunks_match_the_reference(ivy_minilm, st_minilm):
    got, body = late(ivy_minilm, BERLIN)
    want = ref.late_chunks(st_minilm, BERLIN, "mean", max_length=10_000)
    assert cosines(got, want).min() >= 0.999
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    # The document's tokens, counted once.
    doc, _ = ref.join(BERLIN)
    assert body["usage"]["prompt_tokens"] == len(st_minilm.tokenizer(doc)["input_ids"])
    # Context reaches the chunks: not the chunks embedded alone.
    alone = st_minilm.encode(BERLIN)
    assert cosines(got, alone).min() < 0.99


def test_one_chunk_is_the_ordinary_embedding(ivy_minilm):
    for text in (BERLIN[0], "  leading and trailing whitespace  "):
        got, _ = late(ivy_minilm, [text])
        status, body = ivy_minilm.post_json("/v1/embeddings", {"input": [text]})
        assert status == 200
        assert cosines(got, [body["data"][0]["embedding"]])[0] >= 0.99999


def test_documents_longer_than_the_model_go_in_windows(ivy_minilm, st_minilm):
    chunks = long_document(40)
    status, info = get_json(ivy_minilm, "/info")
    max_length = info["max_input_length"]
    doc, _ = ref.join(chunks)
    n = len(ref.tokenizer(st_minilm).encode(doc).ids)
    assert n > 2.5 * max_length, (n, max_length)
    got, body = late(ivy_minilm, chunks)
    want = ref.late_chunks(st_minilm, chunks, "mean", max_length=max_length)
    assert cosines(got, want).min() >= 0.999
    assert body["usage"]["prompt_tokens"] == n


def test_other_apis_and_options(ivy_minilm):
    want, _ = late(ivy_minilm, BERLIN)
    status, body = ivy_minilm.post_json("/embed", {"inputs": BERLIN, "late_chunking": True})
    assert status == 200, body
    assert cosines(body, want).min() >= 0.99999
    import grpc

    from tulip.client import load_stubs

    pb2, pb2_grpc = load_stubs("ivy")
    with grpc.insecure_channel(ivy_minilm.grpc_target) as channel:
        reply = pb2_grpc.IvyStub(channel).Embed(pb2.EmbedRequest(inputs=BERLIN, late_chunking=True), timeout=60)
    grpc_rows = np.frombuffer(reply.data, dtype="<f4").reshape(len(BERLIN), -1) if reply.data else \
        np.array([e.values for e in reply.embeddings])
    assert cosines(grpc_rows, want).min() >= 0.99999
    status, body = ivy_minilm.post_json("/v2/embed", {"texts": BERLIN, "late_chunking": True,
                                                      "embedding_types": ["float"]})
    assert status == 200, body
    assert cosines(body["embeddings"]["float"], want).min() >= 0.99999
    # Matryoshka and quantized formats apply to chunk vectors as to any.
    small, _ = late(ivy_minilm, BERLIN, dimensions=64)
    assert small.shape == (4, 64) and cosines(small, want[:, :64]).min() >= 0.99999
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": BERLIN, "late_chunking": True,
                                                           "encoding_format": "binary"})
    assert status == 200 and len(body["data"]) == 4, body


@pytest.mark.parametrize("bad, status, says", [
    ({"input": []}, 422, "must not be empty"),
    ({"input": ["Berlin.", ""]}, 422, "input[1] is an empty string"),
    ({"input": ["Berlin.", "   ", "More."]}, 422, "input[1] has no token of its own"),
    ({"input": ["Berlin."], "long_inputs": "pool"}, 422, "leave out `long_inputs`"),
    ({"input": [[101, 2000, 102]]}, 422, "chunks as texts"),
    ({"input": ["Berlin."], "late_chunking": "yes"}, 422, "must be true or false"),
])
def test_bad_input_is_refused_clearly(ivy_minilm, bad, status, says):
    got, body = ivy_minilm.post_json("/v1/embeddings", {"late_chunking": True, **bad})
    assert got == status and says in body["error"]["message"], body
    # Nothing else disturbed.
    late(ivy_minilm, BERLIN[:2])


def test_too_many_tokens_says_what_to_do(tmp_path, tulip_minilm, minilm_dir, log_dir):
    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, max_tokens_per_request=300)
    try:
        status, body = ivy.post_json("/v1/embeddings", {"input": long_document(30), "late_chunking": True})
        assert status == 422 and "over the limit of 300" in body["error"]["message"], body
    finally:
        ivy.stop()


@pytest.mark.parametrize("family", [f for f, (_, p) in FAMILIES.items() if p])
def test_every_family_matches_the_reference(families, family_dirs, family):
    from sentence_transformers import SentenceTransformer

    pooling = FAMILIES[family][1]
    st = SentenceTransformer(str(family_dirs[family]), device="cpu")
    got, _ = late(families, BERLIN, model=family)
    want = ref.late_chunks(st, BERLIN, pooling, max_length=10_000)
    assert cosines(got, want).min() >= 0.999, family
    if pooling == "last" or family == "nomic-bert":
        # One chunk: the ordinary embedding (mean and last-token pooling).
        one, _ = late(families, BERLIN[:1], model=family)
        status, body = families.post_json("/v1/embeddings", {"input": BERLIN[:1], "model": family})
        assert status == 200 and cosines(one, [body["data"][0]["embedding"]])[0] >= 0.99999


def test_a_long_document_on_another_family(families, family_dirs):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(family_dirs["xlmr"]), device="cpu")
    chunks = long_document(40)
    got, _ = late(families, chunks, model="xlmr")
    want = ref.late_chunks(st, chunks, "mean", max_length=WINDOW)
    assert len(ref.tokenizer(st).encode(ref.join(chunks)[0]).ids) > 2 * WINDOW
    assert cosines(got, want).min() >= 0.999


def test_a_head_that_projects_is_refused(families):
    status, body = families.post_json("/v1/embeddings", {"input": BERLIN, "late_chunking": True, "model": "st-dense"})
    assert status == 422 and "cannot late-chunk" in body["error"]["message"], body
    status, body = families.post_json("/embed", {"inputs": BERLIN, "late_chunking": True, "model": "st-dense"})
    assert status == 424 and "projects or quantizes" in body["error"], body
