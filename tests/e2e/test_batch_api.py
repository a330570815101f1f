"""The OpenAI Batch API end to end, with the official ``openai`` client: a
file uploaded, a batch created over it, run by real Ivy processes sharing
one embedded store (SQLite + a directory) over a real Tulip on the embedded
MiniLM; vectors equal to ``/v1/embeddings`` for the same bodies and to
sentence-transformers; bad lines failing alone; files and batches owned
by their API key; cancel; and an Ivy killed mid-batch whose shard another
Ivy resumes, every ``custom_id`` exactly once in the output."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest

from tests.support.openai_batch import (
    KEYS,
    TEXTS,
    assert_every_line_once,
    client,
    corpus,
    jsonl,
    line,
    submit,
    wait_done,
)
from tests.support.servers import Ivy
from tulip_rose_cli.processes import wait_for

pytestmark = pytest.mark.slow

openai = pytest.importorskip("openai")

@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("batch-store")


def _ivy(tulip, minilm_dir, log_dir, store, **flags):
    settings = {"batch_shard_lines": 25, "batch_lease": 2, "batch_max_file_bytes": 1_000_000, **flags}
    return Ivy([tulip.url], minilm_dir, log_dir=log_dir, api_key=",".join(KEYS), batch_dir=str(store), **settings)


@pytest.fixture(scope="module")
def ivy(tulip_minilm, minilm_dir, log_dir, store):
    proc = _ivy(tulip_minilm, minilm_dir, log_dir, store)
    yield proc
    proc.stop()


def test_openai_client_end_to_end_equals_embeddings_and_sentence_transformers(ivy, st_minilm):
    c = client(ivy)
    bodies = {f"q{i}": {"input": t} for i, t in enumerate(TEXTS)}
    bodies["many"] = {"input": TEXTS[:3]}
    bodies["short"] = {"input": TEXTS[0], "dimensions": 64}
    text = "".join(line(k, v) for k, v in bodies.items())
    f, b = submit(c, text, metadata={"job": "e2e"})
    assert (f.purpose, f.bytes, f.filename) == ("batch", len(text.encode()), "requests.jsonl")
    assert b.status == "validating" and b.metadata == {"job": "e2e"} and b.input_file_id == f.id
    done = wait_done(c, b.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (8, 8, 0)
    assert done.error_file_id is None and done.completed_at >= done.in_progress_at >= done.created_at
    out = jsonl(c, done.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(bodies)
    direct = openai.OpenAI(base_url=ivy.url + "/v1", api_key=KEYS[0])
    for o in out:
        assert o["error"] is None and o["response"]["status_code"] == 200 and o["id"].startswith("batch_req_")
        assert o["response"]["request_id"]
        got = [d["embedding"] for d in o["response"]["body"]["data"]]
        want = direct.embeddings.create(**{"model": o["response"]["body"]["model"], **bodies[o["custom_id"]]})
        # Equal up to float noise: a batch's lines share steps with others.
        assert np.allclose(np.asarray(got), np.asarray([d.embedding for d in want.data]), atol=1e-5)
    ref = st_minilm.encode(TEXTS, normalize_embeddings=True)
    rows = {o["custom_id"]: np.asarray(o["response"]["body"]["data"][0]["embedding"]) for o in out}
    for i in range(len(TEXTS)):
        assert float(rows[f"q{i}"] @ ref[i]) >= 0.999
    assert c.batches.retrieve(b.id).usage.input_tokens > 0
    assert any(x.id == b.id for x in c.batches.list(limit=100).data)


def test_a_bad_line_fails_alone(ivy):
    c = client(ivy)
    text = (line("good", {"input": "fine"}) + "{not json\n" + line("empty", {"input": []})
            + json.dumps({"custom_id": "nobody", "method": "POST", "url": "/v1/embeddings"}) + "\n"
            + line("good2", {"input": "also fine"}))
    _, b = submit(c, text)
    done = wait_done(c, b.id)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (5, 2, 3)
    assert sorted(o["custom_id"] for o in jsonl(c, done.output_file_id)) == ["good", "good2"]
    errors = {e["custom_id"]: e for e in jsonl(c, done.error_file_id)}
    assert errors["empty"]["response"]["status_code"] == 422
    assert errors["empty"]["response"]["body"]["error"]["message"]
    assert errors["nobody"]["error"]["code"] == "invalid_body" and errors["nobody"]["response"] is None
    assert errors[None]["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("text, code", [
    (line("a", {"input": "x"}) + line("a", {"input": "y"}), "duplicate_custom_id"),
    (line("a", {"input": "x", "model": "one"}) + line("b", {"input": "y", "model": "two"}), "mismatched_model"),
    (line("a", {"input": "x"}) + line("b", {"input": "y"}, url="/v1/chat/completions"), "mismatched_endpoint"),
    ("\n\n", "empty_file"),
])
def test_a_file_openai_would_refuse_fails_the_batch(ivy, text, code):
    c = client(ivy)
    _, b = submit(c, text)
    done = wait_done(c, b.id)
    assert done.status == "failed" and done.failed_at
    assert done.errors.data[0].code == code and done.errors.data[0].message


def test_requests_refused_at_once(ivy):
    c = client(ivy)
    with pytest.raises(openai.APIStatusError) as e:
        c.files.create(file=("big.jsonl", b"x" * 1_000_001), purpose="batch")
    assert e.value.status_code == 413 and "--batch-max-file-bytes" in str(e.value)
    with pytest.raises(openai.UnprocessableEntityError):
        c.files.create(file=("a.jsonl", b"{}"), purpose="fine-tune")
    f = c.files.create(file=("a.jsonl", line("a", {"input": "x"}).encode()), purpose="batch")
    with pytest.raises(openai.UnprocessableEntityError, match="endpoint"):
        c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.UnprocessableEntityError, match="completion_window"):
        c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="forever")
    with pytest.raises(openai.NotFoundError):
        c.batches.create(input_file_id="file-0123456789abcdef01234567", endpoint="/v1/embeddings",
                         completion_window="24h")
    for bad in ("../../etc/passwd", "file-0123456789abcdef01234567", "%2e%2e"):
        status, _, _ = ivy.request("GET", f"/v1/files/{bad}/content", headers={"Authorization": f"Bearer {KEYS[0]}"})
        assert status == 404, bad


def test_files_and_batches_belong_to_their_key(ivy):
    a, b = client(ivy, KEYS[0]), client(ivy, KEYS[1])
    f, batch = submit(a, line("x", {"input": "mine"}))
    for call in (lambda: b.files.retrieve(f.id), lambda: b.files.content(f.id), lambda: b.files.delete(f.id),
                 lambda: b.batches.retrieve(batch.id), lambda: b.batches.cancel(batch.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert all(x.id != batch.id for x in b.batches.list().data)
    assert all(x.id != f.id for x in b.files.list().data)
    with pytest.raises(openai.AuthenticationError):
        client(ivy, "gamma-key").files.list()
    done = wait_done(a, batch.id)
    assert a.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        a.files.retrieve(f.id)
    assert jsonl(a, done.output_file_id)[0]["custom_id"] == "x"


def test_cancel_keeps_what_finished(ivy):
    c = client(ivy)
    _, b = submit(c, corpus(1500, "c"))
    wait_for(lambda: c.batches.retrieve(b.id).request_counts.completed > 0, "some lines done", timeout=60)
    assert c.batches.cancel(b.id).status == "cancelling"
    done = wait_done(c, b.id, timeout=30)
    assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
    out = jsonl(c, done.output_file_id)
    assert 0 < len(out) == done.request_counts.completed < 1500
    assert len({o["custom_id"] for o in out}) == len(out)
    with pytest.raises(openai.UnprocessableEntityError):
        c.batches.cancel(b.id)


def test_an_ivy_killed_mid_batch_loses_and_repeats_nothing(ivy, tulip_minilm, minilm_dir, log_dir, store):
    """Two Ivy processes share the store; one is killed (SIGKILL) while both
    run shards: its shards are taken over when their leases lapse and
    resumed from their last checkpoints."""
    other = _ivy(tulip_minilm, minilm_dir, log_dir, store)
    try:
        c = client(ivy)
        n = 2000
        _, b = submit(c, corpus(n, "k"))
        # Killed while it works and holds a shard (the store says so: killed
        # between two shards it would leave nothing to resume, as a CI run
        # once did), having run lines of this batch already.
        wait_for(lambda: c.batches.retrieve(b.id).request_counts.completed >= 100
                 and other.series("ivy_requests_total", endpoint="embeddings") > 0
                 and _holds_a_shard(store, other.pid, b.id), "both at work", timeout=60, every=0.002)
        other.signal(signal.SIGKILL)
        done = wait_done(c, b.id, timeout=180)
    finally:
        other.kill()
    assert_every_line_once(c, done, "k", n)
    assert "resuming a shard another holder left" in ivy.log()


def _holds_a_shard(store, pid: int, batch_id: str) -> bool:
    """Whether the Ivy of process ``pid`` holds an unfinished shard of the
    batch now (its holder id starts with its pid)."""
    import sqlite3

    with sqlite3.connect(f"file:{store / 'batches.sqlite3'}?mode=ro", uri=True, timeout=30) as db:
        row = db.execute("SELECT count(*) FROM shards WHERE batch_id = ? AND holder LIKE ? AND done_lines < lines",
                         (batch_id, f"{pid}-%")).fetchone()
    return row[0] > 0


def test_off_without_a_store(ivy_minilm):
    status, body = ivy_minilm.get("/v1/batches")
    assert status == 404 and b"--batch-dir" in body


def test_expiry_keeps_what_finished_and_lists_the_rest(ivy, store):
    """The window is at least an hour, so the test moves the batch's
    deadline into the past in the store itself (the worker's own check)."""
    import sqlite3

    c = client(ivy)
    n = 3000
    _, b = submit(c, corpus(n, "e"))
    wait_for(lambda: c.batches.retrieve(b.id).request_counts.completed > 0, "some lines done", timeout=60)
    with sqlite3.connect(store / "batches.sqlite3", timeout=30) as db:
        db.execute("UPDATE batches SET expires_at = 1 WHERE id = ?", (b.id,))
    done = wait_done(c, b.id, timeout=60)
    assert done.status == "expired" and done.expired_at
    out, errors = jsonl(c, done.output_file_id), jsonl(c, done.error_file_id)
    assert len(out) == done.request_counts.completed > 0
    assert errors and all(e["error"]["code"] == "batch_expired" for e in errors)
    assert len(errors) == done.request_counts.failed
    assert sorted(o["custom_id"] for o in out + errors) == sorted(f"e{i}" for i in range(n))


def test_the_only_ivy_killed_and_restarted_resumes(tulip_minilm, minilm_dir, log_dir, tmp_path):
    """One shard of 1000 lines: progress is first seen at its first
    checkpoint (256 lines), so the kill lands while the shard is held
    (with 25-line shards it could land between two, leaving none to
    resume)."""
    alone = _ivy(tulip_minilm, minilm_dir, log_dir, tmp_path, batch_shard_lines=1000)
    try:
        c = client(alone)
        n = 1500
        _, b = submit(c, corpus(n, "s"))
        wait_for(lambda: c.batches.retrieve(b.id).request_counts.completed >= 100, "progress", timeout=60)
        alone.signal(signal.SIGKILL)
        alone.kill()
        alone = _ivy(tulip_minilm, minilm_dir, log_dir, tmp_path, batch_shard_lines=1000)
        c = client(alone)
        done = wait_done(c, b.id, timeout=120)
        ids = [o["custom_id"] for o in jsonl(c, done.output_file_id)]
        assert "resuming a shard another holder left" in alone.log()
    finally:
        alone.stop()
    assert done.status == "completed" and len(ids) == n and set(ids) == {f"s{i}" for i in range(n)}


def test_cohere_embed_as_a_batch_endpoint(ivy, st_minilm):
    c = client(ivy)
    text = "".join(line(f"v{i}", {"texts": [t], "input_type": "search_document", "embedding_types": ["float"]},
                        url="/v2/embed") for i, t in enumerate(TEXTS[:3]))
    f = c.files.create(file=("cohere.jsonl", text.encode()), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v2/embed", completion_window="24h")
    done = wait_done(c, b.id)
    assert done.status == "completed" and done.request_counts.completed == 3, done
    rows = {o["custom_id"]: o["response"]["body"]["embeddings"]["float"][0] for o in jsonl(c, done.output_file_id)}
    ref = st_minilm.encode(TEXTS[:3], normalize_embeddings=True)
    for i in range(3):
        v = np.asarray(rows[f"v{i}"])
        assert float(v @ ref[i] / np.linalg.norm(v)) >= 0.999
