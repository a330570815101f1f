"""Chunking and balancing through real processes: Ivy in front of three Tulip
replicas on the real default model. A large request is cut on the token
budget, spread over every replica and reassembled in order, identical to a
single-replica run; a replica killed with SIGKILL mid-stream costs no client
request and is used again once restarted."""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import numpy as np
import pytest

from bench.harness.fixtures import corpus_lines
from tests.support.http import embeddings_reply, vectors
from tests.support.servers import Ivy, Tulip, start_tulips, wait_for

pytestmark = pytest.mark.slow


def texts(n: int, offset: int = 0) -> list[str]:
    """Real lines of varied length: short English and long multilingual."""
    miracl = corpus_lines("calibration_miracl.txt")
    botchan = [line for line in corpus_lines("botchan.txt") if len(line) > 3]
    mixed = [x for pair in zip(miracl[offset:], botchan[offset:]) for x in pair]
    assert len(mixed) >= n
    return mixed[:n]



def series(ivy: Ivy, name: str, replica: Tulip) -> float:
    return ivy.series(name, replica=replica.url)


def embed(ivy: Ivy, inputs: list[str]) -> tuple[np.ndarray, int]:
    reply = embeddings_reply(ivy, inputs)
    return vectors(reply), reply["usage"]["prompt_tokens"]


@pytest.fixture(scope="module")
def cluster(minilm_dir, log_dir):
    replicas = start_tulips(3, minilm_dir, log_dir=log_dir, threads=1)
    ivy = Ivy([t.url for t in replicas], minilm_dir, log_dir=log_dir, chunk_tokens=512, max_attempts=3)
    single = Ivy([replicas[0].url], minilm_dir, log_dir=log_dir, chunk_tokens=0)
    yield ivy, single, replicas
    ivy.stop()
    single.stop()
    for t in replicas:
        t.stop()


def test_large_request_is_spread_and_reassembled_in_order(cluster):
    ivy, single, replicas = cluster
    inputs = texts(100)
    before = {t.url: series(ivy, "ivy_replica_tokens_total", t) for t in replicas}
    chunks_before = ivy.metrics()["ivy_chunks_total"]

    got, tokens = embed(ivy, inputs)
    want, want_tokens = embed(single, inputs)

    assert tokens == want_tokens
    assert got.shape == (100, 384)
    assert np.allclose(got, want, atol=1e-5), np.abs(got - want).max()
    after = {t.url: series(ivy, "ivy_replica_tokens_total", t) for t in replicas}
    spread = {url: after[url] - before[url] for url in after}
    assert all(v > 0 for v in spread.values()), spread
    assert sum(spread.values()) == tokens
    # 100 inputs of up to 256 tokens on a 512-token budget: many chunks.
    assert ivy.metrics()["ivy_chunks_total"] - chunks_before >= tokens / 512


def test_concurrent_requests_keep_their_own_rows(cluster):
    ivy, single, _ = cluster
    batches = [texts(12, offset=20 * i) for i in range(8)]
    want = [embed(single, b)[0] for b in batches]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda b: embed(ivy, b)[0], batches))
    for g, w in zip(got, want):
        assert np.allclose(g, w, atol=1e-5)


def drain_seconds(log: str) -> float:
    """Seconds from Tulip's "stopping" line to its "stopped" line."""
    times = {}
    for line in log.splitlines():
        for word in ("stopping", "stopped"):
            if f"_native::server: {word}" in line:
                times[word] = datetime.fromisoformat(line.split()[0])
    return (times["stopped"] - times["stopping"]).total_seconds()


def stream_while(ivy: Ivy, batch: list[str], want: np.ndarray, victim: Tulip, event) -> None:
    """Four clients send `batch` in a loop; once `victim` holds work from
    this Ivy, `event(victim)` happens; a dozen more requests follow. Every
    request must succeed with the right vectors."""
    results: list[tuple[int, object]] = []
    stop = threading.Event()

    def client():
        while not stop.is_set():
            results.append(ivy.post_json("/v1/embeddings", {"input": batch}))

    with ThreadPoolExecutor(4) as pool:
        for _ in range(4):
            pool.submit(client)
        wait_for(lambda: series(ivy, "ivy_replica_inflight_tokens", victim) > 0, "load on the replica")
        event(victim)
        at_event = len(results)
        wait_for(lambda: len(results) >= at_event + 12, "requests after the event", timeout=300)
        stop.set()

    failures = [(s, b) for s, b in results if s != 200]
    assert not failures, failures[:3]
    for _, body in results:
        got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        assert np.allclose(got, want, atol=1e-5)


def test_kill_9_mid_stream_costs_no_request_and_replica_is_readmitted(cluster, log_dir):
    ivy, single, replicas = cluster
    victim = replicas[1]
    batch = texts(16)
    want, _ = embed(single, batch)
    retries_before = ivy.metrics().get("ivy_retries_total", 0.0)

    # Killed while it holds work from this Ivy: a chunk must be retried.
    stream_while(ivy, batch, want, victim, Tulip.kill)
    assert ivy.metrics()["ivy_retries_total"] > retries_before
    assert series(ivy, "ivy_replica_up", victim) == 0

    # Restart on the same port: health checks admit it again and it gets work.
    restarted = Tulip(victim.model_dir, port=victim.port, log_dir=log_dir, threads=1)
    replicas[1] = restarted
    wait_for(lambda: series(ivy, "ivy_replica_up", restarted) == 1, "re-admission")
    before = series(ivy, "ivy_replica_tokens_total", restarted)
    embed(ivy, texts(30))
    assert series(ivy, "ivy_replica_tokens_total", restarted) > before


def test_draining_replica_finishes_its_work_and_gets_no_more(cluster, log_dir):
    ivy, single, replicas = cluster
    leaving = replicas[2]
    batch = texts(16, offset=40)
    want, _ = embed(single, batch)

    # SIGTERM: Tulip answers NOT_SERVING and refuses new calls while it
    # finishes the chunks it holds, then exits.
    stream_while(ivy, batch, want, leaving, lambda t: t.signal(signal.SIGTERM))
    assert leaving.proc.wait(60) == 0
    # Marked draining (by its health answer, or by a refused call that says
    # it drains), not lost. A drain shorter than Ivy's health interval
    # (0.2 s) that no call reached can end before Ivy looks: the replica then
    # goes straight to down, which loses nothing either (checked above).
    drained_s = drain_seconds(leaving.log())
    assert f'replica={leaving.url} from="serving" to="draining"' in ivy.log() or drained_s < 0.5, drained_s
    assert series(ivy, "ivy_replica_up", leaving) == 0
    assert series(ivy, "ivy_replica_inflight_tokens", leaving) == 0

    restarted = Tulip(leaving.model_dir, port=leaving.port, log_dir=log_dir, threads=1)
    replicas[2] = restarted
    wait_for(lambda: series(ivy, "ivy_replica_up", restarted) == 1, "re-admission")
