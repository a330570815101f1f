"""Direct gRPC calls to Tulip: validation before the engine, and the server
keeps serving after every refusal."""

from __future__ import annotations

import grpc
import numpy as np
import pytest


@pytest.fixture(scope="module")
def client(tulip_minilm):
    with tulip_minilm.client() as c:
        yield c


def assert_invalid(client, sequences, *words, **kw):
    with pytest.raises(grpc.RpcError) as e:
        client.embed(sequences, **kw)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for w in words:
        assert w in e.value.details(), e.value.details()
    # The next valid call succeeds.
    out = client.embed([[101, 7592, 102]])
    assert out.values.shape == (1, 384)


def test_info_describes_model(client):
    info = client.info()
    assert (info.dimension, info.max_input_length, info.vocab_size) == (384, 256, 30522)
    assert info.pooling == "mean" and info.normalize_default
    assert list(info.kinds) == [client.pb2.OUTPUT_KIND_DENSE]


def test_out_of_range_ids(client):
    assert_invalid(client, [[101, 30522, 102]], "token id 30522", "outside the vocabulary")


def test_empty_sequence(client):
    assert_invalid(client, [[101, 102], []], "sequence 1 is empty")


def test_no_sequences(client):
    assert_invalid(client, [], "no sequences")


def test_over_long_sequence(client):
    assert_invalid(client, [[101] + [1000] * 300 + [102]], "302 tokens", "at most 256")


def test_dimensions_beyond_model(client):
    assert_invalid(client, [[101, 102]], "larger than the model's dimension", dimensions=1000)


def test_unsupported_output_kind(client):
    assert_invalid(client, [[101, 102]], "does not produce sparse", kind="sparse")


def test_lengths_must_match_ids(client):
    req = client.request([[101, 102]])
    req.lengths[:] = [5]
    with pytest.raises(grpc.RpcError) as e:
        client.stub.Embed(req, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_valid_call_returns_packed_rows_and_timing(client):
    out = client.embed([[101, 7592, 2088, 102], [101, 102]], normalize=False)
    assert out.values.shape == (2, 384)
    assert not np.allclose(np.linalg.norm(out.values, axis=1), 1.0)
    assert out.tokens == 6
    assert out.timing["total_us"] >= out.timing["inference_us"] > 0


def test_health_service_reports_serving(client):
    # grpc.health.v1.Health/Check with an empty request (service ""): the
    # response's field 1 is the status, SERVING = 1.
    check = client.channel.unary_unary(
        "/grpc.health.v1.Health/Check", request_serializer=bytes, response_deserializer=bytes
    )
    assert check(b"", timeout=5) == b"\x08\x01"
