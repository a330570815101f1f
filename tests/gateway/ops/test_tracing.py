"""OpenTelemetry traces across Ivy and Tulip (``--otlp-endpoint``): real
processes export over OTLP/gRPC to a collector started here (the
``TraceService/Export`` RPC built on ``opentelemetry-proto``'s messages); a
request carrying a W3C ``traceparent`` yields one trace, Ivy's stages above
Tulip's phases, with request id, token counts and replica as attributes."""

from __future__ import annotations

from collections import defaultdict

import grpc
import pytest

from tests.support.servers import Ivy, Tulip, wait_for

pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
from bench.harness.otlp import Collector  # noqa: E402 (needs opentelemetry-proto)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
# Export every 100 ms instead of the batch processor's default 5 s.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="module")
def collector():
    c = Collector().start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def traced(collector, minilm_dir, log_dir):
    tulip = Tulip(minilm_dir, log_dir=log_dir, env=FAST_EXPORT, otlp_endpoint=collector.endpoint)
    try:
        # Small chunks: a request of two texts becomes two dispatches.
        ivy = Ivy([tulip.url], tokenizer=False, log_dir=log_dir, env=FAST_EXPORT,
                  otlp_endpoint=collector.endpoint, chunk_tokens=8)
        try:
            yield ivy, tulip
        finally:
            ivy.stop()
    finally:
        tulip.stop()


def _trace(collector, trace_id: str, want: set[tuple[str, str]]) -> list[dict]:
    """The spans of ``trace_id`` once every (service, name) in ``want`` arrived."""
    def ready():
        spans = [s for s in collector.snapshot() if s["trace_id"] == trace_id]
        return spans if want <= {(s["service"], s["name"]) for s in spans} else None
    return wait_for(ready, f"spans {sorted(want)} of trace {trace_id}", timeout=30)


def test_one_trace_from_the_caller_through_ivy_into_tulip(traced, collector):
    ivy, tulip = traced
    texts = ["the first text, long enough to fill a chunk", "and a second one of several words"]
    status, body = ivy.post_json("/v1/embeddings", {"input": texts}, {
        "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01", "x-request-id": "traced-1"})
    assert status == 200, body
    tokens = body["usage"]["prompt_tokens"]

    want = {("ivy", n) for n in ("request", "parse", "tokenize", "dispatch", "attempt", "render")}
    want |= {("tulip", n) for n in ("embed", "queue_wait", "engine_step", "completion")}
    spans = _trace(collector, TRACE_ID, want)
    by_id = {s["span_id"]: s for s in spans}
    named = defaultdict(list)
    for s in spans:
        named[(s["service"], s["name"])].append(s)

    def parent(s):
        return by_id.get(s["parent"])

    # Ivy continues the caller's trace under the caller's span.
    [request] = named[("ivy", "request")]
    assert request["parent"] == CALLER_SPAN
    assert request["attrs"]["id"] == "traced-1"
    assert request["attrs"]["path"] == "/v1/embeddings"
    assert request["attrs"]["tokens"] == tokens
    for stage in ("parse", "tokenize", "render"):
        [s] = named[("ivy", stage)]
        assert parent(s) is request, stage
    assert named[("ivy", "tokenize")][0]["attrs"]["tokens"] == tokens
    assert named[("ivy", "tokenize")][0]["attrs"]["inputs"] == 2

    # One dispatch per chunk, each with its attempt, each reaching Tulip.
    dispatches = named[("ivy", "dispatch")]
    assert len(dispatches) == 2
    assert all(parent(d) is request for d in dispatches)
    assert sum(d["attrs"]["tokens"] for d in dispatches) == tokens
    embeds = named[("tulip", "embed")]
    assert len(embeds) == 2
    for embed in embeds:
        attempt = parent(embed)
        assert attempt is not None and attempt["name"] == "attempt" and attempt["service"] == "ivy"
        assert attempt["attrs"]["replica"] == tulip.url and attempt["attrs"]["attempt"] == 1
        dispatch = parent(attempt)
        assert dispatch in dispatches
        assert embed["attrs"]["request_id"] == "traced-1"
        assert embed["attrs"]["tokens"] == dispatch["attrs"]["tokens"]
        # Tulip's phases under its request span, in order, inside it.
        phases = {s["name"]: s for s in spans if s["parent"] == embed["span_id"]}
        assert set(phases) == {"queue_wait", "engine_step", "completion"}
        assert all(p["service"] == "tulip" for p in phases.values())
        assert phases["engine_step"]["attrs"]["tokens"] == embed["attrs"]["tokens"]
        assert phases["queue_wait"]["attrs"]["priority"] == "interactive"
        q, e, c = phases["queue_wait"], phases["engine_step"], phases["completion"]
        slack = 2_000_000  # 2 ms: the phases are placed from microsecond timings
        assert embed["start"] - slack <= q["start"] <= q["end"] <= e["end"] <= c["start"] + slack
        assert c["end"] <= embed["end"] + slack
    # Every span of both processes is in this one trace.
    assert {s["service"] for s in spans} == {"ivy", "tulip"}


def test_the_trace_crosses_tulip_frames_on_a_unix_socket(collector, minilm_dir, log_dir):
    """Tulip frames carry no metadata: the traceparent rides in the frame."""
    import tempfile

    sock = tempfile.mktemp(prefix="tulip-traced-", suffix=".sock")
    tulip = Tulip(minilm_dir, log_dir=log_dir, env=FAST_EXPORT, otlp_endpoint=collector.endpoint,
                  unix_socket=sock)
    try:
        ivy = Ivy([f"unix://{sock}"], tokenizer=False, log_dir=log_dir, env=FAST_EXPORT,
                  otlp_endpoint=collector.endpoint)
        try:
            trace_id = "5c0ffee5" * 4
            status, body = ivy.post_json("/v1/embeddings", {"input": "over frames"}, {
                "traceparent": f"00-{trace_id}-{CALLER_SPAN}-01", "x-request-id": "traced-frames"})
            assert status == 200, body
            spans = _trace(collector, trace_id, {("ivy", "attempt"), ("tulip", "embed")})
            assert "tulip_frames_connections 1" in tulip.metrics().splitlines()
        finally:
            ivy.stop()
    finally:
        tulip.stop()
    by_id = {s["span_id"]: s for s in spans}
    [embed] = [s for s in spans if (s["service"], s["name"]) == ("tulip", "embed")]
    attempt = by_id.get(embed["parent"])
    assert attempt is not None and (attempt["service"], attempt["name"]) == ("ivy", "attempt")
    assert attempt["attrs"]["replica"] == f"unix://{sock}"
    assert embed["attrs"]["request_id"] == "traced-frames"


def test_grpc_front_continues_the_callers_trace(traced, collector):
    from tulip.client import load_stubs

    ivy, _ = traced
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4737"
    pb2, pb2_grpc = load_stubs("ivy")
    with grpc.insecure_channel(ivy.grpc_target) as channel:
        pb2_grpc.IvyStub(channel).Embed(pb2.EmbedRequest(inputs=["hello"]), timeout=30, metadata=[
            ("traceparent", f"00-{trace_id}-{CALLER_SPAN}-01"), ("x-request-id", "traced-grpc")])
    spans = _trace(collector, trace_id, {("ivy", "request"), ("tulip", "embed")})
    [request] = [s for s in spans if s["name"] == "request"]
    assert request["parent"] == CALLER_SPAN and request["attrs"]["rpc"] == "embed"
    assert request["attrs"]["id"] == "traced-grpc"


def test_without_a_traceparent_ivy_starts_a_trace(traced, collector):
    ivy, _ = traced
    status, _ = ivy.post_json("/v1/embeddings", {"input": "no caller trace"}, {"x-request-id": "traced-new"})
    assert status == 200

    def roots():
        return [s for s in collector.snapshot()
                if s["name"] == "request" and s["attrs"].get("id") == "traced-new"]
    [root] = wait_for(roots, "the new trace's root span", timeout=30)
    assert root["parent"] == "" and root["trace_id"] != TRACE_ID
    wait_for(lambda: any(s["trace_id"] == root["trace_id"] and s["service"] == "tulip"
                         for s in collector.snapshot()), "Tulip's spans in the new trace", timeout=30)


def test_probes_and_scrapes_start_no_trace(traced, collector):
    ivy, _ = traced
    for path in ("/health", "/ready", "/metrics"):
        assert ivy.get(path)[0] == 200
    # A request after them: once its spans are in, the probes' would be too.
    status, _ = ivy.post_json("/v1/embeddings", {"input": "after the probes"}, {"x-request-id": "traced-after"})
    assert status == 200
    wait_for(lambda: any(s["attrs"].get("id") == "traced-after" for s in collector.snapshot()),
             "the request's spans", timeout=30)
    paths = {s["attrs"].get("path") for s in collector.snapshot() if s["name"] == "request"}
    assert not paths & {"/health", "/ready", "/metrics"}, paths


def test_off_by_default_a_traceparent_changes_nothing(ivy_minilm, tulip_minilm):
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": "x"}, {
        "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"})
    assert status == 200 and len(body["data"][0]["embedding"]) == 384
    for process in (ivy_minilm, tulip_minilm):
        assert "exporting traces" not in process.log()
