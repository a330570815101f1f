"""Issue 46, "What must be shown": late chunking through Ivy against the same
chunks embedded alone, on the retrieval dataset of ``bench/data/late_chunking/``
(documents of botchan.txt, chunks = sentences, questions whose answer is in
one chunk and whose entity is named only in another chunk of the document).

Retrieval: every question, embedded as an ordinary query, ranks all chunks
of all documents; recall@1/3/5 and MRR of its target chunk with the chunks
embedded alone and late-chunked: served by Ivy, and computed in process by
``transformers`` (``bench/harness/late_chunking_reference.py``), which also
checks the served vectors. Throughput: documents/s and chunks/s embedding
the dataset (and a larger repeat of it) from concurrent clients, one request
per document, late-chunked vs alone. The same throughput comparison at GPU
speed is ``python -m bench sim --only late-chunking`` (``bench/sim/late_chunking.py``:
``bench.sim`` runs suites' sections, so a suite does not start the simulated
device)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from bench.harness import gate, retrieval
from bench.harness import late_chunking_served as served
from bench.harness.httpclient import HttpClient
from bench.harness.late_chunking_dataset import DATA_DIR, Dataset, load
from bench.harness.late_chunking_reference import Reference
from bench.harness.results import table
from bench.harness.stack import Stack
from bench.harness.timing import scaled

TITLE = "Late chunking: retrieval of chunks whose context is elsewhere in the document, and throughput, vs chunks alone"
QUICK_DOCS = ["d02", "d16", "d31"]  # 244, 293 and 222 MiniLM tokens: two fit a 256-token window
ONE_PASS = 512  # MiniLM's position table: the informative one-pass reference row


def options(scale: float) -> dict:
    return {"copies": scaled(4, scale, 2), "repeats": scaled(3, scale, 1), "clients": 4}


def quick_options() -> dict:
    """``--quick``: three documents, one repeat, no larger set (the dry run;
    seconds once the stack is up)."""
    return {"documents": QUICK_DOCS, "copies": 1, "repeats": 1, "clients": 2}


def run(stack: Stack, **opts) -> tuple[dict, str]:
    try:
        return measure(stack.ivy(), stack.model_dir, stack.threads, stack.gates, **opts)
    except served.LateChunkingUnavailable as e:  # the message, not a traceback
        raise SystemExit(f"late-chunking: {e}") from None


def measure(ivy, model_dir: str, threads: int, gates: list[dict], documents: list[str] | None = None, copies: int = 4,
            repeats: int = 3, clients: int = 4) -> tuple[dict, str]:
    """The whole benchmark against a running Ivy (``ivy``: a launcher handle,
    ``port`` and ``get``); gate records are appended to ``gates``."""
    data = load() if documents is None else load().subset(documents)
    info = _info(ivy)
    window, batch = int(info.get("max_input_length") or 256), int(info.get("max_client_batch_size") or 32)
    client = HttpClient("127.0.0.1", ivy.port)
    served.probe(client, list(data.documents[0].chunks))  # before anything else: a clear refusal

    pool = {p: i for i, p in enumerate(data.pool())}
    targets = [pool[(q.doc, q.chunk)] for q in data.questions]
    questions = [q.text for q in data.questions]
    ref = Reference(model_dir, threads, window)
    late = [ref.late(list(d.chunks), d.text) for d in data.documents]
    ref_tokens = [n for _, n in late]
    vec = {"reference late": np.vstack([v for v, _ in late]),
           "reference alone": np.vstack([ref.alone(list(d.chunks)) for d in data.documents])}
    ref.window = ONE_PASS
    vec["reference late, one pass"] = np.vstack([ref.late(list(d.chunks), d.text)[0] for d in data.documents])
    ref.window = window
    ref_queries = ref.alone(questions)
    vec["served alone"], _ = served.vectors(client, data, late=False)
    vec["served late"], served_tokens = served.vectors(client, data, late=True)
    served_queries = served.queries(client, questions, batch)
    client.close()

    check = _cross_check(data, vec, served_queries, ref_queries, ref_tokens, served_tokens, window, gates)
    ranks = {k: retrieval.ranks(served_queries if k.startswith("served") else ref_queries, v, targets)
             for k, v in vec.items()}
    scores = {k: retrieval.summary(r) for k, r in ranks.items()}

    sets = [("dataset", 1)] + ([(f"dataset x{copies}", copies)] if copies > 1 else [])
    served.throughput(ivy.port, data, 1, clients, 1)  # warm-up: every document's shape seen once, both ways
    speed = {label: served.throughput(ivy.port, data, n, clients, repeats) for label, n in sets}

    lengths = sorted(ref_tokens)
    result = {
        "dataset": {"path": str(DATA_DIR.relative_to(DATA_DIR.parents[2])), "documents": len(data.documents),
                    "chunks": len(pool), "questions": len(questions),
                    "document_tokens": {"min": lengths[0], "median": statistics.median(lengths), "max": lengths[-1],
                                        f"over_{window}": sum(n > window for n in lengths),
                                        f"over_{ONE_PASS}": sum(n > ONE_PASS for n in lengths)}},
        "params": {"model_dir": model_dir, "threads": threads, "window": window,
                   "copies": copies, "repeats": repeats, "clients": clients, "question_batch": batch},
        "retrieval": scores,
        "ranks": {q.id: {k: r[i] for k, r in ranks.items()} for i, q in enumerate(data.questions)},
        "cross_check": check,
        "throughput": speed,
    }
    return result, _markdown(result, data)


def _info(ivy) -> dict:
    status, raw = ivy.get("/info")
    return json.loads(raw) if status == 200 else {}


def _cross_check(data: Dataset, vec, served_q, ref_q, ref_tokens, served_tokens, window: int, gates) -> dict:
    """Served against reference, gated at cosine >= 0.999: chunks alone and
    questions, and every late chunk (documents within one window and longer
    ones, reported apart)."""
    within = np.concatenate([[n <= window] * len(d.chunks) for d, n in zip(data.documents, ref_tokens)])
    alone = np.concatenate([gate.cosines(vec["served alone"], vec["reference alone"]), gate.cosines(served_q, ref_q)])
    late = gate.cosines(vec["served late"], vec["reference late"])
    out = {"alone_and_queries_min_cosine": round(float(alone.min()), 6),
           "late_within_window_min_cosine": round(float(late[within].min()), 6) if within.any() else None,
           "late_within_window_documents": sum(n <= window for n in ref_tokens),
           "late_longer_min_cosine": round(float(late[~within].min()), 6) if (~within).any() else None,
           "late_longer_documents": sum(n > window for n in ref_tokens),
           "prompt_tokens_equal_document_tokens": sum(a == b for a, b in zip(served_tokens, ref_tokens)),
           "prompt_tokens": {d.id: [s, r] for d, s, r in zip(data.documents, served_tokens, ref_tokens)}}
    gates.append(gate.check("Ivy, chunks alone and questions", np.vstack([vec["served alone"], served_q]),
                            np.vstack([vec["reference alone"], ref_q]), "transformers in-process, alone"))
    gates.append(gate.check(f"Ivy, late chunking (windows of {window} tokens past that)", vec["served late"],
                            vec["reference late"], "transformers in-process, late chunking"))
    return out


ROWS = [("served alone", "Ivy", "alone"), ("served late", "Ivy", "late chunking"),
        ("reference alone", "reference in-process", "alone"),
        ("reference late", "reference in-process", "late chunking"),
        ("reference late, one pass", "reference in-process", f"late chunking, one pass up to {ONE_PASS} tokens")]


def _markdown(r: dict, data: Dataset) -> str:
    ds, p, c = r["dataset"], r["params"], r["cross_check"]
    t = ds["document_tokens"]
    w = p["window"]
    md = [f"Dataset `{ds['path']}`: {ds['documents']} documents of consecutive lines of botchan.txt "
          f"({t['min']}–{t['max']} MiniLM tokens, median {t['median']}; {t[f'over_{w}']} over {w}, "
          f"{t[f'over_{ONE_PASS}']} over {ONE_PASS}), {ds['chunks']} chunks (sentences) in the pool, "
          f"{ds['questions']} questions. Window {w} tokens (Ivy's `max_input_length`); longer documents go in "
          f"windows sharing a quarter of their tokens, on both sides. Questions embedded as ordinary "
          f"queries. Torch threads = {p['threads']}.\n",
          table(["side", "chunks", "recall@1", "recall@3", "recall@5", "MRR"],
                [[who, how, *r["retrieval"][k].values()] for k, who, how in ROWS]),
          f"\nThe last row is informative: the reference with one pass over up to {ONE_PASS} tokens (MiniLM's "
          "positions) instead of the window.\n",
          "Served against the reference (cosine per vector): chunks alone and questions, min "
          f"{c['alone_and_queries_min_cosine']}; late chunks of the {c['late_within_window_documents']} documents "
          f"within one window, min {c['late_within_window_min_cosine']}; late chunks of the "
          f"{c['late_longer_documents']} longer documents, min {c['late_longer_min_cosine']} (all gated at ≥ 0.999). `usage.prompt_tokens` of a late-chunked request equals the "
          f"document's tokens for {c['prompt_tokens_equal_document_tokens']} of {ds['documents']} documents.\n",
          "Throughput through Ivy (one request per document, late-chunked or the same chunks alone; medians of "
          f"{p['repeats']} alternating runs; {p['clients']} client processes):\n",
          _speed_table(r["throughput"])]
    md.append("\nAt GPU speed (the simulated device, modelled step times): `python -m bench sim --only late-chunking` "
              "(`sim-late-chunking.md`).")
    md += ["\nRank of each question's target chunk (1 is best):\n",
           table(["question", "target", "entity", *[k for k, _, _ in ROWS]],
                 [[q.text, f"{q.doc}#{q.chunk}", q.entity, *[r["ranks"][q.id][k] for k, _, _ in ROWS]]
                  for q in data.questions])]
    return "\n".join(md)


def _speed_table(sets: dict) -> str:
    return table(["set", "documents", "chunks", "late docs/s", "late chunks/s", "alone docs/s", "alone chunks/s",
                  "late / alone"],
                 [[label, s["documents"], s["chunks"], s["late"]["median_docs_per_s"],
                   s["late"]["median_chunks_per_s"], s["alone"]["median_docs_per_s"],
                   s["alone"]["median_chunks_per_s"], s["late_over_alone"]] for label, s in sets.items()])


def plot(data: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    metrics = ["recall@1", "recall@3", "recall@5", "mrr"]
    for i, (k, _, _) in enumerate(ROWS[:4]):
        a.bar([j + i * 0.2 for j in range(len(metrics))], [data["retrieval"][k][m] for m in metrics], 0.2, label=k)
    a.set_xticks([j + 0.3 for j in range(len(metrics))], metrics)
    a.set_ylim(0, 1)
    a.set_title("Retrieval of the target chunk")
    a.legend(fontsize=8)
    sets = data["throughput"]
    for i, mode in enumerate(("late", "alone")):
        b.bar([j + i * 0.4 for j in range(len(sets))], [s[mode]["median_docs_per_s"] for s in sets.values()], 0.4,
              label=mode)
    b.set_xticks([j + 0.2 for j in range(len(sets))], list(sets))
    b.set_ylabel("documents / s")
    b.set_title("Throughput through Ivy")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
