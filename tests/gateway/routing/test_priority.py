"""Priority classes through real processes: Ivy classifies every request (its
`priority` field, else its size) and tells Tulip, which runs interactive work
ahead of queued batch work. Orders and counters are asserted, never times."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import grpc
import pytest

from tests.support.servers import Ivy, Tulip, wait_for
from tulip.client import load_stubs


def series(tulip: Tulip, name: str) -> dict[str, float]:
    """``{class: value}`` of a per-class Tulip counter."""
    out = {"interactive": 0.0, "batch": 0.0}
    for m in re.finditer(rf'^{name}{{class="(\w+)"}} (\S+)$', tulip.metrics(), re.M):
        out[m.group(1)] = float(m.group(2))
    return out


@pytest.fixture(scope="module")
def stack(minilm_dir, log_dir):
    tulip = Tulip(minilm_dir, log_dir=log_dir)
    ivy = Ivy([tulip.url], tokenizer=False, log_dir=log_dir, interactive_max_tokens=32)
    yield tulip, ivy
    ivy.stop()
    tulip.stop()


def classified(tulip: Tulip, send) -> str:
    """The class whose token counter grew while ``send()`` ran."""
    before = series(tulip, "tulip_class_tokens_total")
    send()
    after = series(tulip, "tulip_class_tokens_total")
    grew = [c for c in after if after[c] > before[c]]
    assert len(grew) == 1, (before, after)
    return grew[0]


def ok(ivy: Ivy, path: str, body: dict) -> None:
    status, reply = ivy.post_json(path, body)
    assert status == 200, reply


def test_ivy_classifies_by_field_else_by_size(stack):
    tulip, ivy = stack
    long_text = "word " * 100  # over --interactive-max-tokens 32
    assert classified(tulip, lambda: ok(ivy, "/embed", {"inputs": "a short query"})) == "interactive"
    assert classified(tulip, lambda: ok(ivy, "/embed", {"inputs": long_text})) == "batch"
    assert classified(tulip, lambda: ok(ivy, "/embed", {"inputs": "short", "priority": "batch"})) == "batch"
    assert classified(
        tulip, lambda: ok(ivy, "/v1/embeddings", {"input": long_text, "priority": "interactive"})) == "interactive"
    assert series(tulip, "tulip_class_steps_total")["batch"] >= 2


def test_a_priority_that_is_not_one_of_the_two_is_refused(stack):
    tulip, ivy = stack
    for path, body in [("/embed", {"inputs": "x", "priority": "urgent"}),
                       ("/v1/embeddings", {"input": "x", "priority": 1})]:
        status, reply = ivy.post_json(path, body)
        assert 400 <= status < 500 and "priority" in str(reply), (status, reply)
    with tulip.client() as c, pytest.raises(grpc.RpcError) as e:
        c.embed_raw([[101, 2000, 102]], priority=9)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "priority" in e.value.details()


def test_grpc_requests_carry_their_priority(stack):
    tulip, ivy = stack
    pb2, pb2_grpc = load_stubs("ivy")
    with grpc.insecure_channel(ivy.grpc_target) as channel:
        stub = pb2_grpc.IvyStub(channel)
        batch = pb2.EmbedRequest(inputs=["short"], priority=pb2.PRIORITY_BATCH)
        assert classified(tulip, lambda: stub.Embed(batch, timeout=30)) == "batch"
        assert classified(tulip, lambda: stub.Embed(pb2.EmbedRequest(inputs=["short"]), timeout=30)) == "interactive"
        with pytest.raises(grpc.RpcError) as e:
            stub.Embed(pb2.EmbedRequest(inputs=["short"], priority=7), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


BACKLOG = 8  # batch requests, each exactly one engine step
SEQS, LENGTH = 8, 128  # per batch request: 8 x 128 = 1024 tokens = --max-batch-tokens


@pytest.mark.parametrize("priority", [True, False], ids=["priority", "fcfs"])
def test_a_query_overtakes_queued_batch_work_only_with_priorities(minilm_dir, log_dir, priority):
    tulip = Tulip(minilm_dir, log_dir=log_dir, priority=str(priority).lower(), max_batch_tokens=SEQS * LENGTH)
    try:
        done: list[str] = []
        lock = threading.Lock()

        def send(name: str, sequences: list[list[int]], cls: str) -> None:
            with tulip.client() as c:
                c.embed_raw(sequences, priority=cls)
            with lock:
                done.append(name)

        doc = [101] + [2000 + i for i in range(LENGTH - 2)] + [102]
        backlog = [threading.Thread(target=send, args=(f"batch-{i}", [doc] * SEQS, "batch"))
                   for i in range(BACKLOG)]
        for t in backlog:
            t.start()
        # At least four requests wait behind the running step.
        wait_for(lambda: tulip.metric("tulip_queued_sequences") >= 4 * SEQS, "a queued backlog", timeout=60,
                 every=0.005)
        with lock:
            done_before = len(done)
        send("query", [[101, 2054, 2003, 102]], "interactive")
        with lock:
            overtaken = done.index("query") - done_before
        for t in backlog:
            t.join(60)
        if priority:
            # Only the step running when the query arrived (and batch work
            # sharing the query's own step) can finish first.
            assert overtaken <= 2, done
        else:
            assert overtaken >= 3, done
    finally:
        tulip.stop()


@pytest.mark.parametrize("max_wait_ms", [200, 10**8], ids=["aging", "no-aging"])
def test_batch_work_is_not_starved_by_a_steady_interactive_stream(minilm_dir, log_dir, max_wait_ms):
    """Eight clients keep interactive work queued beyond every step's budget
    (two sequences), so without aging a batch request would wait for the
    stream to end; with it, it finishes while the stream still runs."""
    tulip = Tulip(minilm_dir, log_dir=log_dir, max_batch_tokens=2 * LENGTH, batch_max_wait_ms=max_wait_ms)
    try:
        doc = [101] + [2000 + i for i in range(LENGTH - 2)] + [102]
        stop = threading.Event()
        answered_after_batch = []
        batch_done = threading.Event()

        def interactive() -> None:
            with tulip.client() as c:
                while not stop.is_set():
                    c.embed_raw([doc], priority="interactive")
                    if batch_done.is_set():
                        answered_after_batch.append(1)

        stream = [threading.Thread(target=interactive) for _ in range(8)]
        for t in stream:
            t.start()
        wait_for(lambda: tulip.metric("tulip_queued_sequences") >= 4, "a standing interactive queue", timeout=60,
                 every=0.005)
        batch = threading.Thread(target=lambda: (tulip.client().embed_raw([doc], priority="batch"), batch_done.set()))
        batch.start()
        batch_done.wait(15)  # the stream runs this long at most
        in_stream = batch_done.is_set()
        time.sleep(0.5)  # interactive answers still arriving prove the stream was on
        stop.set()
        for t in stream:
            t.join(60)
        batch.join(60)
        assert batch_done.is_set(), "the batch request never finished"
        if max_wait_ms < 1000:
            assert in_stream and answered_after_batch, "batch work waited for the stream to end"
        else:
            # The control: without aging, strict priority starves it.
            assert not in_stream
        assert series(tulip, "tulip_class_steps_total")["batch"] >= 1
        m = re.search(r'^tulip_class_queue_duration_seconds_count\{class="batch"\} (\S+)$', tulip.metrics(), re.M)
        assert m and float(m.group(1)) >= 1
    finally:
        tulip.stop()


def test_every_client_sets_the_class(stack, tmp_path):
    """Issue 42 item 4: the routes not covered above, the bulk client and the
    Ray embedder each reach both classes (docs/api.md's table)."""
    tulip, ivy = stack
    long_text = "word " * 100
    # Cohere: Ivy's names, or Cohere's number (0 = interactive, above = batch).
    for body, cls in [({"texts": ["short"], "priority": "batch"}, "batch"),
                      ({"texts": [long_text], "priority": 0}, "interactive"),
                      ({"texts": ["short"], "priority": 3}, "batch"),
                      ({"texts": [long_text]}, "batch")]:
        assert classified(tulip, lambda b=body: ok(ivy, "/v2/embed", b)) == cls, body
    status, reply = ivy.post_json("/v2/embed", {"texts": ["x"], "priority": -1})
    assert status == 422 and "priority" in str(reply), (status, reply)
    # Hugging Face's root route: the body of the route it stands for.
    assert classified(tulip, lambda: ok(ivy, "/", {"inputs": "short", "priority": "batch"})) == "batch"
    assert classified(tulip, lambda: ok(ivy, "/", {"inputs": long_text, "priority": "interactive"})) == "interactive"
    # The bulk client: batch unless told otherwise.
    docs = tmp_path / "docs.txt"
    docs.write_text("a short document\nanother one\n")
    url = f"http://127.0.0.1:{ivy.port}"

    def bulk(*flags: str) -> None:
        subprocess.run([sys.executable, "-m", "tulip_rose_cli", "embed", str(docs), "--out",
                        str(tmp_path / f"out{len(flags)}.npy"), "--url", url, *flags], check=True, timeout=120,
                       capture_output=True)

    assert classified(tulip, bulk) == "batch"
    assert classified(tulip, lambda: bulk("--priority", "interactive")) == "interactive"
    # The Ray embedder that sends to Ivy, called as Ray Data would call it.
    pytest.importorskip("pyarrow")
    from tulip_rose_cli.ray import IvyEmbedder

    for cls in ("batch", "interactive"):
        embedder = IvyEmbedder(url, priority=cls)
        assert classified(tulip, lambda e=embedder: e({"text": ["short"]})) == cls
    with pytest.raises(ValueError, match="priority"):
        IvyEmbedder(url, priority="urgent")
