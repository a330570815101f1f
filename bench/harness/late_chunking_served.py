"""The served side of the late-chunking benchmark: Ivy's ``/v1/embeddings``
with ``"late_chunking": true`` (one document per request, one vector per
chunk) and without it (each chunk embedded alone), checked to be late
chunking before anything is measured, and the throughput of the two from
concurrent client processes."""

from __future__ import annotations

import statistics

import numpy as np

from bench.harness.clients import http_clients
from bench.harness.httpclient import HttpClient
from bench.harness.late_chunking_dataset import Dataset
from bench.harness.stack import IVY_PATH


class LateChunkingUnavailable(RuntimeError):
    """The server does not late-chunk: it refused the field or ignored it."""


def body(chunks: list[str], late: bool) -> dict:
    return {"input": chunks, "late_chunking": True} if late else {"input": chunks}


def embed(client: HttpClient, chunks: list[str], late: bool) -> tuple[np.ndarray, dict]:
    """One request: the vectors in input order, and the usage."""
    status, out = client.post_json(IVY_PATH, body(chunks, late))
    if status != 200:
        message = out.get("error", out) if isinstance(out, dict) else out
        if late and 400 <= status < 500:
            raise LateChunkingUnavailable(
                f"Ivy answered HTTP {status} to `\"late_chunking\": true` ({str(message)[:300]}): this Ivy has no "
                "late chunking (issue 46). Build an Ivy that has it (`make ivy`) and run again.")
        raise RuntimeError(f"HTTP {status}: {str(message)[:300]}")
    rows = sorted(out["data"], key=lambda d: d["index"])
    return np.array([r["embedding"] for r in rows], dtype=np.float32), out.get("usage", {})


def probe(client: HttpClient, chunks: list[str]) -> None:
    """Raises ``LateChunkingUnavailable`` unless the server answers
    ``late_chunking`` with one vector per chunk that differs from the
    chunks embedded alone (a server that ignores the field answers those)."""
    late, _ = embed(client, chunks, True)
    alone, _ = embed(client, chunks, False)
    if late.shape != alone.shape:
        raise LateChunkingUnavailable(f"Ivy answered {late.shape[0]} vectors for {len(chunks)} late-chunked chunks")
    if np.allclose(late, alone, atol=1e-6):
        raise LateChunkingUnavailable(
            "Ivy answered `\"late_chunking\": true` with the chunks embedded alone: it ignored the field, so this "
            "Ivy has no late chunking (issue 46). Build an Ivy that has it (`make ivy`) and run again.")


def vectors(client: HttpClient, data: Dataset, late: bool) -> tuple[np.ndarray, list[int]]:
    """Every chunk's vector, in pool order, one request per document; and
    each request's ``prompt_tokens``."""
    out, tokens = [], []
    for d in data.documents:
        v, usage = embed(client, list(d.chunks), late)
        if len(v) != len(d.chunks):
            raise RuntimeError(f"{d.id}: {len(v)} vectors for {len(d.chunks)} chunks")
        out.append(v)
        tokens.append(int(usage.get("prompt_tokens", -1)))
    return np.vstack(out), tokens


def queries(client: HttpClient, texts: list[str], batch: int) -> np.ndarray:
    """Questions embedded as ordinary queries, ``batch`` per request."""
    return np.vstack([embed(client, texts[i:i + batch], False)[0] for i in range(0, len(texts), batch)])


def throughput(port: int, data: Dataset, copies: int, clients: int, repeats: int) -> dict:
    """Documents/s and chunks/s with late chunking (one request per
    document) and with the same chunks alone (the same requests without the
    field), ``copies`` times the dataset spread over ``clients`` processes;
    the two alternate ``repeats`` times, medians reported."""
    docs = [list(d.chunks) for d in data.documents] * copies
    chunks = sum(len(c) for c in docs)
    prep = HttpClient("127.0.0.1", port)
    work = {mode: [[prep.prepare(IVY_PATH, body(c, mode == "late")) for c in docs[k::clients]]
                   for k in range(clients)] for mode in ("late", "alone")}
    rates: dict[str, dict[str, list]] = {m: {"docs_per_s": [], "chunks_per_s": [], "spans_ns": []} for m in work}
    for r in range(repeats):
        for mode in (("late", "alone") if r % 2 == 0 else ("alone", "late")):
            run = http_clients(port, work[mode], timeout=600)
            rates[mode]["docs_per_s"].append(round(len(docs) / run.wall, 2))
            rates[mode]["chunks_per_s"].append(round(chunks / run.wall, 1))
            # perf_counter is CLOCK_MONOTONIC on Linux, the simulated device's log clock.
            rates[mode]["spans_ns"].append([int(min(s for c in run.spans for s, _ in c) * 1e9),
                                            int(max(e for c in run.spans for _, e in c) * 1e9)])
    out = {"documents": len(docs), "chunks": chunks, "copies": copies, "clients": clients, "repeats": repeats}
    for mode, v in rates.items():
        out[mode] = {**v, "median_docs_per_s": round(statistics.median(v["docs_per_s"]), 2),
                     "median_chunks_per_s": round(statistics.median(v["chunks_per_s"]), 1)}
    out["late_over_alone"] = round(out["late"]["median_docs_per_s"] / out["alone"]["median_docs_per_s"], 3)
    return out
