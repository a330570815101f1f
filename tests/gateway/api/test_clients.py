"""Real clients, unchanged: `huggingface_hub`'s InferenceClient against the
TEI-compatible `/embed`, and a `grpcio` client against `ivy.v1`."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from tests.support.vectors import cosines
from tulip.client import load_stubs

TEXTS = ["The cat sat on the mat.", "Vector search finds neighbours."]


@pytest.fixture(scope="module")
def hf_client(ivy_minilm):
    hub = pytest.importorskip("huggingface_hub")
    # conftest sets HF_HUB_OFFLINE (there is no Hub here), which makes the
    # client refuse every URL, a local server's included.
    patch = pytest.MonkeyPatch()
    patch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    yield hub.InferenceClient(model=f"{ivy_minilm.url}/embed")
    patch.undo()


def test_sentence_similarity(ivy_minilm, st_minilm):
    """InferenceClient.sentence_similarity against TEI's /similarity."""
    hub = pytest.importorskip("huggingface_hub")
    patch = pytest.MonkeyPatch()
    patch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    try:
        client = hub.InferenceClient(model=f"{ivy_minilm.url}/similarity")
        others = ["A feline rested on the rug.", "Stock markets fell sharply today.", TEXTS[0]]
        got = client.sentence_similarity(TEXTS[0], other_sentences=others)
    finally:
        patch.undo()
    ref = st_minilm.encode([TEXTS[0], *others], normalize_embeddings=True)
    want = ref[1:] @ ref[0]
    assert np.allclose(got, want, atol=2e-3)
    assert got[2] == pytest.approx(1.0, abs=1e-4) and got[0] > got[1]
    status, body = ivy_minilm.post_json("/similarity", {"inputs": {"source_sentence": "x"}})
    assert status == 422 and "sentences" in body["error"]


def test_feature_extraction(hf_client, st_minilm):
    got = hf_client.feature_extraction(TEXTS[0])
    ref = st_minilm.encode([TEXTS[0]], normalize_embeddings=True)
    assert got.shape == (1, 384) and got.dtype == np.float32
    assert cosines(got, ref).min() >= 0.999


def test_feature_extraction_parameters(hf_client, st_minilm):
    raw = hf_client.feature_extraction(TEXTS[1], normalize=False)
    assert not np.isclose(np.linalg.norm(raw), 1.0, atol=1e-3)
    short = hf_client.feature_extraction(TEXTS[1], dimensions=64)
    assert short.shape == (1, 64) and np.isclose(np.linalg.norm(short), 1.0, atol=1e-5)
    long_text = "word " * 600
    cut = hf_client.feature_extraction(long_text, truncate=True, truncation_direction="left")
    assert cut.shape == (1, 384)


def test_feature_extraction_errors_surface(hf_client):
    hub = pytest.importorskip("huggingface_hub")
    with pytest.raises(hub.errors.HfHubHTTPError) as e:
        hf_client.feature_extraction("word " * 600, truncate=False)
    assert e.value.response.status_code == 422


@pytest.fixture(scope="module")
def stub(ivy_minilm):
    pb2, pb2_grpc = load_stubs("ivy")
    with grpc.insecure_channel(ivy_minilm.grpc_target) as channel:
        yield pb2, pb2_grpc.IvyStub(channel), channel


def test_grpc_embed(stub, st_minilm):
    pb2, ivy, _ = stub
    reply, call = ivy.Embed.with_call(pb2.EmbedRequest(inputs=TEXTS), metadata=[("x-request-id", "grpc-1")], timeout=30)
    vectors = np.frombuffer(reply.data, dtype="<f4").reshape(reply.rows, reply.dim)
    ref = st_minilm.encode(TEXTS, normalize_embeddings=True)
    assert vectors.shape == (2, 384) and cosines(vectors, ref).min() >= 0.999
    assert reply.prompt_tokens > 0 and reply.timing.total_us >= reply.timing.inference_us > 0
    assert dict(call.initial_metadata())["x-request-id"] == "grpc-1"
    short = ivy.Embed(pb2.EmbedRequest(inputs=TEXTS, dimensions=32, normalize=False), timeout=30)
    assert short.dim == 32


def test_grpc_tokenize_and_info(stub, st_minilm):
    pb2, ivy, _ = stub
    reply = ivy.Tokenize(pb2.TokenizeRequest(inputs=["hello world"]), timeout=30)
    tokens = reply.results[0].tokens
    assert [t.id for t in tokens] == st_minilm.tokenizer("hello world")["input_ids"]
    assert tokens[0].special and not tokens[0].HasField("start")
    assert (tokens[1].text, tokens[1].start, tokens[1].stop) == ("hello", 0, 5)
    bare = ivy.Tokenize(pb2.TokenizeRequest(inputs=["hello world"], add_special_tokens=False), timeout=30)
    assert [t.id for t in bare.results[0].tokens] == [t.id for t in tokens[1:-1]]
    info = ivy.Info(pb2.InfoRequest(), timeout=30)
    assert (info.dimension, info.max_input_length, list(info.kinds)) == (384, 256, ["dense"])


@pytest.mark.parametrize("call, request_args, code, words", [
    ("Embed", {"inputs": []}, grpc.StatusCode.INVALID_ARGUMENT, "must not be empty"),
    ("Embed", {"inputs": ["x", ""]}, grpc.StatusCode.INVALID_ARGUMENT, "inputs[1] is an empty string"),
    ("Embed", {"inputs": ["word " * 600]}, grpc.StatusCode.INVALID_ARGUMENT, "at most 256"),
    ("Embed", {"inputs": ["x"], "dimensions": 999}, grpc.StatusCode.INVALID_ARGUMENT, "dimensions"),
    ("Embed", {"inputs": ["x"], "prompt_name": "query"}, grpc.StatusCode.INVALID_ARGUMENT, "no prompt templates"),
    ("EmbedSparse", {"inputs": ["x"]}, grpc.StatusCode.FAILED_PRECONDITION, "does not produce sparse"),
    ("Rerank", {"query": "q", "texts": ["t"]}, grpc.StatusCode.FAILED_PRECONDITION, "does not produce score"),
    ("Rerank", {"query": "q", "texts": []}, grpc.StatusCode.INVALID_ARGUMENT, "must not be empty"),
    ("Tokenize", {"inputs": []}, grpc.StatusCode.INVALID_ARGUMENT, "no inputs"),
])
def test_grpc_errors_map_to_status_codes(stub, call, request_args, code, words):
    pb2, ivy, _ = stub
    message = {"Rerank": pb2.RerankRequest, "Tokenize": pb2.TokenizeRequest}.get(call, pb2.EmbedRequest)
    with pytest.raises(grpc.RpcError) as e:
        getattr(ivy, call)(message(**request_args), timeout=30)
    assert e.value.code() == code
    assert words in e.value.details(), e.value.details()
    assert ivy.Embed(pb2.EmbedRequest(inputs=["still serving"]), timeout=30).rows == 1


def test_grpc_health(stub):
    _, _, channel = stub
    check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=bytes, response_deserializer=bytes)
    assert check(b"", timeout=5) == b"\x08\x01"
    assert check(b"\n\nivy.v1.Ivy", timeout=5) == b"\x08\x01"
    with pytest.raises(grpc.RpcError) as e:
        check(b"\n\x05other", timeout=5)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=bytes,
                                 response_deserializer=bytes)
    updates = watch(b"", timeout=5)
    assert next(updates) == b"\x08\x01"
    updates.cancel()
