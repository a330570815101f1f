"""How Tulip classifies what goes wrong in the engine: only the engine's
invalid-batch error is the caller's fault (INVALID_ARGUMENT); any other
exception is a server fault (INTERNAL, which Ivy retries elsewhere), logged
with the request id; and the server keeps serving either way."""

from __future__ import annotations

import json

import grpc
import pytest

from tests.support import fault_engine


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    model = tmp_path_factory.mktemp("null-model")
    (model / "config.json").write_text(json.dumps(
        {"model_type": "null", "hidden_size": 8, "vocab_size": 100, "max_position_embeddings": 64}))
    proc, port, _ = fault_engine.start(model, tmp_path_factory.mktemp("logs"))
    from tulip.client import TulipClient

    client = TulipClient(f"127.0.0.1:{port}")
    yield proc, client
    client.close()
    proc.stop()


def _call(client, ids, request_id):
    req = client.request([ids])
    req.request_id = request_id
    return client.stub.Embed(req, timeout=10)


@pytest.mark.parametrize("token,request_id", [(7, "req-value-error"), (8, "req-runtime-error")])
def test_engine_exceptions_are_internal_and_logged_with_the_request_id(faulty, token, request_id):
    proc, client = faulty
    with pytest.raises(grpc.RpcError) as e:
        _call(client, [1, token, 2], request_id)
    assert e.value.code() == grpc.StatusCode.INTERNAL, e.value.details()
    assert "injected engine" in e.value.details()
    assert request_id in proc.log()
    # Still serving.
    assert _call(client, [1, 2, 3], "req-after").rows == 1


def test_the_engines_invalid_batch_error_is_the_callers_fault(faulty):
    _, client = faulty
    with pytest.raises(grpc.RpcError) as e:
        _call(client, [1, 9, 2], "req-refused")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "injected refusal" in e.value.details()
    # Ids Tulip can check itself never reach the engine.
    with pytest.raises(grpc.RpcError) as e:
        _call(client, [1, 100, 2], "req-bad-id")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _call(client, [1, 2, 3], "req-after").rows == 1
