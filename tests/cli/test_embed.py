"""``tulip-rose embed`` end to end: the command runs as a subprocess against
real Ivy and Tulip processes on the embedded MiniLM model (and on a tiny
BGE-M3-style model for sparse and multi-vector output). Its output must
equal Ivy's own answers for the same texts in the same order, whatever the
input format; a run killed with SIGKILL and rerun must give the same file
as a one-shot run, redoing only the batches that were in flight; a Tulip
replica killed and restarted mid-run must cost nothing; bad rows must be
reported by line and left out."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.harness import tiny_models as models
from bench.harness.fixtures import corpus_lines
from tests.support.servers import REPO, Ivy, Tulip, wait_for

pytestmark = pytest.mark.slow

# Real text: English prose and multilingual passages (some past the
# model's 256 tokens, truncated by default).
TEXTS = corpus_lines("botchan.txt")[60:310] + corpus_lines("calibration_miracl.txt")[:50]


def cli(*args, check: bool = True, **popen) -> subprocess.CompletedProcess:
    """Runs ``tulip-rose`` (as ``python -m tulip_rose_cli``) to the end."""
    proc = subprocess.run([sys.executable, "-m", "tulip_rose_cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, **popen)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


def start_cli(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tulip_rose_cli", *map(str, args)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ivy_embed(ivy: Ivy, texts: list[str], route: str = "/embed", **fields) -> list:
    """Ivy's own answers, 64 inputs per request (the fixture's limit)."""
    out = []
    for i in range(0, len(texts), 64):
        status, body = ivy.post_json(route, {"inputs": texts[i:i + 64], "truncate": True, **fields})
        assert status == 200, body
        out.extend(body)
    return out


def read_dense(path: Path) -> tuple[list, np.ndarray]:
    t = pq.read_table(path)
    assert t.column_names == ["id", "embedding"]
    return t.column("id").to_pylist(), np.array(t.column("embedding").to_pylist(), dtype=np.float32)


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def chunks(out: Path) -> list[Path]:
    return sorted(out.with_name(out.name + ".partial").glob("chunk-*.npz"))


def embeddings_requests(ivy: Ivy) -> float:
    """Answered /v1/embeddings requests (the command's dense route)."""
    return sum(v for k, v in ivy.metrics().items()
               if k.startswith("ivy_requests_total{") and 'endpoint="embeddings"' in k)


@pytest.fixture(scope="module")
def stack(log_dir):
    """One Tulip replica and an Ivy in front of it, for this module alone
    (one test kills and restarts the replica)."""
    tulip = Tulip(log_dir=log_dir, threads=1)
    ivy = Ivy([tulip.url], log_dir=log_dir, max_inputs=64, max_body_bytes=1 << 20)
    servers = [ivy, tulip]
    yield servers
    ivy.stop()
    servers[1].stop()


@pytest.fixture(scope="module")
def reference(stack) -> np.ndarray:
    return np.array(ivy_embed(stack[0], TEXTS), dtype=np.float32)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inputs") / "docs.txt"
    path.write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def one_shot(stack, text_file, tmp_path_factory) -> tuple[list, np.ndarray]:
    """A one-shot run in small batches, the file the interrupted runs must
    reproduce."""
    out = tmp_path_factory.mktemp("one-shot") / "vectors.parquet"
    cli("embed", text_file, "--out", out, "--url", stack[0].url, "--batch-size", 8)
    return read_dense(out)


def write_input(fmt: str, path: Path) -> list[str]:
    """``TEXTS`` in format ``fmt``, with ids ``doc-<i>``; returns the
    command's input options."""
    ids = [f"doc-{i}" for i in range(len(TEXTS))]
    if fmt == "jsonl":
        path.write_text("".join(json.dumps({"key": k, "body": t, "other": 1}) + "\n"
                                for k, t in zip(ids, TEXTS)), encoding="utf-8")
        return ["--field", "body", "--id-field", "key"]
    if fmt in ("csv", "tsv"):
        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f, delimiter="," if fmt == "csv" else "\t")
            w.writerow(["key", "body"])
            w.writerows(zip(ids, TEXTS))
        return ["--column", "body", "--id-column", "key"]
    pq.write_table(pa.table({"key": ids, "body": TEXTS}), path, row_group_size=100)
    return ["--column", "body", "--id-column", "key"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "parquet"])
def test_each_input_format_gives_ivys_vectors_in_order(stack, reference, tmp_path, fmt):
    src = tmp_path / f"docs.{fmt}"
    options = write_input(fmt, src)
    out = tmp_path / "vectors.parquet"
    run = cli("embed", src, "--out", out, "--url", stack[0].url, *options)
    ids, got = read_dense(out)
    assert ids == [f"doc-{i}" for i in range(len(TEXTS))]
    assert got.shape == reference.shape
    assert min_cosine(got, reference) >= 0.999
    assert f"wrote {len(TEXTS)} rows" in run.stderr
    assert not out.with_name(out.name + ".partial").exists()
    assert not out.with_name(out.name + ".errors.jsonl").exists()


def test_text_to_npy_with_ids_file(stack, reference, text_file, tmp_path):
    out = tmp_path / "vectors.npy"
    cli("embed", text_file, "--out", out, "--url", stack[0].url, "--concurrency", 3)
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == reference.shape
    assert min_cosine(got, reference) >= 0.999
    ids = [json.loads(line) for line in (tmp_path / "vectors.ids.jsonl").read_text().splitlines()]
    assert ids == list(range(1, len(TEXTS) + 1))  # line numbers


def test_dimensions_and_existing_output(stack, text_file, tmp_path):
    out = tmp_path / "small.parquet"
    cli("embed", text_file, "--out", out, "--url", stack[0].url, "--dimensions", 128)
    _, got = read_dense(out)
    want = np.array(ivy_embed(stack[0], TEXTS, dimensions=128), dtype=np.float32)
    assert got.shape == (len(TEXTS), 128)
    assert min_cosine(got, want) >= 0.999
    again = cli("embed", text_file, "--out", out, "--url", stack[0].url, check=False)
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_killed_run_resumes_to_the_one_shot_file(stack, text_file, one_shot, tmp_path):
    ivy = stack[0]
    out = tmp_path / "vectors.parquet"
    args = ["embed", text_file, "--out", out, "--url", ivy.url, "--batch-size", 8, "--concurrency", 2]
    proc = start_cli(*args)
    try:
        wait_for(lambda: len(chunks(out)) >= 5 or proc.poll() is not None, "five finished batches", timeout=120,
                 every=0.01)
    finally:
        proc.kill()
        proc.wait()
    present = len(chunks(out))
    total = -(-len(TEXTS) // 8)
    assert 5 <= present < total, f"killed too late to test anything: {present} of {total} batches"
    assert not out.exists()

    # The killed process's last requests may still be answered.
    wait_for(lambda: ivy.metrics()["ivy_requests_in_flight"] == 0, "Ivy to finish the orphaned requests")
    before = embeddings_requests(ivy)
    run = cli(*args)
    assert f"resuming: {present} batches" in run.stderr
    # Only the batches missing were sent again.
    assert embeddings_requests(ivy) - before == total - present
    ids, got = read_dense(out)
    want_ids, want = one_shot
    assert ids == want_ids
    assert np.abs(got - want).max() <= 1e-6
    assert not out.with_name(out.name + ".partial").exists()


def test_resume_refuses_changed_options(stack, text_file, tmp_path):
    out = tmp_path / "vectors.parquet"
    proc = start_cli("embed", text_file, "--out", out, "--url", stack[0].url, "--batch-size", 8,
                     "--concurrency", 1)
    try:
        wait_for(lambda: chunks(out) or proc.poll() is not None, "a finished batch", timeout=120, every=0.01)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the run finished before it could be interrupted")
    assert proc.returncode == 130, err
    assert "rerun the same command to continue" in err
    changed = cli("embed", text_file, "--out", out, "--url", stack[0].url, "--batch-size", 16, check=False)
    assert changed.returncode == 2
    assert "batch_size: was 8, now 16" in changed.stderr and "--fresh" in changed.stderr
    fresh = cli("embed", text_file, "--out", out, "--url", stack[0].url, "--batch-size", 16, "--fresh")
    assert "resuming" not in fresh.stderr and out.exists()


def test_replica_killed_and_restarted_mid_run_loses_nothing(stack, text_file, one_shot, tmp_path, log_dir):
    ivy, tulip = stack
    out = tmp_path / "vectors.parquet"
    proc = start_cli("embed", text_file, "--out", out, "--url", ivy.url, "--batch-size", 8,
                     "--concurrency", 2, "--progress-every", 0.5)
    try:
        wait_for(lambda: len(chunks(out)) >= 3 or proc.poll() is not None, "three finished batches",
                 timeout=120, every=0.01)
        tulip.kill()
        wait_for(lambda: ivy.get("/ready")[0] == 503, "Ivy to see the replica gone")
        time.sleep(1.0)  # a second of refusals: the command must wait them out
        stack[1] = Tulip(tulip.model_dir, port=tulip.port, log_dir=log_dir, threads=1)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "retrying in" in err
    ids, got = read_dense(out)
    want_ids, want = one_shot
    assert ids == want_ids
    assert np.abs(got - want).max() <= 1e-6


def test_bad_rows_are_reported_by_line_and_strict_stops(stack, reference, tmp_path):
    ivy = stack[0]
    docs = [t.encode() for t in TEXTS[:40]]
    lines = docs[:5] + [b""] + docs[5:10] + [b"\xff\xfe not utf-8"] + docs[10:20] + \
        [("word " * 600).encode()] + docs[20:] + [b"   "]
    src = tmp_path / "docs.txt"
    src.write_bytes(b"\n".join(lines) + b"\n")
    bad_lines = {6: "empty", 12: "not UTF-8", 23: "rejected by Ivy (HTTP 422)", 44: "empty"}
    out = tmp_path / "vectors.parquet"
    errors = tmp_path / "vectors.parquet.errors.jsonl"

    strict = cli("embed", src, "--out", out, "--url", ivy.url, "--no-truncate", "--batch-size", 8,
                 "--concurrency", 1, "--strict", check=False)
    assert strict.returncode == 1, strict.stderr
    assert not out.exists()
    first = [json.loads(line) for line in errors.read_text().splitlines()]
    assert first and first[0]["line"] == 6

    # Without --strict the same command resumes and goes on past them,
    # ending with the exit code of a run with bad rows.
    done = cli("embed", src, "--out", out, "--url", ivy.url, "--no-truncate", "--batch-size", 8,
               "--concurrency", 1, check=False)
    assert done.returncode == 5, done.stderr
    reported = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [r["line"] for r in reported] == list(bad_lines)
    for r in reported:
        assert r["error"].startswith(bad_lines[r["line"]]), r
        assert r["id"] == r["line"] == r["row"]
    assert "256" in reported[2]["error"]  # Ivy's own message: the limit
    ids, got = read_dense(out)
    good = [i + 1 for i in range(len(lines)) if i + 1 not in bad_lines]
    assert ids == good
    assert min_cosine(got, reference[:40]) >= 0.999


def test_api_key_and_prompt_name(stack, text_file, tmp_path, log_dir):
    """Against an Ivy that wants a key and knows a prompt: no key is exit 3
    with Ivy's 401; the key from the environment (IVY_API_KEY, the
    gateway's own variable) and --prompt-name give Ivy's prompted vectors."""
    config = tmp_path / "templates.toml"
    config.write_text('[prompts]\nquery = "query: "\n')
    ivy = Ivy([stack[1].url], log_dir=log_dir, max_inputs=64, config=str(config), env={"IVY_API_KEY": "k3y"})
    try:
        out = tmp_path / "vectors.parquet"
        env = {k: v for k, v in os.environ.items() if k != "IVY_API_KEY"}
        denied = cli("embed", text_file, "--out", out, "--url", ivy.url, check=False, env=env)
        assert denied.returncode == 3 and "HTTP 401" in denied.stderr, denied.stderr
        cli("embed", text_file, "--out", out, "--url", ivy.url, "--prompt-name", "query", "--overwrite",
            env={**env, "IVY_API_KEY": "k3y"})
        _, got = read_dense(out)
        want = []
        for i in range(0, len(TEXTS), 64):
            status, body = ivy.post_json("/embed", {"inputs": TEXTS[i:i + 64], "truncate": True,
                                                    "prompt_name": "query"}, {"Authorization": "Bearer k3y"})
            assert status == 200, body
            want.extend(body)
        plain = np.array(ivy_embed(stack[0], TEXTS[:8]), dtype=np.float32)
        assert min_cosine(got, np.array(want, dtype=np.float32)) >= 0.999
        assert min_cosine(got[:8], plain) < 0.999  # the prompt did change the vectors
    finally:
        ivy.stop()


def test_help_documents_exit_codes_and_bad_rows():
    text = cli("embed", "--help").stdout
    for needle in ("Exit codes", "130", "errors.jsonl", "--strict", "--no-truncate", "--prompt-name",
                   "--dimensions", "--batch-size", "--api-key", "priority"):
        assert needle in text, needle


@pytest.fixture(scope="module")
def m3(tmp_path_factory, log_dir):
    """A tiny BGE-M3-style model: dense, sparse and multi-vector heads."""
    model = models.tiny_xlmr(tmp_path_factory.mktemp("models") / "m3")
    tulip = Tulip(str(model), log_dir=log_dir, threads=1)
    ivy = Ivy([tulip.url], str(model), log_dir=log_dir)
    yield ivy
    ivy.stop()
    tulip.stop()


def test_sparse_and_multi_vector_outputs(m3, tmp_path):
    texts = TEXTS[:40]
    src = tmp_path / "docs.txt"
    src.write_text("".join(t + "\n" for t in texts), encoding="utf-8")

    sparse = tmp_path / "sparse.parquet"
    cli("embed", src, "--out", sparse, "--url", m3.url, "--kind", "sparse", "--batch-size", 16)
    t = pq.read_table(sparse)
    assert t.column_names == ["id", "indices", "values"]
    want = ivy_embed(m3, texts, "/embed_sparse")
    for idx, val, ref in zip(t.column("indices").to_pylist(), t.column("values").to_pylist(), want):
        assert idx == [v["index"] for v in ref]
        assert np.allclose(val, [v["value"] for v in ref], atol=1e-5)

    multi = tmp_path / "multi.parquet"
    cli("embed", src, "--out", multi, "--url", m3.url, "--kind", "multi-vector", "--batch-size", 16)
    t = pq.read_table(multi)
    assert t.column_names == ["id", "embeddings"]
    want = ivy_embed(m3, texts, "/embed_all")
    for got, ref in zip(t.column("embeddings").to_pylist(), want):
        assert np.allclose(np.array(got, dtype=np.float32), np.array(ref, dtype=np.float32), atol=1e-5)

    refused = cli("embed", src, "--out", tmp_path / "x.npy", "--url", m3.url, "--kind", "sparse", check=False)
    assert refused.returncode == 2 and "Parquet" in refused.stderr


def test_rows_keep_file_lines_across_multi_line_csv_fields(tmp_path):
    from tulip_rose_cli import readers

    src = tmp_path / "docs.csv"
    src.write_bytes(b'id,text\na,"two\nlines"\nb,\nc,"say ""hi"""\nd,\xff\n')
    rows = list(readers.rows(src, "csv", None, "id"))
    assert [(r.line, r.id, r.text, r.bad) for r in rows] == [
        (2, "a", "two\nlines", None), (4, "b", None, "empty"), (5, "c", 'say "hi"', None),
        (6, "d", None, "not UTF-8")]
    assert readers.count(src, "csv") == 5  # an upper bound: the quoted newline counts
