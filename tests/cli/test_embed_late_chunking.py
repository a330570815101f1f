"""``tulip-rose embed --late-chunking --document-column NAME`` against the
shared Ivy and Tulip on the embedded MiniLM: each row's vector equals
Ivy's ``/v1/embeddings`` with ``late_chunking`` for its document, in every
columned format, with batches smaller than a document and a document
longer than the model; a bad document (a bad row, too many chunks, a
chunk Ivy rejects, a row with no document) is reported row by row; batches
never split a document; the option is in the resume manifest; a text file
or a half-given option is a usage error before anything is sent."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.harness.fixtures import corpus_lines
from tests.support.http import embed, embeddings_reply
from tests.support.servers import REPO
from tulip_rose_cli.cli import main

pytestmark = pytest.mark.slow

LINES = corpus_lines("botchan.txt")[200:300]
# name → chunks: short documents, one over the model's 256 tokens (Ivy
# windows it), and a one-chunk document.
DOCS = {"a": LINES[:5], "b": LINES[5:9], "long": LINES[10:40], "one": LINES[40:41], "c": LINES[41:47]}


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tulip_rose_cli", "embed", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def rows_of(docs: dict) -> list[tuple[str, str, str]]:
    """(id, document, text) per row, documents in order."""
    return [(f"{name}-{i}", name, text) for name, chunks in docs.items() for i, text in enumerate(chunks)]


def write(fmt: str, path: Path, rows: list[tuple]) -> None:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps({"key": k, "doc": d, "body": t}) + "\n" for k, d, t in rows))
    elif fmt == "csv":
        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["key", "doc", "body"])
            w.writerows(rows)
    else:
        pq.write_table(pa.table({"key": [r[0] for r in rows], "doc": [r[1] for r in rows],
                                 "body": [r[2] for r in rows]}), path)


def late(ivy, chunks: list[str]) -> np.ndarray:
    return embed(ivy, chunks, late_chunking=True)


OPTIONS = ["--column", "body", "--id-column", "key", "--late-chunking", "--document-column", "doc"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_rows_get_their_documents_late_chunked_vectors(ivy_minilm, tmp_path, fmt):
    src, out = tmp_path / f"docs.{fmt}", tmp_path / "vectors.parquet"
    write(fmt, src, rows_of(DOCS))
    # Batches of 3 rows: smaller than most documents, which must not be split.
    run = cli(src, "--out", out, "--url", ivy_minilm.url, "--batch-size", 3, *OPTIONS)
    assert run.returncode == 0, run.stderr
    t = pq.read_table(out)
    assert t.column("id").to_pylist() == [r[0] for r in rows_of(DOCS)]
    got = np.array(t.column("embedding").to_pylist(), dtype=np.float32)
    want = np.concatenate([late(ivy_minilm, chunks) for chunks in DOCS.values()])
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert embeddings_reply(ivy_minilm, DOCS["long"], late_chunking=True)["usage"]["prompt_tokens"] > 256
    # Not the chunks embedded alone.
    assert np.abs(got - embed(ivy_minilm, [r[2] for r in rows_of(DOCS)])).max() > 0.01


def batch_rows(partial: Path) -> list[set[int]]:
    """The row numbers each finished batch holds, good and bad."""
    out = []
    for f in sorted(partial.glob("chunk-*.npz")):
        with np.load(f) as z:
            out.append({i + 1 for i in z["rows"].tolist()} | {json.loads(e)["row"] for e in z["errors"]})
    return out


def test_bad_documents_are_bad_rows_and_the_run_resumes(ivy_minilm, tmp_path):
    docs = {"a": DOCS["a"], "empty": ["First.", "", "Third."], "b": DOCS["b"],
            "ivy-rejects": ["Berlin ", "\u200b", "More."],  # a chunk with no token of its own
            "too-many": [f"Chunk {i}." for i in range(65)],  # the shared Ivy takes 64 inputs
            "c": DOCS["c"], "no-doc": LINES[60:63], "one": DOCS["one"]}
    rows = rows_of(docs)
    src, out = tmp_path / "docs.jsonl", tmp_path / "vectors.parquet"
    lines = [json.dumps({"key": k, "doc": d, "body": t}) for k, d, t in rows]
    lines[[r[0] for r in rows].index("no-doc-1")] = json.dumps({"key": "no-doc-1", "body": LINES[61]})  # the field missing: its document is bad
    src.write_text("\n".join(lines) + "\n")
    number = {k: n for n, (k, _, _) in enumerate(rows, 1)}
    args = [src, "--out", out, "--url", ivy_minilm.url, "--batch-size", 4, "--concurrency", 1, *OPTIONS]

    strict = cli(*args, "--strict")
    assert strict.returncode == 1, strict.stderr
    done = batch_rows(out.with_name(out.name + ".partial"))
    # Stopped at the first bad document; the batches done hold whole documents.
    assert any(number["empty-1"] in b for b in done) and number["c-0"] not in set().union(*done)
    for name, chunks in docs.items():
        assert sum(1 for b in done if b & {number[f"{name}-{i}"] for i in range(len(chunks))}) <= 1, name

    # The option is in the resume manifest: it changes every vector.
    plain = cli(src, "--out", out, "--url", ivy_minilm.url, "--batch-size", 4, "--column", "body",
                "--id-column", "key")
    assert plain.returncode == 2 and "late_chunking: was True, now None" in plain.stderr, plain.stderr

    run = cli(*args)
    assert run.returncode == 5, run.stderr
    assert "resuming: " in run.stderr
    errors = {e["id"]: e for e in map(json.loads, (tmp_path / "vectors.parquet.errors.jsonl").read_text()
                                      .splitlines())}
    bad_docs = ("empty", "ivy-rejects", "too-many", "no-doc")
    assert sorted(errors) == sorted(k for k, d, _ in rows if d in bad_docs)
    assert errors["empty-1"]["error"] == "empty"
    assert errors["empty-0"]["error"] == f"its document has a bad row (row {number['empty-1']}: empty)"
    rejected = errors["ivy-rejects-0"]["error"]
    assert "rejected by Ivy (HTTP 422)" in rejected and "input[1] has no token of its own" in rejected, rejected
    assert f"input[0] is row {number['ivy-rejects-0']}" in rejected
    assert "more than 64 chunks" in errors["too-many-64"]["error"]
    assert errors["no-doc-1"]["error"] == "no document field 'doc'"
    assert errors["no-doc-2"]["error"].startswith("its document has a bad row")

    t = pq.read_table(out)
    good = {name: chunks for name, chunks in docs.items() if name not in bad_docs}
    assert t.column("id").to_pylist() == [r[0] for r in rows_of(good)]
    want = np.concatenate([late(ivy_minilm, chunks) for chunks in good.values()])
    np.testing.assert_allclose(np.array(t.column("embedding").to_pylist(), dtype=np.float32), want, atol=1e-6)


@pytest.mark.parametrize("args, says", [
    (["--late-chunking"], "--late-chunking needs --document-column"),
    (["--document-column", "doc"], "--document-column needs --late-chunking"),
    (["--late-chunking", "--document-column", "doc", "--kind", "sparse"], "dense vectors only"),
])
def test_half_an_option_is_a_usage_error(tmp_path, capsys, args, says):
    src = tmp_path / "docs.jsonl"
    src.write_text(json.dumps({"doc": "a", "text": "Hello."}) + "\n")
    assert main(["embed", str(src), "--out", str(tmp_path / "v.parquet"), "--url", "http://127.0.0.1:9", *args]) == 2
    assert says in capsys.readouterr().err


def test_a_text_file_or_a_missing_column_is_a_usage_error(tmp_path, capsys):
    text = tmp_path / "docs.txt"
    text.write_text("Hello.\n")
    out = tmp_path / "v.parquet"
    assert main(["embed", str(text), "--out", str(out), "--late-chunking", "--document-field", "doc"]) == 2
    assert "a text file has no columns" in capsys.readouterr().err
    table = tmp_path / "docs.csv"
    table.write_text("text,document\nHello.,a\n")
    assert main(["embed", str(table), "--out", str(out), "--late-chunking", "--document-column", "doc"]) == 2
    assert "has no column 'doc'" in capsys.readouterr().err
    assert not out.with_name(out.name + ".partial").exists()


def test_batches_hold_whole_documents():
    from tulip_rose_cli import documents
    from tulip_rose_cli.readers import Row

    keys = ["a"] * 3 + ["b"] * 2 + [None] + ["b", "c"] + ["d"] * 7 + ["e"]
    rows = [Row(i, i + 1, i + 1, text="x", doc=k) if k else Row(i, i + 1, i + 1, bad="not JSON") for i, k in
            enumerate(keys)]
    docs = list(documents.split(rows, most=3))
    # A row with no document stays with the one before it; "d" (7 > 3
    # chunks) comes in bad pieces of 4 rows.
    assert [[r.index for r in d] for d in docs] == [[0, 1, 2], [3, 4, 5, 6], [7], [8, 9, 10, 11], [12, 13, 14],
                                                    [15]]
    assert all("more than 3 chunks" in (r.bad or "") for d in docs[3:5] for r in d)
    assert [[r.index for r in b] for b in documents.batches(docs, 4)] == [
        [0, 1, 2], [3, 4, 5, 6], [7], [8, 9, 10, 11], [12, 13, 14, 15]]
