"""A newcomer's mistakes with ``tulip-rose embed`` (issue 32), each run as a
real command against real Ivy and Tulip processes on the embedded model:
nothing ends in a silent success, an option is checked before anything is
written, the OpenAI base URL works, the retry budget is one for the run,
and rows are numbered by one rule in every format."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.servers import REPO, Ivy, free_port

pytestmark = pytest.mark.slow

DOCS = ["The cat sat on the mat.", "A quick brown fox.", "Serving embeddings fast.", "One more document."]


def embed(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tulip_rose_cli", "embed", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def partial(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def errors(out: Path) -> list[dict]:
    path = out.with_name(out.name + ".errors.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "docs.txt"
    path.write_text("\n".join(DOCS) + "\n")
    return path


def test_an_unknown_prompt_name_is_refused_before_the_run(ivy_minilm, text_file, tmp_path):
    """Item 1: the help's example prompt does not exist on the default
    model; every row would fail. It is refused up front, naming the
    prompts the gateway has, and nothing is written."""
    out = tmp_path / "out.parquet"
    r = embed(text_file, "--out", out, "--url", ivy_minilm.url, "--prompt-name", "document")
    assert r.returncode == 2, r.stderr
    assert "--prompt-name 'document'" in r.stderr and "prompts" in r.stderr, r.stderr
    assert not out.exists() and not partial(out).exists()


def test_bad_rows_have_an_exit_code_of_their_own(ivy_minilm, tmp_path):
    """Item 1: a run with bad rows writes the good ones and exits 5, so an
    all-bad input (an empty output) never looks like success."""
    some_bad = tmp_path / "some.txt"
    some_bad.write_text(f"{DOCS[0]}\n\n{DOCS[1]}\n")
    out = tmp_path / "some.parquet"
    r = embed(some_bad, "--out", out, "--url", ivy_minilm.url)
    assert r.returncode == 5, r.stderr
    assert pq.read_table(out).num_rows == 2 and [e["row"] for e in errors(out)] == [2]
    assert "1 bad rows were left out" in r.stderr, r.stderr

    all_bad = tmp_path / "all.txt"
    all_bad.write_text("\n \n\t\n")
    out = tmp_path / "all.parquet"
    r = embed(all_bad, "--out", out, "--url", ivy_minilm.url)
    assert r.returncode == 5, r.stderr
    assert pq.read_table(out).num_rows == 0 and len(errors(out)) == 3

    good = tmp_path / "good.parquet"
    text = tmp_path / "good.txt"
    text.write_text("\n".join(DOCS) + "\n")
    assert embed(text, "--out", good, "--url", ivy_minilm.url).returncode == 0


def test_exit_codes_are_documented_in_help():
    r = subprocess.run([sys.executable, "-m", "tulip_rose_cli", "embed", "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert "5 done, but some rows were bad" in " ".join(r.stdout.split()), r.stdout


def test_the_openai_base_url_is_accepted(ivy_minilm, text_file, tmp_path):
    """Item 7: ``--url http://host:8080/v1``, the base URL the OpenAI
    client takes, reaches the same routes."""
    out = tmp_path / "out.parquet"
    r = embed(text_file, "--out", out, "--url", ivy_minilm.url + "/v1/")
    assert r.returncode == 0, r.stderr
    assert pq.read_table(out).num_rows == len(DOCS)


def test_a_mistyped_column_writes_nothing_and_names_the_default(ivy_minilm, tmp_path):
    """Item 7: a missing column is refused before the work directory is
    made, so the corrected rerun is not blocked; without --column the
    message says it looked for the default."""
    src = tmp_path / "docs.csv"
    with open(src, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["doc_id", "body"])
        w.writerows((f"d{i}", t) for i, t in enumerate(DOCS))
    out = tmp_path / "out.parquet"
    r = embed(src, "--out", out, "--url", ivy_minilm.url, "--column", "bdy")
    assert r.returncode == 2 and "no column 'bdy'" in r.stderr and "'body'" in r.stderr, r.stderr
    assert not partial(out).exists() and not out.exists()
    r = embed(src, "--out", out, "--url", ivy_minilm.url)
    assert r.returncode == 2 and "'text' (the default of --column)" in r.stderr, r.stderr
    assert not partial(out).exists()
    r = embed(src, "--out", out, "--url", ivy_minilm.url, "--column", "body", "--id-column", "doc_id")
    assert r.returncode == 0, r.stderr
    assert pq.read_table(out).column("id").to_pylist() == [f"d{i}" for i in range(len(DOCS))]


def test_a_refused_resume_names_the_default_column(ivy_minilm, tmp_path):
    """Item 7: a kept run read --column body; a rerun without --column is
    refused with the column it would read, not None."""
    src = tmp_path / "docs.jsonl"
    rows = [{"text": t, "body": t} for t in DOCS] + [{"text": "x", "body": ""}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.parquet"
    r = embed(src, "--out", out, "--url", ivy_minilm.url, "--column", "body", "--strict")
    assert r.returncode == 1 and partial(out).exists(), r.stderr
    r = embed(src, "--out", out, "--url", ivy_minilm.url)
    assert r.returncode == 2, r.stderr
    assert "column: was 'body', now 'text'" in r.stderr, r.stderr


def test_the_retry_budget_is_one_for_the_whole_run(tmp_path, log_dir):
    """Item 7: against a real Ivy with no replica (503 on every call), the
    first call retries until --retry-for is spent; the next call, made
    while the gateway is still failing, gives up on its first failure
    instead of waiting the budget out again."""
    from tulip_rose_cli.client import ApiError, Retry
    from tulip_rose_cli.client import Ivy as Client

    ivy = Ivy([f"http://127.0.0.1:{free_port()}"], log_dir=log_dir, wait_ready=False)
    try:
        retries = []
        client = Client(ivy.url, retry=Retry(base=0.05, give_up_after=0.5),
                        on_retry=lambda status, message, delay: retries.append(status))
        with pytest.raises(ApiError) as e:
            client.get_json("/info")
        assert e.value.status == 503 and retries and set(retries) == {503}
        first = len(retries)
        with pytest.raises(ApiError) as e:
            client.get_json("/ready")
        assert e.value.status == 503 and len(retries) == first, "the second call spent the budget again"
        # The gateway answering (here: /health) ends the outage: the budget is whole again.
        client.request("GET", "/health")
        with pytest.raises(ApiError):
            client.get_json("/info")
        assert len(retries) > first
    finally:
        ivy.stop()


def _write(fmt: str, path: Path, texts: list[str]) -> None:
    if fmt == "text":
        path.write_text("".join(t + "\n" for t in texts))
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    elif fmt == "csv":
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text"])
            w.writerows([t] for t in texts)
    else:
        pq.write_table(pa.table({"text": texts}), path)


@pytest.mark.parametrize("fmt,suffix,bad_line", [("text", ".txt", 2), ("jsonl", ".jsonl", 2),
                                                 ("csv", ".csv", 3), ("parquet", ".parquet", None)])
def test_rows_are_numbered_by_one_rule(ivy_minilm, tmp_path, fmt, suffix, bad_line):
    """Item 9: without --id-column the n-th data row has id n in every
    format (a CSV header is not a row), and the errors file's "row" is the
    same number; "line" is where the row is in the file."""
    texts = [DOCS[0], "", DOCS[1], DOCS[2]]
    src = tmp_path / f"docs{suffix}"
    _write(fmt, src, texts)
    out = tmp_path / "out.parquet"
    r = embed(src, "--out", out, "--url", ivy_minilm.url)
    assert r.returncode == 5, r.stderr
    assert pq.read_table(out).column("id").to_pylist() == [1, 3, 4]
    [bad] = errors(out)
    assert (bad["row"], bad["id"], bad["line"]) == (2, 2, bad_line), bad
