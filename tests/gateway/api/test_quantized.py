"""Quantized vectors per request (`POST /v2/embed` in Cohere's v2 shape,
`encoding_format` on `/v1/embeddings`, `embedding_type` on `ivy.v1`), against
sentence-transformers' own `quantize_embeddings` on the float vectors of the
same response: binary/ubinary bit for bit; int8/uint8 with the ranges the
model calibrated once (`GET /quantization/ranges`), so a text's vector does
not depend on the batch it came in."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
from sentence_transformers import quantize_embeddings

from bench.harness.fixtures import corpus_lines
from tulip.client import load_stubs

# Real text outside the calibration corpus (ivy/data/calibration.txt is
# MIRACL passages; these are from a novel).
TEXTS = [t for t in corpus_lines("botchan.txt")[200:260] if len(t) > 40][:24]
CALIBRATION = (corpus_lines("calibration_miracl.txt")[:320] + corpus_lines("calibration_miracl.txt")[340:])


def v2(ivy, body):
    return ivy.post_json("/v2/embed", body)


def arrays(body, kind, dtype):
    return np.array(body["embeddings"][kind], dtype=dtype)


@pytest.fixture(scope="module")
def ranges(ivy_minilm):
    """The full-dimension normalized setting's ranges (calibrates on first use)."""
    status, _, raw = ivy_minilm.request("GET", "/quantization/ranges", timeout=600)
    assert status == 200, raw
    r = json.loads(raw)
    assert (r["dimensions"], r["normalize"], r["texts"]) == (384, True, 340)
    assert r["source"].startswith("builtin:")
    return np.array(r["ranges"], dtype=np.float32)


def test_binary_types_are_packbits_bit_for_bit(ivy_minilm):
    status, body = v2(ivy_minilm, {"texts": TEXTS, "input_type": "search_document",
                                   "embedding_types": ["float", "binary", "ubinary"]})
    assert status == 200, body
    floats = arrays(body, "float", np.float32)
    assert floats.shape == (len(TEXTS), 384)
    for kind, dtype in (("binary", np.int8), ("ubinary", np.uint8)):
        got = arrays(body, kind, dtype)
        assert got.shape == (len(TEXTS), 48)
        np.testing.assert_array_equal(got, quantize_embeddings(floats, precision=kind))
    assert body["texts"] == TEXTS and body["response_type"] == "embeddings_by_type"
    assert body["meta"]["api_version"]["version"] == "2" and body["meta"]["billed_units"]["input_tokens"] > 0


def test_int8_uses_the_models_calibrated_ranges(ivy_minilm, ranges):
    status, body = v2(ivy_minilm, {"texts": TEXTS, "embedding_types": ["float", "int8", "uint8"]})
    assert status == 200, body
    floats = arrays(body, "float", np.float32)
    # Real text mostly falls inside the corpus's ranges (outside, both clip).
    inside = (floats >= ranges[0]) & (floats <= ranges[1])
    assert inside.mean() > 0.95, inside.mean()
    for kind, dtype in (("int8", np.int8), ("uint8", np.uint8)):
        np.testing.assert_array_equal(arrays(body, kind, dtype),
                                      quantize_embeddings(floats, precision=kind, ranges=ranges))


def test_ranges_are_the_calibration_corpus_extremes(ivy_minilm, ranges):
    """`quantize_embeddings(..., calibration_embeddings=corpus)` gives the same
    ranges: the corpus embedded again, by any batching, lands within float
    noise of them."""
    floats = []
    for i in range(0, len(CALIBRATION), 64):
        status, body = ivy_minilm.post_json("/v1/embeddings", {"input": CALIBRATION[i:i + 64]})
        assert status == 200, body
        floats += [d["embedding"] for d in body["data"]]
    floats = np.array(floats, dtype=np.float32)
    np.testing.assert_allclose(np.vstack([floats.min(0), floats.max(0)]), ranges, atol=1e-5)


def test_a_vector_does_not_depend_on_its_batch(ivy_minilm, ranges):
    alone = v2(ivy_minilm, {"texts": TEXTS[:1], "embedding_types": ["float", "int8"]})[1]
    batch = v2(ivy_minilm, {"texts": [TEXTS[0], *CALIBRATION[:15]], "embedding_types": ["float", "int8"]})[1]
    a, b = arrays(alone, "int8", np.int8)[0], arrays(batch, "int8", np.int8)[0]
    fa, fb = arrays(alone, "float", np.float32)[0], arrays(batch, "float", np.float32)[0]
    # Equal wherever the replica gave the same float (batching may move the
    # last bit of a float, never the ranges).
    same = fa == fb
    assert same.mean() > 0.5
    np.testing.assert_array_equal(a[same], b[same])
    assert np.abs(a.astype(int) - b.astype(int)).max() <= 1
    # What calibrating on the request's own batch would have done instead.
    own = quantize_embeddings(arrays(batch, "float", np.float32), precision="int8")[0]
    assert (own != b).mean() > 0.2


def test_dimensions_then_normalization_then_quantization(ivy_minilm):
    status, body = v2(ivy_minilm, {"texts": TEXTS[:4], "output_dimension": 64,
                                   "embedding_types": ["float", "int8", "ubinary"]})
    assert status == 200, body
    floats = arrays(body, "float", np.float32)
    assert floats.shape == (4, 64) and np.allclose(np.linalg.norm(floats, axis=1), 1, atol=1e-5)
    status, _, raw = ivy_minilm.request("GET", "/quantization/ranges?dimensions=64", timeout=600)
    r = json.loads(raw)
    assert status == 200 and (r["dimensions"], len(r["ranges"][0])) == (64, 64)
    rng = np.array(r["ranges"], dtype=np.float32)
    np.testing.assert_array_equal(arrays(body, "int8", np.int8), quantize_embeddings(floats, "int8", ranges=rng))
    np.testing.assert_array_equal(arrays(body, "ubinary", np.uint8), quantize_embeddings(floats, "ubinary"))


def test_openai_encoding_format_and_grpc_match_v2(ivy_minilm, ranges):
    want = v2(ivy_minilm, {"texts": TEXTS[:3], "embedding_types": ["int8", "binary"]})[1]["embeddings"]
    for kind in ("int8", "binary"):
        status, body = ivy_minilm.post_json("/v1/embeddings", {"input": TEXTS[:3], "encoding_format": kind})
        assert status == 200, body
        assert [d["embedding"] for d in body["data"]] == want[kind]
    pb2, pb2_grpc = load_stubs("ivy")
    with grpc.insecure_channel(ivy_minilm.grpc_target) as channel:
        stub = pb2_grpc.IvyStub(channel)
        reply = stub.Embed(pb2.EmbedRequest(inputs=TEXTS[:3], embedding_type=pb2.EMBEDDING_TYPE_INT8), timeout=60)
        assert (reply.rows, reply.dim, reply.embedding_type) == (3, 384, pb2.EMBEDDING_TYPE_INT8)
        assert np.frombuffer(reply.data, dtype=np.int8).reshape(3, 384).tolist() == want["int8"]
        reply = stub.Embed(pb2.EmbedRequest(inputs=TEXTS[:3], embedding_type=pb2.EMBEDDING_TYPE_BINARY), timeout=60)
        assert reply.dim == 48 and np.frombuffer(reply.data, dtype=np.int8).reshape(3, 48).tolist() == want["binary"]
        plain = stub.Embed(pb2.EmbedRequest(inputs=TEXTS[:1]), timeout=60)
        assert plain.embedding_type == pb2.EMBEDDING_TYPE_FLOAT and len(plain.data) == 384 * 4


def test_fidelity_on_real_text(ivy_minilm, ranges):
    """cos(dequantized, float) on real text, as docs/api.md reports it."""
    body = v2(ivy_minilm, {"texts": TEXTS, "embedding_types": ["float", "int8", "binary"]})[1]
    floats = arrays(body, "float", np.float32)
    steps = (ranges[1] - ranges[0]) / 255
    # The middle of each value's level.
    deq = ranges[0] + (arrays(body, "int8", np.int8).astype(np.float32) + 128.5) * steps
    cos = (deq * floats).sum(1) / np.linalg.norm(deq, axis=1)
    bits = np.unpackbits((arrays(body, "binary", np.int8).astype(np.int16) + 128).astype(np.uint8), axis=1)
    signs = bits.astype(np.float32) * 2 - 1
    cos_bin = (signs * floats).sum(1) / np.linalg.norm(signs, axis=1)
    print(f"\nint8 cos(dequantized, float): mean {cos.mean():.5f} min {cos.min():.5f}; "
          f"binary ±1: mean {cos_bin.mean():.4f} min {cos_bin.min():.4f} over {len(TEXTS)} texts")
    assert cos.min() > 0.99 and cos_bin.mean() > 0.7
    # Payload per vector, as JSON on the wire (docs/api.md's table).
    sizes = {}
    for kind in ("float", "int8", "binary"):
        status, _, raw = ivy_minilm.request("POST", "/v2/embed", json.dumps(
            {"texts": TEXTS, "embedding_types": [kind]}).encode(), {"Content-Type": "application/json"})
        assert status == 200
        sizes[kind] = len(raw) // len(TEXTS)
    print(f"JSON bytes per 384-dimension vector (with the echoed text): {sizes}")
    assert sizes["float"] > 3 * sizes["int8"] > 3 * sizes["binary"]


@pytest.mark.parametrize("body, status, words", [
    ({"texts": ["a"], "embedding_types": ["int4"]}, 422, "unknown embedding type"),
    ({"texts": ["a"], "input_type": "picture"}, 422, "input_type"),
    ({"texts": ["word " * 600], "truncate": "NONE"}, 422, "allow truncation"),
    ({"texts": ["a"], "truncate": "MIDDLE"}, 422, "truncate"),
    ({"texts": ["a"], "output_dimension": 0}, 422, "output_dimension"),
    ({"texts": ["a"], "output_dimension": 999}, 422, "dimensions"),
    ({"texts": ["a"], "model": "embed-v4.0"}, 404, "does not exist"),
    ({"images": ["data:image/png;base64,AA=="]}, 422, "takes text only"),
])
def test_v2_errors_in_coheres_shape(ivy_minilm, body, status, words):
    got, err = v2(ivy_minilm, body)
    assert got == status and set(err) == {"id", "message"} and words in err["message"], err


def test_truncate_start_and_end(ivy_minilm):
    long = " ".join(TEXTS) * 3
    end = v2(ivy_minilm, {"texts": [long]})[1]["embeddings"]["float"]
    start = v2(ivy_minilm, {"texts": [long], "truncate": "START"})[1]["embeddings"]["float"]
    left = ivy_minilm.post_json("/embed", {"inputs": long, "truncate": True, "truncation_direction": "left"})[1]
    assert np.allclose(start, left, atol=1e-6) and not np.allclose(start, end, atol=1e-3)


def test_cohere_client_v2_embed(ivy_minilm, ranges):
    """Cohere's own client (ClientV2) at Ivy's base URL: typed answers parse,
    and equal the wire's."""
    cohere = pytest.importorskip("cohere")
    co = cohere.ClientV2(api_key="unused", base_url=ivy_minilm.url)
    model = ivy_minilm.post_json("/v1/embeddings", {"input": "x"})[1]["model"]
    got = co.embed(texts=TEXTS[:3], model=model, input_type="search_document",
                   embedding_types=["float", "int8", "ubinary"])
    want = v2(ivy_minilm, {"texts": TEXTS[:3], "embedding_types": ["float", "int8", "ubinary"]})[1]
    assert got.embeddings.int8 == want["embeddings"]["int8"]
    assert got.embeddings.ubinary == want["embeddings"]["ubinary"]
    assert np.allclose(got.embeddings.float_, want["embeddings"]["float"], atol=1e-6)
    assert got.texts == TEXTS[:3] and got.meta.billed_units.input_tokens > 0
