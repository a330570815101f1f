"""Coalescing in Ivy (ivy/src/upstream/coalesce/): small requests read together
share one Tulip call and each gets its own rows back; a bad request among
them fails alone, and a shared call refused because of one request is
retried chunk by chunk, so only that request fails."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.request

import numpy as np
import pytest

from bench.harness.fixtures import corpus_lines
from tests.support import fault_engine
from tests.support.servers import Ivy

BURST = 24


def burst(port: int, bodies: list[dict]) -> list[tuple[int, dict]]:
    """Every body POSTed at once, each on its own connection."""
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for _ in bodies]
    for c in conns:
        c.connect()
    gate = threading.Barrier(len(bodies))
    out: list = [None] * len(bodies)

    def send(i: int) -> None:
        payload = json.dumps(bodies[i])
        gate.wait()
        conns[i].request("POST", "/v1/embeddings", payload, {"Content-Type": "application/json"})
        r = conns[i].getresponse()
        out[i] = (r.status, json.loads(r.read()))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    return out


def shared_calls(ivy: Ivy) -> float:
    return ivy.metrics().get("ivy_shared_calls_total", 0.0)


def vector(reply: dict) -> np.ndarray:
    return np.asarray(reply["data"][0]["embedding"], dtype=np.float64)


def test_requests_read_together_share_a_call_and_get_their_own_rows(ivy_minilm):
    texts = corpus_lines()[:BURST]
    # A third ask for Matryoshka dimensions: other options, so another call.
    bodies = [{"input": t, **({"dimensions": 128} if i % 3 == 0 else {})} for i, t in enumerate(texts)]
    expected = []
    for b in bodies:  # one at a time: every request alone on its call
        status, reply = ivy_minilm.post_json("/v1/embeddings", b)
        assert status == 200, reply
        expected.append(vector(reply))
    before = shared_calls(ivy_minilm)
    for _ in range(10):
        for (status, reply), want, body in zip(burst(ivy_minilm.port, bodies), expected, bodies):
            assert status == 200, reply
            got = vector(reply)
            assert got.shape == want.shape == (body.get("dimensions", 384),)
            cos = got @ want / (np.linalg.norm(got) * np.linalg.norm(want))
            assert cos >= 0.9999, (body, cos)
            assert reply["usage"]["prompt_tokens"] > 0
        if shared_calls(ivy_minilm) > before:
            break
    assert shared_calls(ivy_minilm) > before, "no burst of simultaneous requests shared a call"


def test_a_bad_request_in_a_burst_fails_alone(ivy_minilm):
    texts = corpus_lines()[:BURST]
    bodies = [{"input": t} for t in texts]
    bad = BURST // 2
    bodies[bad] = {"input": [[101, 10 ** 6, 102]]}  # a token id outside the vocabulary
    before = shared_calls(ivy_minilm)
    for _ in range(10):
        for i, (status, reply) in enumerate(burst(ivy_minilm.port, bodies)):
            if i == bad:
                assert 400 <= status < 500, reply
            else:
                assert status == 200, (i, reply)
                assert len(reply["data"][0]["embedding"]) == 384
        if shared_calls(ivy_minilm) > before:
            break
    assert shared_calls(ivy_minilm) > before


@pytest.fixture(scope="module")
def refusing_stack(tmp_path_factory, minilm_dir):
    """Ivy in front of the null engine that refuses any step holding token 9
    (tests/support/fault_engine.py), one sequence per step."""
    model = tmp_path_factory.mktemp("null-model")
    (model / "config.json").write_text(json.dumps(
        {"model_type": "null", "hidden_size": 8, "vocab_size": 30522, "max_position_embeddings": 64}))
    logs = tmp_path_factory.mktemp("logs")
    tulip, port, metrics_port = fault_engine.start(model, logs, max_batch_sequences=1)
    try:
        ivy = Ivy([f"http://127.0.0.1:{port}"], minilm_dir, log_dir=logs)
    except Exception:
        tulip.stop()
        raise
    yield ivy, metrics_port
    ivy.stop()
    tulip.stop()


def refused_calls(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith('tulip_requests_total{code="invalid_argument"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_shared_call_refused_for_one_request_is_retried_chunk_by_chunk(refusing_stack):
    ivy, metrics_port = refusing_stack
    bodies = [{"input": [[101, 4 + i % 3, 102]]} for i in range(BURST)]  # 7, 8 and 9 fail
    bad = BURST // 2
    bodies[bad] = {"input": [[101, 9, 102]]}
    for _ in range(10):
        before = refused_calls(metrics_port)
        for i, (status, reply) in enumerate(burst(ivy.port, bodies)):
            if i == bad:
                assert status == 422 and "injected refusal" in json.dumps(reply), reply
            else:
                assert status == 200, (i, reply)
                assert len(reply["data"][0]["embedding"]) == 8
        # Refused twice: in the shared call, then on its own.
        if refused_calls(metrics_port) - before >= 2:
            break
    else:
        pytest.fail("the refused request never travelled in a shared call")
