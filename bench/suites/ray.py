"""Issue 28, item 4: bulk embedding of 20,000 real documents with Ray Data
on a local Ray cluster, in both shapes (actors sending batches to Ivy at
the ``batch`` priority class; the ROSE engine inside the actors), with 1
and 2 actors, beside ``tulip-rose embed`` (threads of one process) and
``sentence-transformers`` ``encode`` in the same run, in documents per
second; and the latency of search-box queries on the same Ivy while a Ray
job sends it batch work, against the same queries on the idle Ivy.

Everything shares one machine: Ivy, one Tulip replica, the Ray cluster
(``num_cpus`` = the usable cores) and the query load. So the numbers say
what the integration costs and keeps (overheads, equality of rows,
isolation), not how a cluster scales: a real cluster has a node per
actor."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.harness import inputs, plots
from bench.harness.isolation_load import query_load
from bench.harness.results import table
from bench.harness.stack import Stack
from bench.harness.timing import Stats, ratio, scaled
from bench.suites.bulk import _command, documents

TITLE = "Bulk embedding on Ray Data: actors against Ivy and engine-in-actor vs `tulip-rose embed` and " \
        "sentence-transformers"


def _ray_job(texts: list[str], embedder, kwargs: dict, actors: int, batch_size: int):
    """Runs one Ray Data job over ``texts``; (wall seconds, vectors in
    input order). Actor start-up (the model load, for the engine) is
    included, as a user waits for it."""
    import pyarrow as pa
    import ray

    table = pa.table({"id": np.arange(len(texts)), "text": texts})
    # Blocks of 1,000 rows, so every actor gets work (one block goes to one actor).
    ds = ray.data.from_arrow([table.slice(i, 1000) for i in range(0, len(texts), 1000)])
    start = time.perf_counter()
    # Half a CPU per actor: Ray Data's own tasks keep a CPU on a 2-CPU cluster.
    ds = ds.map_batches(embedder, fn_constructor_kwargs=kwargs, compute=ray.data.ActorPoolStrategy(size=actors),
                        num_cpus=0.5, batch_size=batch_size, batch_format="pyarrow")
    out = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    wall = time.perf_counter() - start
    if out.column("id").to_pylist() != list(range(len(texts))):
        raise RuntimeError("the Ray job's rows are not in input order")
    if out.column("error").null_count != len(texts):
        raise RuntimeError(f"the Ray job reported bad rows: {out.column('error').drop_null()[:3]}")
    return wall, np.array(out.column("embedding").to_pylist(), dtype=np.float32)


def run(stack: Stack, docs: int = 20000, batch_size: int = 256, query_rate: float = 10.0,
        query_threads: int = 16, idle_seconds: float = 20.0) -> tuple[dict, str]:
    import ray

    from tulip_rose_cli.ray import IvyEmbedder, RoseEmbedder

    texts, provenance = documents(docs)
    tok = inputs.tokenizer(stack.model_dir, stack.max_length)
    tokens = sum(len(e.ids) for e in tok.encode_batch(texts))
    ivy, st = stack.ivy(), stack.st()
    cores = stack.threads
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    src = work / "docs.txt"
    src.write_text("".join(t + "\n" for t in texts), encoding="utf-8")

    st.encode(texts[:256], batch_size=32)  # warm-up (the reference is the timed encode below)
    rates: dict[str, float] = {}
    deviation: dict[str, float] = {}
    load: dict[str, float] = {}  # the shared machine's 1-minute load average as each side ended

    def record(side: str, wall: float, got: np.ndarray | None) -> None:
        rates[side] = round(docs / wall, 2)
        load[side] = round(os.getloadavg()[0], 2)
        if got is not None:
            cos = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
            deviation[side] = float(1.0 - cos.min())
        print(f"{side}: {docs / wall:,.1f} docs/s", flush=True)

    start = time.perf_counter()
    reference = st.encode(texts, batch_size=32)
    record("sentence-transformers encode (in-process)", time.perf_counter() - start, None)

    wall, _ = _command(src, work / "v.npy", ivy.url, [])
    record("tulip-rose embed (threads, through Ivy)", wall, np.load(work / "v.npy"))
    wall, _ = _command(src, work / "r.npy", ivy.url, ["--ray", ray.get_runtime_context().gcs_address])
    record("tulip-rose embed --ray (tasks, through Ivy)", wall, np.load(work / "r.npy"))

    for actors in (1, 2):
        wall, got = _ray_job(texts, IvyEmbedder, {"url": ivy.url}, actors, batch_size)
        record(f"Ray Data, IvyEmbedder × {actors}", wall, got)
    for actors in (1, 2):
        # The cores are split between the actors (a GPU cluster gives each its own device).
        wall, got = _ray_job(texts, RoseEmbedder, {"model": stack.model_dir, "threads": max(1, cores // actors)},
                             actors, batch_size)
        record(f"Ray Data, RoseEmbedder × {actors} (engine in the actor)", wall, got)

    # Query latency: idle, then while a Ray job (2 actors) sends batch work.
    queries = inputs.queries(stack.model_dir, 200)
    idle = query_load(ivy.port, queries, query_rate, query_threads, stop_after=idle_seconds)
    stop = threading.Event()
    loaded: dict = {}
    t = threading.Thread(target=lambda: loaded.update(query_load(ivy.port, queries, query_rate, query_threads,
                                                                 stop=stop)))
    t.start()
    time.sleep(1.0)
    wall, _ = _ray_job(texts, IvyEmbedder, {"url": ivy.url}, 2, batch_size)
    stop.set()
    t.join()
    under_rate = round(docs / wall, 2)
    idle_stats, loaded_stats = Stats.of(idle["latencies"]), Stats.of(loaded["latencies"])
    ray.shutdown()

    st_rate = rates["sentence-transformers encode (in-process)"]
    data = {
        "params": {"docs": docs, "tokens": tokens, "input": provenance, "ray_batch_size": batch_size,
                   "threads": cores, "ray_cluster": f"local, num_cpus={cores}, on the benchmark's machine",
                   "stack": "one Tulip replica (torch threads as above) behind one Ivy, same machine",
                   "query_rate_per_s": query_rate, "query_threads": query_threads,
                   "idle_seconds": idle_seconds},
        "docs_per_s": rates,
        "ratio_over_st": {k: ratio(v, st_rate) for k, v in rates.items()},
        "loadavg_1min_at_end": load,
        "max_cosine_deviation_from_st": deviation,
        "query_latency_ms": {"idle": idle_stats.to_dict(), "during Ray job (batch priority)":
                             loaded_stats.to_dict()},
        "late_queries": {"idle": idle["late"], "during Ray job": loaded["late"]},
        "ray_job_docs_per_s_under_queries": under_rate,
        "p99_ratio_loaded_over_idle": ratio(loaded_stats.p99, idle_stats.p99),
    }
    md = "\n".join([
        f"{provenance}; {tokens:,} tokens with special tokens (truncated at {stack.max_length}). One round "
        f"per side (wall time from submit to the last row, actor start-up and model loads included), all on "
        f"this machine: Ivy, one Tulip replica ({cores} torch threads), a local Ray cluster with "
        f"num_cpus={cores}, and the queries. Ray Data batches of {batch_size} rows; `tulip-rose embed` with "
        f"its defaults (batch 64, 2 requests in flight per replica); sentence-transformers batch 32, fp32.\n",
        table(["side", "docs/s", "× sentence-transformers", "max cosine deviation", "load avg at end"],
              [[k, v, data["ratio_over_st"][k], f"{deviation[k]:.1e}" if k in deviation else "reference",
                load[k]] for k, v in rates.items()]),
        "\nThe machine is shared with other jobs (the load average column: 2 cores), so each number is one "
        "noisy sample; compare sides within a run, not across runs.",
        f"\nQuery latency on the same Ivy ({query_rate:g} queries/s from {query_threads} connections, "
        f"real 10-64-token lines): idle for {idle_seconds:g} s vs while a Ray Data job (IvyEmbedder × 2, "
        f"`priority: batch`) embeds the {docs:,} documents ({under_rate} docs/s meanwhile).\n",
        table(["queries", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"],
              [["idle", idle_stats.count, idle_stats.p50, idle_stats.p90, idle_stats.p99, idle_stats.max],
               ["during the Ray job", loaded_stats.count, loaded_stats.p50, loaded_stats.p90, loaded_stats.p99,
                loaded_stats.max]]),
        f"\np99 during / idle: **{data['p99_ratio_loaded_over_idle']}×**.",
        "\nWhat this does not show: scaling. Every actor here shares the same 2 cores with Ivy and Tulip, so "
        "2 actors cannot be faster than 1 by more than the overlap of I/O and compute; on a cluster each "
        "actor (or each Tulip replica behind Ivy) brings its own node or GPU. See "
        "docs/bulk-on-a-cluster.md for what is extrapolated.",
    ])
    return data, md


def plot(data: dict, path: Path) -> Path:
    return plots.throughput_bars({f"{data['params']['docs']:,} documents": data["docs_per_s"]}, path,
                                 "Bulk embedding on Ray: documents / s")


def options(scale: float) -> dict:
    return {"docs": scaled(20000, scale, 200), "idle_seconds": max(5.0, 20.0 * scale)}
