"""Random, truncated and bit-flipped protobuf bytes and well-formed
messages with random field values, sent as raw bytes to Tulip's and Ivy's
gRPC services: only defined status codes, and both processes stay up and
keep answering a good request."""

from __future__ import annotations

import pytest

from bench.reliability import fuzz_grpc
from tulip.client import load_stubs

pytestmark = pytest.mark.slow


def test_tulip_survives_malformed_messages(tulip_minilm):
    pb2, _ = load_stubs("tulip")
    with tulip_minilm.client() as c:
        vocab = c.info().vocab_size
    good = ("/tulip.v1.Tulip/Embed", pb2.EmbedRequest(token_ids=[101, 7592, 102], lengths=[3]).SerializeToString())
    result = fuzz_grpc.run(tulip_minilm.target, fuzz_grpc.tulip_requests(pb2, vocab), 3000, good, seed=16,
                           alive=tulip_minilm.alive)
    assert result["findings"] == [], result["findings"][:3]
    assert not result["crashed"] and result["probes_failed"] == 0
    assert result["calls"] == 3000


def test_ivy_survives_malformed_messages(ivy_minilm):
    pb2, _ = load_stubs("ivy")
    good = ("/ivy.v1.Ivy/Embed", pb2.EmbedRequest(inputs=["still serving"]).SerializeToString())
    result = fuzz_grpc.run(ivy_minilm.grpc_target, fuzz_grpc.ivy_requests(pb2), 3000, good, seed=16,
                           alive=ivy_minilm.alive)
    assert result["findings"] == [], result["findings"][:3]
    assert not result["crashed"] and result["probes_failed"] == 0


def test_mutations_are_malformed_or_different():
    import random

    rng = random.Random(0)
    valid = load_stubs("tulip")[0].EmbedRequest(token_ids=[1, 2, 3], lengths=[3]).SerializeToString()
    for _ in range(50):
        how, data = fuzz_grpc.mutate(rng, valid)
        assert how in ("random", "truncated", "bit-flipped") and data != valid


def test_only_a_decode_failure_may_be_internal():
    import grpc

    assert fuzz_grpc.defined("truncated", grpc.StatusCode.INTERNAL, "failed to decode Protobuf message: x")
    assert not fuzz_grpc.defined("truncated", grpc.StatusCode.INTERNAL, "engine panicked")
    assert not fuzz_grpc.defined("random values", grpc.StatusCode.INTERNAL, "failed to decode")
    assert not fuzz_grpc.defined("random values", grpc.StatusCode.UNKNOWN, "")
    assert fuzz_grpc.defined("unknown method", grpc.StatusCode.UNIMPLEMENTED, "")
