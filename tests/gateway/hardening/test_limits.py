"""Limits through real processes: over the concurrency limit Ivy answers 429 at
once and recovers; the per-request timeout answers 504; the token limit
answers 422/413; SIGTERM drains (in-flight requests finish, then Ivy exits)."""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.harness.fixtures import corpus_lines
from tests.support.servers import Ivy, wait_for

pytestmark = pytest.mark.slow

# Long multilingual passages: 64 of them truncate to 256 tokens each, so a
# request keeps a CPU replica busy for a while.
HEAVY = {"input": corpus_lines("calibration_miracl.txt")[:64]}



def burst(ivy: Ivy, path: str, payload: dict, n: int) -> list[tuple[int, object]]:
    """`n` requests released at the same instant."""
    start = threading.Barrier(n)

    def one(_):
        start.wait()
        return ivy.post_json(path, payload)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


@pytest.fixture(scope="module")
def ivy_limited(tulip_minilm, minilm_dir, log_dir):
    proc = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, max_concurrent_requests=2,
               max_tokens_per_request=1000)
    yield proc
    proc.stop()


def test_over_the_concurrency_limit_is_429_at_once_then_recovers(ivy_limited):
    results = burst(ivy_limited, "/v1/embeddings", {"input": HEAVY["input"][:3]}, 12)
    statuses = [s for s, _ in results]
    assert 200 in statuses and 429 in statuses, statuses
    assert set(statuses) <= {200, 429}
    for status, body in results:
        if status == 429:
            assert body["error"]["code"] == "overloaded" and body["error"]["type"] == "rate_limit_error"
            assert "limit 2" in body["error"]["message"]
    # TEI routes answer the same limit in TEI's shape.
    tei = burst(ivy_limited, "/embed", {"inputs": HEAVY["input"][:3], "truncate": True}, 12)
    refused = [b for s, b in tei if s == 429]
    assert refused and all(b["error_type"] == "Overloaded" for b in refused)
    # Nothing queued behind: once the burst is over, requests pass again.
    for _ in range(3):
        status, body = ivy_limited.post_json("/v1/embeddings", {"input": "recovered"})
        assert status == 200, body
    m = ivy_limited.metrics()
    assert ivy_limited.series("ivy_requests_total", endpoint="embeddings", status="429", error="overloaded") >= 1
    assert m["ivy_requests_in_flight"] == 0


def test_token_limit_per_request(ivy_limited):
    status, body = ivy_limited.post_json("/v1/embeddings", HEAVY)
    assert status == 422 and "over the limit of 1000 per request" in body["error"]["message"], body
    status, body = ivy_limited.post_json("/embed", {"inputs": HEAVY["input"], "truncate": True})
    assert status == 422 and body["error_type"] == "Validation", body


def test_request_timeout_is_504_and_server_keeps_serving(tulip_minilm, minilm_dir, log_dir):
    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, request_timeout=0.2)
    try:
        many = {"input": HEAVY["input"] * 8}
        status, body = ivy.post_json("/v1/embeddings", many)
        assert status == 504, body
        assert "deadline" in body["error"]["message"] and "request id" in body["error"]["message"]
        status, body = ivy.post_json("/embed", {"inputs": many["input"], "truncate": True})
        assert status == 504 and body["error_type"] == "Backend", body
        # The replica may still be busy with the abandoned work; a small
        # request gets through once it is done.
        wait_for(lambda: ivy.post_json("/v1/embeddings", {"input": "x"})[0] == 200, "recovery", timeout=120)
    finally:
        ivy.stop()


def test_sigterm_drains_in_flight_requests_then_exits(tulip_minilm, minilm_dir, log_dir):
    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, drain_timeout=60)
    outcome = {}

    def slow():
        outcome["result"] = ivy.post_json("/v1/embeddings", {"input": HEAVY["input"] * 2})

    worker = threading.Thread(target=slow)
    worker.start()
    wait_for(lambda: ivy.metrics()["ivy_requests_in_flight"] >= 1, "the request in flight")
    ivy.signal(signal.SIGTERM)
    worker.join(120)
    status, body = outcome["result"]
    assert status == 200 and len(body["data"]) == 128
    assert ivy.proc.wait(60) == 0
    log = ivy.log()
    assert "draining" in log and "drained; exiting" in log
    assert ivy.get("/health")[0] == 0  # no longer listening
