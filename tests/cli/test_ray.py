"""Bulk embedding on Ray (``tulip_rose_cli.ray``) with a real local Ray
cluster (one per module, 2 CPUs) and real Ivy and Tulip processes: every
output kind equals Ivy's answers for the same rows, whether the actors call
Ivy (``IvyEmbedder``) or run the engine themselves (``RoseEmbedder``);
Parquet in and out with the other columns passed through; a LoRA adapter
picked by ``model``; an actor killed mid-job and an Ivy outage mid-job cost
no row and duplicate none; bad rows are reported (an error column, or the
row named in strict mode, or by line from ``tulip-rose embed --ray``); and
``--ray`` writes the file the single-machine command writes, in the work
directory a single-machine rerun resumes."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from bench.harness import tiny_models as models  # noqa: E402
from bench.harness.fixtures import corpus_lines  # noqa: E402
from tests.support.servers import REPO, Ivy, Tulip, free_port, wait_for  # noqa: E402
from tulip_rose_cli.ray import IvyEmbedder, RoseEmbedder  # noqa: E402

pytestmark = pytest.mark.slow

# Real text: English prose and multilingual passages (some past the
# model's 256 tokens, truncated by default).
TEXTS = corpus_lines("botchan.txt")[60:200] + corpus_lines("calibration_miracl.txt")[:20]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One local Ray cluster for the module. Its workers must import this
    module (the test embedders below) and the repository's packages. The
    actors ask for half a CPU each: two 1-CPU actors would hold both CPUs
    and Ray Data's read tasks would wait for ever."""
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # rows in input order, for the comparisons
    ctx.enable_progress_bars = False
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def ivy_dense(ivy: Ivy, texts: list[str], **fields) -> np.ndarray:
    """Ivy's own /v1/embeddings answers (base64 float32: exact)."""
    out = []
    for i in range(0, len(texts), 64):
        status, body = ivy.post_json("/v1/embeddings", {"input": texts[i:i + 64], "encoding_format": "base64",
                                                        **fields})
        assert status == 200, body
        out += [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in body["data"]]
    return np.stack(out)


def ivy_tei(ivy: Ivy, route: str, texts: list[str]) -> list:
    out = []
    for i in range(0, len(texts), 64):
        status, body = ivy.post_json(route, {"inputs": texts[i:i + 64], "truncate": True})
        assert status == 200, body
        out.extend(body)
    return out


def dataset(texts: list[str]):
    """``texts`` with ids, in blocks of 40 rows (so two actors share a job)."""
    table = pa.table({"id": list(range(len(texts))), "text": pa.array(texts, type=pa.string())})
    return ray.data.from_arrow([table.slice(i, 40) for i in range(0, len(texts), 40)])


def arrow(ds):
    """A dataset's rows as one pyarrow Table, in order."""
    return pa.concat_tables(ray.get(ds.to_arrow_refs()))


def dense_of(table) -> np.ndarray:
    return np.array(table.column("embedding").to_pylist(), dtype=np.float32)


def test_ivy_embedder_parquet_in_and_out(cluster, ivy_minilm, tmp_path):
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"doc": [f"d{i}" for i in range(len(TEXTS))], "text": TEXTS,
                             "lang": ["en"] * 140 + ["xx"] * 20}), src, row_group_size=40)
    ds = ray.data.read_parquet(str(src)).map_batches(
        IvyEmbedder, fn_constructor_kwargs={"url": ivy_minilm.url, "id_column": "doc"}, compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=0.5, batch_size=16, batch_format="pyarrow")
    ds.write_parquet(str(tmp_path / "out"))
    got = pq.read_table(tmp_path / "out")
    assert got.column_names == ["doc", "text", "lang", "embedding", "error"]
    # Ray writes one file per block and reading the folder back follows file
    # names, not the source order: line rows up by their carried id.
    got = got.take(np.argsort([int(d[1:]) for d in got.column("doc").to_pylist()], kind="stable"))
    assert got.column("doc").to_pylist() == [f"d{i}" for i in range(len(TEXTS))]
    assert got.column("lang").to_pylist()[-1] == "xx"
    assert got.column("error").null_count == len(TEXTS)
    assert got.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    np.testing.assert_allclose(dense_of(got), ivy_dense(ivy_minilm, TEXTS), atol=1e-5)


def test_ivy_embedder_dimensions_and_bad_rows(cluster, ivy_minilm):
    texts = TEXTS[:30] + ["", "word " * 600, None]
    ds = dataset(texts)
    got = arrow(ds.map_batches(IvyEmbedder, fn_constructor_kwargs={"url": ivy_minilm.url, "dimensions": 128,
                                                              "truncate": False},
                         compute=ray.data.ActorPoolStrategy(size=1), num_cpus=0.5, batch_size=11, batch_format="pyarrow"))
    errors = got.column("error").to_pylist()
    assert errors[:30] == [None] * 30
    assert errors[30] == "empty"
    assert errors[31].startswith("rejected by Ivy (HTTP 422)") and "256" in errors[31]
    assert errors[32] == "empty"
    vectors = got.column("embedding").to_pylist()
    assert vectors[30:] == [None] * 3
    np.testing.assert_allclose(np.array(vectors[:30], dtype=np.float32),
                               ivy_dense(ivy_minilm, TEXTS[:30], dimensions=128), atol=1e-5)

    strict = ds.map_batches(IvyEmbedder, fn_constructor_kwargs={"url": ivy_minilm.url, "strict": True,
                                                                 "truncate": False},
                            compute=ray.data.ActorPoolStrategy(size=1), num_cpus=0.5, batch_size=11, batch_format="pyarrow")
    with pytest.raises(Exception) as failed:
        strict.materialize()
    message = str(failed.value)
    assert "BadRow" in message and "of its batch (text '')" in message and "empty" in message, message


@pytest.fixture
def adapter(ivy_minilm, minilm_dir, tmp_path):
    """A LoRA adapter loaded at run time into the shared Ivy's replica (no
    Tulip of its own to start), unloaded after."""
    from bench.harness import lora_adapters as lora

    path = lora.random_adapter(minilm_dir, tmp_path / "legal", r=8, seed=1)
    status, body = ivy_minilm.post_json("/v1/load_lora_adapter", {"lora_name": "legal", "lora_path": str(path)})
    assert status == 200, body
    yield "legal"
    ivy_minilm.post_json("/v1/unload_lora_adapter", {"lora_name": "legal"})


def test_ivy_embedder_with_a_lora_adapter(cluster, ivy_minilm, adapter):
    texts = TEXTS[:40]
    got = arrow(dataset(texts).map_batches(
        IvyEmbedder, fn_constructor_kwargs={"url": ivy_minilm.url, "model": adapter},
        compute=ray.data.ActorPoolStrategy(size=1), num_cpus=0.5, batch_size=16, batch_format="pyarrow"))
    want = ivy_dense(ivy_minilm, texts, model=adapter)
    np.testing.assert_allclose(dense_of(got), want, atol=1e-5)
    assert np.abs(want - ivy_dense(ivy_minilm, texts)).max() > 0.01  # not the base model's
    with pytest.raises(ValueError, match="model 'nonexistent': .*does not exist here"):
        IvyEmbedder(ivy_minilm.url, model="nonexistent")


def test_rose_embedder_equals_ivy_dense(cluster, ivy_minilm, minilm_dir):
    got = arrow(dataset(TEXTS).map_batches(
        RoseEmbedder,
        # float32, as the test Ivy serves (a bfloat16 twin would differ in the last digits)
        fn_constructor_kwargs={"model": minilm_dir, "threads": 1, "token_budget": 2048, "cpu_bf16": False},
        compute=ray.data.ActorPoolStrategy(size=1), num_cpus=0.5, batch_size=32, batch_format="pyarrow"))
    assert got.column("id").to_pylist() == list(range(len(TEXTS)))
    np.testing.assert_allclose(dense_of(got), ivy_dense(ivy_minilm, TEXTS), atol=1e-5)


@pytest.fixture(scope="module")
def m3(tmp_path_factory, log_dir):
    """A seeded random BGE-M3-style model with dense, sparse and
    multi-vector heads, served by its own Tulip and Ivy."""
    model = models.tiny_xlmr(tmp_path_factory.mktemp("models") / "m3")
    tulip = Tulip(str(model), log_dir=log_dir, threads=1)
    ivy = Ivy([tulip.url], str(model), log_dir=log_dir)
    yield str(model), ivy
    ivy.stop()
    tulip.stop()


@pytest.mark.parametrize("embedder", ["ivy", "rose"])
def test_sparse_and_multi_vector_equal_ivys(cluster, m3, embedder):
    model, ivy = m3
    texts = TEXTS[:24] + TEXTS[-8:]
    for kind, route in (("sparse", "/embed_sparse"), ("multi-vector", "/embed_all")):
        kwargs = {"url": ivy.url} if embedder == "ivy" else {"model": model, "threads": 1}
        got = arrow(dataset(texts).map_batches(IvyEmbedder if embedder == "ivy" else RoseEmbedder,
                                         fn_constructor_kwargs={**kwargs, "kind": kind}, compute=ray.data.ActorPoolStrategy(size=1),
                                         num_cpus=0.5, batch_size=10, batch_format="pyarrow"))
        want = ivy_tei(ivy, route, texts)
        if kind == "sparse":
            assert got.schema.field("indices").type == pa.list_(pa.int32())
            for idx, val, ref in zip(got.column("indices").to_pylist(), got.column("values").to_pylist(), want):
                assert idx == [v["index"] for v in ref]
                np.testing.assert_allclose(val, [v["value"] for v in ref], atol=1e-5)
        else:
            assert got.schema.field("embeddings").type == pa.list_(pa.list_(pa.float32(), 32))
            for vecs, ref in zip(got.column("embeddings").to_pylist(), want):
                np.testing.assert_allclose(np.array(vecs, dtype=np.float32), np.array(ref, dtype=np.float32),
                                           atol=1e-5)


class MarkingEmbedder(IvyEmbedder):
    """An ``IvyEmbedder`` that leaves a file per batch it finished (so a
    test can act mid-job) and, when asked, kills its own process in the
    middle of the job's third batch: once in the whole cluster."""

    def __init__(self, marks: str, kill: bool, **kwargs):
        super().__init__(**kwargs)
        self.marks, self.kill = Path(marks), kill

    def __call__(self, batch):
        done = len(list(self.marks.glob("batch-*")))
        if self.kill and done >= 2:
            try:
                os.close(os.open(self.marks / "killed", os.O_CREAT | os.O_EXCL))
                os.kill(os.getpid(), signal.SIGKILL)
            except FileExistsError:
                pass
        out = super().__call__(batch)
        (self.marks / f"batch-{os.getpid()}-{time.monotonic_ns()}").touch()
        return out


def test_actor_killed_mid_job_loses_and_duplicates_nothing(cluster, ivy_minilm, tmp_path):
    got = arrow(dataset(TEXTS).map_batches(
        MarkingEmbedder, fn_constructor_kwargs={"url": ivy_minilm.url, "marks": str(tmp_path), "kill": True},
        compute=ray.data.ActorPoolStrategy(size=2), num_cpus=0.5, batch_size=8, batch_format="pyarrow"))
    assert (tmp_path / "killed").exists()
    assert got.column("id").to_pylist() == list(range(len(TEXTS)))
    np.testing.assert_allclose(dense_of(got), ivy_dense(ivy_minilm, TEXTS), atol=1e-5)


def test_ivy_outage_mid_job_is_waited_out(cluster, tulip_minilm, minilm_dir, ivy_minilm, log_dir, tmp_path):
    port = free_port()
    ivy = Ivy([tulip_minilm.url], minilm_dir, port=port, log_dir=log_dir, max_inputs=64)
    result: dict = {}

    def job():
        try:
            result["table"] = arrow(dataset(TEXTS).map_batches(
                MarkingEmbedder, fn_constructor_kwargs={"url": ivy.url, "marks": str(tmp_path), "kill": False,
                                                        "request_size": 4},
                compute=ray.data.ActorPoolStrategy(size=1), num_cpus=0.5, batch_size=8, batch_format="pyarrow"))
        except BaseException as e:  # reported below
            result["error"] = e

    t = threading.Thread(target=job)
    t.start()
    try:
        wait_for(lambda: len(list(tmp_path.glob("batch-*"))) >= 2 or not t.is_alive(), "two batches", timeout=120)
        ivy.stop()
        stopped_at = len(list(tmp_path.glob("batch-*")))
        time.sleep(2.0)  # two seconds of refused connections
        ivy = Ivy([tulip_minilm.url], minilm_dir, port=port, log_dir=log_dir, max_inputs=64)
        t.join(180)
    finally:
        ivy.stop()
    assert "error" not in result, result.get("error")
    assert stopped_at < -(-len(TEXTS) // 8), "the job ended before the outage"
    got = result["table"]
    assert got.column("id").to_pylist() == list(range(len(TEXTS)))
    np.testing.assert_allclose(dense_of(got), ivy_dense(ivy_minilm, TEXTS), atol=1e-5)


def cli(*args, check: bool = True, rc: int = 0) -> subprocess.CompletedProcess:
    """``tulip-rose ARGS``; with ``check``, its exit status must be ``rc``."""
    proc = subprocess.run([sys.executable, "-m", "tulip_rose_cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode != rc:
        raise AssertionError(f"exit {proc.returncode}, not {rc}:\n{proc.stderr[-3000:]}")
    return proc


def test_cli_ray_writes_the_single_machine_file(cluster, ivy_minilm, tmp_path):
    src = tmp_path / "docs.txt"
    lines = [t.encode() for t in TEXTS[:60]]
    lines = lines[:5] + [b""] + lines[5:20] + [b"\xff\xfe not utf-8"] + lines[20:40] + \
        [("word " * 600).encode()] + lines[40:]
    src.write_bytes(b"\n".join(lines) + b"\n")
    args = ["--url", ivy_minilm.url, "--batch-size", 8, "--no-truncate"]
    # Three bad rows: both runs write the others and exit 5 (BAD_ROWS).
    cli("embed", src, "--out", tmp_path / "one.parquet", *args, rc=5)
    run = cli("embed", src, "--out", tmp_path / "ray.parquet", "--ray", cluster, *args, rc=5)
    assert "on Ray" in run.stderr
    one, on_ray = pq.read_table(tmp_path / "one.parquet"), pq.read_table(tmp_path / "ray.parquet")
    assert on_ray.column("id").to_pylist() == one.column("id").to_pylist()
    np.testing.assert_allclose(dense_of(on_ray), dense_of(one), atol=1e-6)
    errors = [json.loads(x) for x in (tmp_path / "ray.parquet.errors.jsonl").read_text().splitlines()]
    assert [(e["line"], e["error"][:12]) for e in errors] == [(6, "empty"), (22, "not UTF-8"),
                                                              (43, "rejected by ")]
    assert (tmp_path / "ray.parquet.errors.jsonl").read_text() == \
        (tmp_path / "one.parquet.errors.jsonl").read_text()

    strict = cli("embed", src, "--out", tmp_path / "strict.parquet", "--ray", cluster, "--strict", *args,
                 check=False)
    assert strict.returncode == 1, strict.stderr
    first = json.loads((tmp_path / "strict.parquet.errors.jsonl").read_text().splitlines()[0])
    assert first["line"] == 6

    # The strict run's finished batches are resumed, here on one machine:
    # both engines share the work directory.
    resumed = cli("embed", src, "--out", tmp_path / "strict.parquet", *args, rc=5)
    assert "resuming:" in resumed.stderr
    again = pq.read_table(tmp_path / "strict.parquet")
    assert again.column("id").to_pylist() == one.column("id").to_pylist()
    np.testing.assert_allclose(dense_of(again), dense_of(one), atol=1e-6)


def test_ray_data_llm_http_processor_against_ivy(cluster, ivy_minilm):
    """Ray's own OpenAI-compatible HTTP processor, pointed at Ivy's
    /v1/embeddings (the example of docs/bulk-on-a-cluster.md)."""
    llm = pytest.importorskip("ray.data.llm")
    config = llm.HttpRequestProcessorConfig(url=f"{ivy_minilm.url}/v1/embeddings", batch_size=16, concurrency=1,
                                            max_retries=3)
    processor = llm.build_processor(
        config,
        preprocess=lambda row: {"payload": {"input": [row["text"]], "priority": "batch"}},
        postprocess=lambda row: {"id": row["id"], "embedding": row["http_response"]["data"][0]["embedding"]},
    )
    got = processor(dataset(TEXTS[:32])).take_all()
    got.sort(key=lambda r: r["id"])
    np.testing.assert_allclose(np.array([r["embedding"] for r in got], dtype=np.float32),
                               ivy_dense(ivy_minilm, TEXTS[:32]), atol=1e-5)


def test_late_chunking_one_document_per_group(cluster, ivy_minilm, minilm_dir, tmp_path):
    """``groupby(document).map_groups`` with a position column: every call
    one whole document, its chunks put in order whatever order Ray brings
    them in (the rows go in shuffled); Ivy's late-chunked vectors through
    Ivy, the same from the engine in the actor, bad documents bad as a
    whole; and ``tulip-rose embed --ray --late-chunking`` writes the same
    vectors."""
    from tests.support.http import embed

    docs = {"a": TEXTS[:5], "long": TEXTS[10:40], "one": TEXTS[40:41], "b": TEXTS[41:47],
            "empty": ["First.", "", "Third."], "rejected": ["Berlin ", "\u200b", "More."]}
    rows = [(name, k, text) for name, chunks in docs.items() for k, text in enumerate(chunks)]
    table = pa.table({"id": list(range(len(rows))), "doc": [r[0] for r in rows], "chunk": [r[1] for r in rows],
                      "text": [r[2] for r in rows]})
    shuffled = table.take(np.random.default_rng(0).permutation(len(rows)))
    ds = ray.data.from_arrow([shuffled.slice(i, 20) for i in range(0, len(rows), 20)])
    late = {"late_chunking": True, "document_column": "doc", "position_column": "chunk"}

    def run(embedder, kwargs):
        blocks = ray.get(ds.groupby("doc").map_groups(
            embedder, fn_constructor_kwargs={**kwargs, **late}, compute=ray.data.ActorPoolStrategy(size=1),
            num_cpus=0.5, batch_format="pyarrow").to_arrow_refs())
        got = pa.concat_tables([b for b in blocks if b.num_rows])  # the shuffle's empty partitions have no columns
        return got.take(np.argsort(got.column("id").to_pylist()))

    good = [i for i, (name, _, _) in enumerate(rows) if name not in ("empty", "rejected")]
    want = np.concatenate([embed(ivy_minilm, chunks, late_chunking=True) for name, chunks in docs.items()
                           if name not in ("empty", "rejected")])
    through_ivy = run(IvyEmbedder, {"url": ivy_minilm.url})
    errors = through_ivy.column("error").to_pylist()
    assert [errors[i] for i in good] == [None] * len(good)
    np.testing.assert_allclose(dense_of(through_ivy.take(good)), want, atol=1e-5)
    first = len(good)
    assert errors[first + 1] == "empty"
    for e in (errors[first], errors[first + 2]):
        assert e.startswith("its document has a bad row (row ") and e.endswith(" of its batch: empty)"), e
    assert all("input[1] has no token of its own" in e for e in errors[first + 3:]), errors[first + 3:]

    in_actor = run(RoseEmbedder, {"model": minilm_dir, "threads": 1, "cpu_bf16": False, "token_budget": 2048})
    mine = dense_of(in_actor.take(good))
    assert ((mine * want).sum(1) / np.linalg.norm(mine, axis=1) / np.linalg.norm(want, axis=1)).min() >= 0.999
    errors = in_actor.column("error").to_pylist()
    assert errors[first + 1] == "empty" and errors[first].startswith("its document has a bad row")
    assert all("input[1] has no token of its own" in e for e in errors[first + 3:]), errors[first + 3:]

    src = tmp_path / "chunks.parquet"
    pq.write_table(table.drop_columns(["id"]), src)
    cli("embed", src, "--out", tmp_path / "out.parquet", "--url", ivy_minilm.url, "--ray", cluster,
        "--late-chunking", "--document-column", "doc", "--batch-size", 4, rc=5)
    written = pq.read_table(tmp_path / "out.parquet")
    assert written.column("id").to_pylist() == [i + 1 for i in good]
    np.testing.assert_allclose(dense_of(written), want, atol=1e-5)
