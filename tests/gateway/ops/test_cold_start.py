"""Scale from zero (``--cold-start-hold``): Ivy with no replica running
holds requests, counts them on ``ivy_held_requests`` (what the chart's KEDA
activation trigger reads), and answers them once a Tulip replica starts;
past the hold it answers 503 with ``Retry-After``, never a 404 or a broken
connection."""

from __future__ import annotations

import json
import threading

from tests.support.servers import Ivy, Tulip, free_port, wait_for

BODY = {"input": ["held until a replica starts", "second"]}


def test_requests_held_while_no_replica_runs_are_answered_when_one_starts(minilm_dir, log_dir):
    port = free_port()  # nothing listens here yet: the pool is at zero
    ivy = Ivy([f"http://127.0.0.1:{port}"], minilm_dir, log_dir=log_dir, wait_ready=False, cold_start_hold=300)
    tulip = None
    results: list[tuple[int, object]] = []

    def client():
        results.append(ivy.post_json("/v1/embeddings", BODY))

    threads = [threading.Thread(target=client) for _ in range(3)]
    try:
        # Holding Ivy stays ready, so its Service keeps taking the requests.
        assert ivy.get("/ready")[0] == 200
        for t in threads:
            t.start()
        wait_for(lambda: ivy.metrics().get("ivy_held_requests") == 3, "three held requests")
        assert results == []
        tulip = Tulip(minilm_dir, port=port, log_dir=log_dir)
        for t in threads:
            t.join(timeout=120)
        assert [status for status, _ in results] == [200, 200, 200], results
        assert all(len(body["data"]) == 2 and len(body["data"][0]["embedding"]) == 384 for _, body in results)
        assert ivy.metrics()["ivy_held_requests"] == 0
    finally:
        ivy.stop()
        if tulip:
            tulip.stop()


def test_past_the_hold_the_answer_is_503_with_retry_after(minilm_dir, log_dir):
    ivy = Ivy([f"http://127.0.0.1:{free_port()}"], minilm_dir, log_dir=log_dir, wait_ready=False,
              cold_start_hold=0.5)
    try:
        for path, body in [("/v1/embeddings", BODY), ("/embed", {"inputs": "x"})]:
            status, headers, raw = ivy.request("POST", path, json.dumps(body).encode(),
                                               {"content-type": "application/json"})
            assert status == 503, (path, raw)
            assert int({k.lower(): v for k, v in headers.items()}["retry-after"]) >= 1
            assert b"--cold-start-hold" in raw
        assert ivy.metrics()["ivy_held_requests"] == 0
    finally:
        ivy.stop()
