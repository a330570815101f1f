"""``python -m bench sim --only late-chunking``: issue 46's throughput
comparison at GPU speed. Ivy in front of one Tulip on the simulated device
(BGE-M3 on one H200, the roofline cost model): the late-chunking dataset
(``bench/data/late_chunking/``) embedded one request per document, late-chunked
vs the same chunks alone, from concurrent clients; documents/s, chunks/s and
the modelled device time per document from the device's log. Outputs are
not a model's here, so there is no retrieval figure: that is
``python -m bench late-chunking``'s. Results: ``sim-late-chunking.{md,json}``."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.harness import late_chunking_served as served
from bench.harness.httpclient import HttpClient
from bench.harness.late_chunking_dataset import load
from bench.harness.results import now, table
from bench.sim.replicas import Fleet, window
from bench.suites.late_chunking import QUICK_DOCS
from rose.sim import DEFAULT_COST

TITLE = "Late chunking at GPU speed: documents/s late-chunked vs chunks alone on the simulated device"


def run(writer, quick: bool, model_dir: Path, work: Path) -> Path:
    data = load().subset(QUICK_DOCS) if quick else load()
    copies, repeats, clients = (1, 1, 2) if quick else (4, 3, 4)
    sets = [("dataset", 1)] + ([(f"dataset x{copies}", copies)] if copies > 1 else [])
    started = now()
    fleet = Fleet(model_dir, work)
    try:
        tulip, log = fleet.tulip("late-chunking")
        ivy = fleet.ivy([tulip], "late-chunking")
        with HttpClient("127.0.0.1", ivy.port) as c:
            served.probe(c, list(data.documents[0].chunks))
        served.throughput(ivy.port, data, 1, clients, 1)  # warm-up: every step shape seen once
        out = {}
        for label, n in sets:
            res = served.throughput(ivy.port, data, n, clients, repeats)
            for mode in ("late", "alone"):
                device = [sum(s["end"] - s["start"] for s in window(log, lo, hi)) / 1e6
                          for lo, hi in res[mode]["spans_ns"]]
                res[mode]["device_ms_per_document"] = round(statistics.median(device) / res["documents"], 4)
            out[label] = res
    finally:
        fleet.close()
    result = {"model_dir": str(model_dir), "cost_model": {**DEFAULT_COST.to_dict(), "text": DEFAULT_COST.describe()},
              "quick": quick, "documents": len(data.documents), "sets": out}
    path = writer.write("sim-late-chunking", TITLE, result, markdown(result), fleet.gates, started)
    return path


def markdown(r: dict) -> str:
    any_set = next(iter(r["sets"].values()))
    rows = [[label, s["documents"], s["chunks"], s["late"]["median_docs_per_s"], s["late"]["median_chunks_per_s"],
             s["alone"]["median_docs_per_s"], s["alone"]["median_chunks_per_s"], s["late_over_alone"],
             s["late"]["device_ms_per_document"], s["alone"]["device_ms_per_document"]]
            for label, s in r["sets"].items()]
    return "\n".join([
        f"The late-chunking dataset ({r['documents']} documents, XLM-R tokens here) through Ivy → one Tulip on the "
        f"simulated device: the host path is real, the device time modelled, not measured ({r['cost_model']['text']}). "
        f"One request per document, late-chunked or the same chunks alone, {any_set['clients']} client processes, "
        f"medians of {any_set['repeats']} alternating runs. Device ms per document: the modelled step time in a "
        "run's window over its documents.\n",
        table(["set", "documents", "chunks", "late docs/s", "late chunks/s", "alone docs/s", "alone chunks/s",
               "late / alone", "late device ms/doc", "alone device ms/doc"], rows)])
