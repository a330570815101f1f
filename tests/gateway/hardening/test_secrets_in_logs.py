"""Neither the API key (right or wrong) nor anything from a request body
reaches Ivy's output, at the most verbose log level (trace, every crate), in text and in JSON,
over HTTP and gRPC, for good requests and for every kind of refusal."""

from __future__ import annotations

import json
import os

import grpc
import pytest

from tests.support.servers import Ivy
from tulip.client import load_stubs

KEY = "sk-right-key-5f0c1d9e"
WRONG_KEY = "sk-wrong-key-77ab31c0"
MARKER = "body-marker-3c9e51a7"


def _http_traffic(ivy: Ivy) -> None:
    right = {"Authorization": f"Bearer {KEY}"}
    wrong = {"Authorization": f"Bearer {WRONG_KEY}"}
    assert ivy.post_json("/v1/embeddings", {"input": [MARKER, f"{MARKER} again"]}, right)[0] == 200
    assert ivy.post_json("/embed", {"inputs": MARKER}, right)[0] == 200
    assert ivy.post_json("/tokenize", {"inputs": MARKER}, right)[0] == 200
    assert ivy.post_json("/v1/embeddings", {"input": MARKER}, wrong)[0] == 401
    assert ivy.post_json("/v1/embeddings", {"input": MARKER})[0] == 401
    # Refusals whose messages could quote the body.
    assert ivy.post_json("/v1/embeddings", {"input": MARKER, "model": MARKER}, right)[0] == 404
    assert ivy.post_json("/v1/embeddings", {"input": MARKER, "encoding_format": MARKER}, right)[0] == 422
    assert ivy.post_json("/embed", {"inputs": MARKER, "prompt_name": MARKER}, right)[0] in (400, 413, 422)
    status, _, _ = ivy.request("POST", "/v1/embeddings", f'{{"input": "{MARKER}"'.encode(),
                               {"Content-Type": "application/json", **right})
    assert status == 400
    status, _, _ = ivy.request("POST", "/v1/embeddings", MARKER.encode(), {"Content-Type": "text/plain", **right})
    assert status == 415


def _grpc_traffic(ivy: Ivy) -> None:
    pb2, pb2_grpc = load_stubs("ivy")
    with grpc.insecure_channel(ivy.grpc_target) as channel:
        stub = pb2_grpc.IvyStub(channel)
        reply = stub.Embed(pb2.EmbedRequest(inputs=[MARKER]), metadata=[("authorization", f"Bearer {KEY}")],
                           timeout=30)
        assert reply.rows == 1
        for metadata in ([("authorization", f"Bearer {WRONG_KEY}")], []):
            with pytest.raises(grpc.RpcError) as e:
                stub.Embed(pb2.EmbedRequest(inputs=[MARKER]), metadata=metadata, timeout=30)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_keys_and_bodies_never_reach_the_logs(tulip_minilm, minilm_dir, log_dir, json_output):
    flags = {"json_output": True} if json_output else {}
    # The key from the environment, as the chart passes it.
    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, log="trace",
              env={"IVY_API_KEY": KEY}, **flags)
    try:
        _http_traffic(ivy)
        _grpc_traffic(ivy)
    finally:
        ivy.stop()
    text = ivy.log_path.read_text()
    assert "answered" in text and len(text.splitlines()) > 20  # verbose logs were written
    for secret in (KEY, WRONG_KEY, MARKER):
        assert secret not in text, f"{secret} in Ivy's output"


def test_help_never_shows_the_key_from_the_environment(tulip_minilm):
    import subprocess

    from tests.support.servers import IVY_BIN

    out = subprocess.run([str(IVY_BIN), "--help"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "IVY_API_KEY": KEY})
    assert out.returncode == 0 and "--api-key" in out.stdout
    assert KEY not in out.stdout + out.stderr
    assert json.dumps(KEY) not in out.stdout
