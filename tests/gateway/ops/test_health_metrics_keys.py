"""API key on and off; /health, /ready and /metrics as documented; request
ids on every response; a replica that comes up later is admitted."""

from __future__ import annotations

import json

import grpc
import pytest

from tests.support.servers import Ivy, Tulip, free_port, wait_for
from tulip.client import load_stubs

KEY = "ivy-test-key-7f3a9c"
BODY = {"input": "authorised"}



@pytest.fixture(scope="module")
def ivy_keyed(tulip_minilm, minilm_dir, log_dir):
    proc = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, env={"IVY_API_KEY": KEY})
    yield proc
    proc.stop()


def post(ivy, path, payload, key=None):
    headers = {"Authorization": key} if key else {}
    return ivy.post_json(path, payload, headers)


@pytest.mark.parametrize("header", [None, "Bearer wrong", KEY, f"Basic {KEY}"])
def test_openai_route_needs_the_key(ivy_keyed, header):
    status, body = post(ivy_keyed, "/v1/embeddings", BODY, header)
    assert status == 401, body
    assert body["error"]["type"] == "authentication_error" and body["error"]["code"] == "unauthorized"
    assert KEY not in json.dumps(body)


@pytest.mark.parametrize("path, payload", [
    ("/embed", {"inputs": "x"}), ("/tokenize", {"inputs": "x"}), ("/rerank", {"query": "q", "texts": ["t"]}),
])
def test_tei_routes_need_the_key(ivy_keyed, path, payload):
    status, body = post(ivy_keyed, path, payload)
    assert status == 401 and body["error_type"] == "Unauthorized", body
    status, _ = post(ivy_keyed, path, payload, f"Bearer {KEY}")
    assert status != 401


def test_the_right_key_passes_and_public_routes_need_none(ivy_keyed):
    status, body = post(ivy_keyed, "/v1/embeddings", BODY, f"Bearer {KEY}")
    assert status == 200, body
    for path in ["/info", "/openapi.json"]:
        assert ivy_keyed.request("GET", path)[0] == 401
        assert ivy_keyed.request("GET", path, headers={"Authorization": f"Bearer {KEY}"})[0] == 200
    for path in ["/health", "/ready", "/metrics"]:
        assert ivy_keyed.get(path)[0] == 200, path


def test_openai_client_with_and_without_the_key(ivy_keyed):
    openai = pytest.importorskip("openai")
    good = openai.OpenAI(base_url=f"{ivy_keyed.url}/v1", api_key=KEY, max_retries=0)
    assert len(good.embeddings.create(model="all-MiniLM-L6-v2", input="hi").data[0].embedding) == 384
    bad = openai.OpenAI(base_url=f"{ivy_keyed.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.embeddings.create(model="all-MiniLM-L6-v2", input="hi")


def test_grpc_needs_the_key_but_health_does_not(ivy_keyed):
    pb2, pb2_grpc = load_stubs("ivy")
    with grpc.insecure_channel(ivy_keyed.grpc_target) as channel:
        stub = pb2_grpc.IvyStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Embed(pb2.EmbedRequest(inputs=["x"]), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = stub.Embed(pb2.EmbedRequest(inputs=["x"]), metadata=[("authorization", f"Bearer {KEY}")], timeout=30)
        assert reply.rows == 1 and reply.dim == 384
    assert grpc_health(ivy_keyed) == b"\x08\x01"  # no key needed


def test_the_key_never_reaches_the_log(ivy_keyed):
    post(ivy_keyed, "/v1/embeddings", BODY, f"Bearer {KEY}x")
    post(ivy_keyed, "/v1/embeddings", BODY, f"Bearer {KEY}")
    log = ivy_keyed.log()
    assert "api_key=true" in log
    assert KEY not in log


def test_without_a_key_any_authorization_header_is_ignored(ivy_minilm):
    status, _ = post(ivy_minilm, "/v1/embeddings", BODY, "Bearer whatever")
    assert status == 200


def test_request_ids_are_echoed_or_generated(ivy_minilm):
    status, headers, _ = ivy_minilm.request("POST", "/embed", b'{"inputs": "x"}',
                                            {"Content-Type": "application/json", "x-request-id": "trace-42"})
    assert status == 200 and headers["x-request-id"] == "trace-42"
    status, headers, _ = ivy_minilm.request("POST", "/embed", b"not json", {"Content-Type": "application/json"})
    assert status == 400 and len(headers["x-request-id"]) == 16
    _, h1, _ = ivy_minilm.request("GET", "/health")
    _, h2, _ = ivy_minilm.request("GET", "/health")
    assert h1["x-request-id"] != h2["x-request-id"]


def test_metrics_expose_the_documented_series(ivy_minilm, tulip_minilm):
    ivy_minilm.post_json("/v1/embeddings", {"input": ["metrics please", "two"]})
    ivy_minilm.post_json("/embed", {"inputs": []})
    m = ivy_minilm.metrics()
    # `model`: the pool that served the request (its model id).
    model = 'model="sentence-transformers/all-MiniLM-L6-v2"'
    assert m[f'ivy_requests_total{{api="openai",endpoint="embeddings",status="200",error="none",{model}}}'] >= 1
    assert m[f'ivy_requests_total{{api="tei",endpoint="embed",status="400",error="empty",{model}}}'] >= 1
    for stage in ["tokenize", "queue", "inference", "dispatch", "total"]:
        assert m[f'ivy_stage_duration_seconds_count{{stage="{stage}"}}'] >= 1, stage
    replica = f'{{replica="{tulip_minilm.url}",{model}}}'
    assert m[f"ivy_replica_up{replica}"] == 1
    assert m[f"ivy_replica_tokens_total{replica}"] > 0
    assert m[f"ivy_replica_inflight_tokens{replica}"] == 0
    for name in ["ivy_tokens_total", "ivy_chunks_total", "ivy_retries_total", "ivy_requests_in_flight"]:
        assert name in m, name


def grpc_health(ivy: Ivy, service: bytes = b"") -> bytes:
    """grpc.health.v1 Check on Ivy's gRPC port; the reply's field 1 is the
    status (b"\x08\x01" SERVING, b"\x08\x02" NOT_SERVING)."""
    with grpc.insecure_channel(ivy.grpc_target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=bytes,
                                    response_deserializer=bytes)
        return check(service, timeout=5)


def test_no_replica_means_not_ready_then_a_new_replica_is_admitted(minilm_dir, log_dir):
    port = free_port()
    ivy = Ivy([f"http://127.0.0.1:{port}"], minilm_dir, log_dir=log_dir, wait_ready=False)
    tulip = None
    try:
        assert ivy.get("/health") == (200, b"ok")
        status, body = ivy.get("/ready")
        assert status == 503 and json.loads(body)["ready"] is False
        assert grpc_health(ivy) == b"\x08\x02"
        status, body = ivy.post_json("/v1/embeddings", BODY)
        assert status == 503 and "no healthy Tulip replica" in body["error"]["message"]
        status, body = ivy.post_json("/embed", {"inputs": "x"})
        assert status == 503 and body["error_type"] == "Unhealthy"
        # A client is told when to come back (a replica may be starting).
        status, headers, _ = ivy.request("POST", "/v1/embeddings", json.dumps(BODY).encode(),
                                         {"content-type": "application/json"})
        assert status == 503 and {k.lower(): v for k, v in headers.items()}["retry-after"] == "5"
        tulip = Tulip(minilm_dir, port=port, log_dir=log_dir)
        wait_for(lambda: ivy.get("/ready")[0] == 200, "readiness")
        # gRPC health agrees with /ready at once.
        assert grpc_health(ivy) == b"\x08\x01"
        assert ivy.post_json("/v1/embeddings", BODY)[0] == 200
    finally:
        ivy.stop()
        if tulip:
            tulip.stop()


def test_dns_discovery_finds_the_replica(tulip_minilm, minilm_dir, log_dir):
    ivy = Ivy([], minilm_dir, log_dir=log_dir, tulip_dns=f"localhost:{tulip_minilm.port}", dns_interval=0.5)
    try:
        status, body = ivy.post_json("/v1/embeddings", BODY)
        assert status == 200, body
        assert ivy.series("ivy_replica_up", replica=tulip_minilm.url) == 1
    finally:
        ivy.stop()
