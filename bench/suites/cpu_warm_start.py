"""Issue 50's "warm without waiting": how soon after a start Tulip serves a
query on the CPU fast path (ONNX Runtime over the cached export).

Tulip is started again and again over one export cache
(``--cache-dir``, a fresh folder): once with the cache empty (the export
made on the first query's bucket, in the background), then ``starts``
times with the export in it under each ``--cpu-fast-path-warm`` setting:
``auto`` (the default: the cached export opened and every bucket gated
before Tulip answers) and ``false`` (every bucket built on its first
query, the behaviour before auto). For each start: the seconds from the
process's spawn until ``Info`` answers (polled every 0.1 s, so to within
0.1 s), then queries one at a time (a 12-token sentence, a new one every
20 ms), each step's mode read from ``tulip_steps_total{mode=...}``, until
one runs on the fast path: the seconds from ``Info``'s answer until that
query's answer, how many queries ran eagerly before it, and the buckets
``/metrics`` showed ready when Tulip first answered. Tulip alone (gRPC):
Ivy adds its own start, not the fast path's."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.harness import plots
from bench.harness.results import table
from bench.harness.stack import Stack
from tulip_rose_cli.launch import Tulip

TITLE = "CPU fast path at start: time from a Tulip's start to its first query on ONNX Runtime"

QUERY = "how long does sourdough bread take to rise"
# A query every this many seconds until one runs on the fast path.
PACE_S = 0.02
# Seconds to wait for the fast path after a start (an export takes ~10-30 s).
PATIENCE_S = 300.0


def _series(text: str, name: str) -> dict[str, float]:
    """``name{label="x"...} v`` lines of a Prometheus text, by label set."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name):].rsplit(" ", 1)
            out[labels] = float(value)
    return out


def _steps(tulip: Tulip) -> dict[str, float]:
    return {k.split('"')[1]: v for k, v in _series(tulip.metrics(), "tulip_steps_total").items()}


def _ready_buckets(tulip: Tulip) -> dict[str, int]:
    series = _series(tulip.metrics(), "tulip_cpu_fast_path_buckets")
    return {k.split('"')[1]: int(v) for k, v in series.items() if 'state="ready"' in k}


def one_start(model_dir: str, ids: list[int], cache: Path, log_dir: Path, warm: str, threads: int) -> dict:
    """Starts Tulip, queries it until a step runs on the fast path, stops it."""
    spawned = time.monotonic()
    tulip = Tulip(model_dir, log_dir=log_dir, cpu_fast_path="true", cpu_fast_path_warm=warm, cache_dir=str(cache),
                  threads=threads, timeout=PATIENCE_S)
    ready = time.monotonic()
    try:
        buckets = _ready_buckets(tulip)
        eager, first_ms, fast_s = 0, None, None
        with tulip.client() as c:
            while time.monotonic() - ready < PATIENCE_S:
                sent = time.monotonic()
                c.embed([ids])
                done = time.monotonic()
                first_ms = first_ms if first_ms is not None else (done - sent) * 1e3
                if _steps(tulip).get("onnx", 0) >= 1:
                    fast_s = done - ready
                    break
                eager += 1
                time.sleep(max(0.0, PACE_S - (time.monotonic() - sent)))
    finally:
        tulip.stop()
    return {"warm": warm, "start_to_ready_s": round(ready - spawned, 3), "ready_buckets_at_ready": buckets,
            "ready_to_first_fast_query_s": None if fast_s is None else round(fast_s, 4),
            "eager_queries_before": eager, "first_query_ms": round(first_ms or 0.0, 2),
            "start_to_first_fast_query_s": None if fast_s is None else round(ready - spawned + fast_s, 3)}


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return round(statistics.median(values), 4) if values else None


def run(stack: Stack, starts: int = 5) -> tuple[dict, str]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(stack.model_dir) / "tokenizer.json"))
    tok.no_padding()  # MiniLM's tokenizer.json pads to 128
    ids = tok.encode(QUERY).ids
    cache = Path(tempfile.mkdtemp(prefix="bench-cpu-warm-start-"))
    try:
        runs = {"cold cache": [one_start(stack.model_dir, ids, cache, stack.log_dir, "auto", stack.threads)]}
        for warm in ("auto", "false"):
            runs[f"warm cache, --cpu-fast-path-warm {warm}"] = [
                one_start(stack.model_dir, ids, cache, stack.log_dir, warm, stack.threads) for _ in range(starts)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)  # the export: ~90 MB for MiniLM
    keys = ("start_to_ready_s", "ready_to_first_fast_query_s", "start_to_first_fast_query_s",
            "eager_queries_before", "first_query_ms")
    medians = {name: {k: _median(rs, k) for k in keys} for name, rs in runs.items()}
    data = {"params": {"starts": starts, "query_tokens": len(ids), "pace_s": PACE_S, "threads": stack.threads,
                       "tulip_flags": {"cpu_fast_path": "true", "cache_dir": "a fresh folder"}},
            "runs": runs, "medians": medians}
    rows = [[name, len(runs[name]), *(m[k] for k in keys)] for name, m in medians.items()]
    md = "\n".join([
        f"Tulip (all-MiniLM-L6-v2, `--cpu-fast-path true`, {stack.threads} threads) started over one export cache; "
        f"a {len(ids)}-token query every {PACE_S * 1e3:.0f} ms from the moment `Info` answers until one runs on the "
        "fast path (`tulip_steps_total{mode=\"onnx\"}`). Medians over the starts; ready is when `Info` first "
        "answers (polled every 0.1 s).\n",
        table(["start", "starts", "spawn → ready (s)", "ready → first fast query answered (s)",
               "spawn → first fast query (s)", "eager queries first", "first query (ms)"], rows),
    ])
    return data, md


def options(scale: float) -> dict:
    return {"starts": max(2, round(5 * scale))}


def plot(data: dict, path: Path) -> Path:
    """Per start: spawn → ready, then ready → the first fast-path query, stacked."""
    plt = plots._plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    labels, ready, fast = [], [], []
    for name, rs in data["runs"].items():
        for i, r in enumerate(rs):
            labels.append(f"{name.replace(', --cpu-fast-path-warm ', ', warm ')} #{i + 1}")
            ready.append(r["start_to_ready_s"])
            fast.append(r["ready_to_first_fast_query_s"] or 0.0)
    ax.barh(labels, ready, color="C0", label="spawn → ready (Info answers)")
    ax.barh(labels, fast, left=ready, color="C3", label="ready → first query on the fast path")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    return plots.finish(plt, fig, ax, path, "seconds since the process was spawned", "",
                        "Tulip's start to its first CPU fast path query")
