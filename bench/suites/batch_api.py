"""Issue 47: the OpenAI Batch API against ``tulip-rose embed`` on the same
corpus, through the same Ivy and Tulip, in alternating rounds: documents
per second from upload to the last output line downloaded (the Batch API,
through the official ``openai`` client) against the command's start to
exit (the bulk client). Each is also run with a query loop beside it: the
p50 and p99 of sequential single queries while that side works, and with
nothing beside (idle). The two outputs must agree document by document."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.harness import inputs, plots
from bench.harness.httpclient import HttpClient
from bench.harness.results import REPO, table
from bench.harness.stack import Stack
from bench.harness.timing import Stats, ratio, scaled
from tulip_rose_cli.launch import Ivy

TITLE = "Batch API: a corpus through POST /v1/batches vs `tulip-rose embed`, and queries beside each"
TARGET_RATIO = 0.9
QUERY = "How do I reset my password?"


def run(stack: Stack, docs: int = 5000, rounds: int = 2, concurrency: int = 64) -> tuple[dict, str]:
    import openai

    src = inputs.english_lines()
    texts = [src[i % len(src)] for i in range(docs)]
    work = Path(tempfile.mkdtemp(prefix="bench-batch-api-"))
    tulip = stack.tulip()
    ivy = Ivy([tulip.url], stack.model_dir, log_dir=stack.log_dir, batch_dir=str(work / "store"),
              batch_concurrency=concurrency, batch_max_lines=max(50_000, docs))
    try:
        client = openai.OpenAI(base_url=ivy.url + "/v1", api_key="unused", max_retries=0)
        jsonl = "".join(json.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/embeddings",
                                    "body": {"input": t}}) + "\n" for i, t in enumerate(texts)).encode()
        (work / "docs.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")

        def batch_api() -> np.ndarray:
            f = client.files.create(file=("docs.jsonl", jsonl), purpose="batch")
            b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
            while b.status not in ("completed", "failed", "expired", "cancelled"):
                time.sleep(0.1)
                b = client.batches.retrieve(b.id)
            if b.status != "completed" or b.request_counts.failed:
                raise RuntimeError(f"the batch ended {b.status}: {b}")
            rows = [json.loads(x) for x in client.files.content(b.output_file_id).text.splitlines()]
            out = np.zeros((docs, len(rows[0]["response"]["body"]["data"][0]["embedding"])), dtype=np.float32)
            for r in rows:
                out[int(r["custom_id"])] = r["response"]["body"]["data"][0]["embedding"]
            return out

        def bulk() -> np.ndarray:
            res = subprocess.run([sys.executable, "-m", "tulip_rose_cli", "embed", str(work / "docs.txt"),
                                  "--out", str(work / "v.npy"), "--url", ivy.url, "--overwrite"],
                                 cwd=REPO, capture_output=True, text=True, timeout=3600)
            if res.returncode != 0:
                raise RuntimeError(f"tulip-rose embed exited {res.returncode}: {res.stderr[-2000:]}")
            return np.load(work / "v.npy")

        sides = {"Batch API": batch_api, "tulip-rose embed": bulk}
        for fn in sides.values():  # warm both paths (and the fast path's buckets)
            fn()
        rates: dict[str, list[float]] = {k: [] for k in sides}
        beside: dict[str, list[float]] = {"idle": [], **{k: [] for k in sides}}
        outputs: dict[str, np.ndarray] = {}
        for r in range(rounds):
            beside["idle"] += _queries_during(ivy.url, lambda: time.sleep(5.0))[1]
            for side in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                (wall, out), lat = _queries_during(ivy.url, sides[side])
                outputs[side] = out
                rates[side].append(docs / wall)
                beside[side] += lat
                print(f"round {r + 1}, {side}: {docs / wall:,.1f} docs/s", flush=True)
    finally:
        ivy.stop()
    a, b = outputs["Batch API"], outputs["tulip-rose embed"]
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    best = {k: round(max(v), 2) for k, v in rates.items()}
    speedup = ratio(best["Batch API"], best["tulip-rose embed"])
    q = {k: Stats.of(v) for k, v in beside.items()}
    data = {
        "params": {"docs": docs, "rounds": rounds, "threads": stack.threads, "batch_concurrency": concurrency,
                   "input": f"{docs:,} lines of botchan.txt's body in file order, one document per request line",
                   "query": QUERY, "stack": "one Tulip replica behind one Ivy (--batch-dir in a temporary folder)"},
        "docs_per_s": {k: [round(x, 2) for x in v] for k, v in rates.items()},
        "best_docs_per_s": best,
        "ratio_batch_api_over_bulk": speedup,
        "target_ratio": TARGET_RATIO,
        "target_met": speedup is not None and speedup >= TARGET_RATIO,
        "queries_beside": {k: v.to_dict() for k, v in q.items()},
        "min_cosine_batch_api_vs_bulk": float(cos.min()),
    }
    md = "\n".join([
        f"{data['params']['input']}; {rounds} alternating rounds per side after one warm-up run each, best round "
        f"reported. Batch API: upload, create, poll every 0.1 s, download the output (openai-python), "
        f"`--batch-concurrency {concurrency}`; `tulip-rose embed`: the command with its defaults, start to exit. "
        f"Torch threads = {stack.threads}.\n",
        table(["side", "docs/s per round", "best docs/s"],
              [[k, ", ".join(f"{x:.1f}" for x in v), best[k]] for k, v in rates.items()]),
        f"\nRatio (best / best): **{speedup}×** (target ≥ {TARGET_RATIO}×: "
        f"{'met' if data['target_met'] else 'missed'}). Smallest cosine between the two outputs, document by "
        f"document: {cos.min():.6f}.",
        f"\nSequential single queries (\"{QUERY}\", `/v1/embeddings`, one keep-alive connection) beside each:\n",
        table(["beside", "queries", "p50 ms", "p99 ms"],
              [[k, v.count, round(v.p50, 2), round(v.p99, 2)] for k, v in q.items()]),
    ])
    return data, md


def _queries_during(url: str, work):
    """Runs ``work`` while one client sends single queries back to back:
    ((work's wall seconds, its result), the queries' latencies in s)."""
    done = threading.Event()
    lat: list[float] = []

    def loop():
        with HttpClient.for_url(url) as c:
            request = c.prepare("/v1/embeddings", {"input": QUERY, "priority": "interactive"})
            while not done.is_set():
                t = time.perf_counter()
                status, _ = c.send(request)
                if status == 200:
                    lat.append(time.perf_counter() - t)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    start = time.perf_counter()
    result = work()
    wall = time.perf_counter() - start
    done.set()
    t.join()
    return (wall, result), lat


def plot(data: dict, path: Path) -> Path:
    return plots.throughput_bars({f"{data['params']['docs']:,} documents": data["best_docs_per_s"]},
                                 path, "Batch API vs tulip-rose embed: documents / s (best round)")


def options(scale: float) -> dict:
    return {"docs": scaled(5000, scale, 200), "rounds": scaled(2, scale, 1)}
