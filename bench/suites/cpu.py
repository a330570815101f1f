"""The CPU suite (``make bench``): every row of the CPU table in
``bench/TARGETS.md`` with its baseline measured in the same run, the published
charts' shapes at CPU sizes, the overlap comparison, and a dry run of the GPU
script. Writes each benchmark's files, the plots, and ``README.md`` (the
summary against the targets) into one results folder."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench.harness import plots
from bench.harness.gate import GateFailed
from bench.harness.results import REPO, Writer, now, table
from bench.harness.stack import Stack
from bench.suites import tokenizer

# In this order: cheap and independent first, so a late failure loses little.
# (``throughput``, chart 3's gRPC form, is left to the GPU script and its own
# command: on the CPU ``batch`` measures the same work with its baselines.)
SUITE = ("overhead", "queries", "online", "scoring", "batch", "concurrency", "overlap", "cpu-steps")


def _gpu_dry_run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "bench.gpu.run", "--dry-run", "--out", tmp], cwd=REPO,
                             capture_output=True, text=True, timeout=600)
        ok = res.returncode == 0 and (Path(tmp) / "gpu.json").is_file()
        return {"passed": ok, "seconds": round(time.perf_counter() - start, 1),
                "output_tail": (res.stdout + res.stderr)[-1500:]}


def run_suite(writer: Writer, args) -> int:
    t0 = time.perf_counter()
    load_start = os.getloadavg()
    outcome: dict[str, dict] = {}
    log = lambda msg: print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", flush=True)  # noqa: E731

    log("GPU script, dry run on the CPU")
    outcome["gpu-dry-run"] = _gpu_dry_run()
    log(f"  passed: {outcome['gpu-dry-run']['passed']}")

    log("tokenizer (delegated to the tokenizer's benchmark program)")
    outcome["tokenizer"] = tokenizer.run_program(writer.out_dir)
    log(f"  {outcome['tokenizer']['status']}")

    data: dict[str, dict] = {}
    with Stack(args.model, threads=args.threads) as stack:
        for name in SUITE:
            module = importlib.import_module(f"bench.{name.replace('-', '_')}")
            started = now()
            log(f"{name}: {module.TITLE}")
            try:
                result, md = module.run(stack, **module.options(args.scale))
            except GateFailed as e:
                outcome[name] = {"status": "refused: correctness gate failed", "error": str(e)}
                log(f"  REFUSED: {e}")
                continue
            except Exception as e:  # one broken benchmark must not lose the others' results
                outcome[name] = {"status": "error", "error": f"{type(e).__name__}: {e}",
                                 "traceback": traceback.format_exc()[-3000:]}
                log(f"  ERROR: {e}")
                continue
            writer.write(name, module.TITLE, result, md, list(stack.gates), started, stack.extra_versions())
            data[name] = result
            outcome[name] = {"status": "ok"}
            log("  done")
        gates = list(stack.gates)

    pngs = _plots(data, writer.out_dir)
    elapsed = time.perf_counter() - t0
    load = {"start": [round(x, 2) for x in load_start], "end": [round(x, 2) for x in os.getloadavg()]}
    summary = _summary(data, outcome, writer, pngs, elapsed, gates, load)
    (writer.out_dir / "README.md").write_text(summary)
    (writer.out_dir / "cpu.json").write_text(json.dumps(
        {"command": writer.command, "finished": now(), "seconds": round(elapsed, 1), "outcome": outcome,
         "load_average": load, "targets": _targets(data, writer.out_dir), "gates": gates}, indent=1, default=str) + "\n")
    log(f"suite finished in {elapsed:.0f}s → {writer.out_dir}")
    return 0 if all(o.get("status", "ok") == "ok" or o.get("status") in ("ran", "not available")
                    for k, o in outcome.items() if k != "gpu-dry-run") else 1


def _plots(data: dict, out: Path) -> list[str]:
    made = []
    if "online" in data:
        made.append(plots.latency_vs_length(data["online"], out / "latency_vs_length.png").name)
    if "concurrency" in data:
        made.append(plots.latency_vs_concurrency(data["concurrency"], out / "latency_vs_concurrency.png").name)
    groups = {}
    if "batch" in data:
        groups[f"text via HTTP, {data['batch']['params']['tokens_per_document']} tok"] = data["batch"]["best"]
    if "throughput" in data:
        for n, r in data["throughput"]["by_length"].items():
            groups[f"ids via gRPC, {n} tok"] = r["best"]
    if groups:
        made.append(plots.throughput_bars(groups, out / "throughput.png",
                                          "Batch embedding: 100 documents per request, 4 clients").name)
    return made


def _row(name, baseline, target, measured, met, detail):
    return {"benchmark": name, "baseline": baseline, "target": target, "measured": measured, "met": met,
            "detail": detail}


def _targets(data: dict, out: Path) -> list[dict]:
    """Each CPU target of bench/TARGETS.md with the measured ratio."""
    rows = []
    sp = tokenizer.speedups(out)
    xlmr = [v for k, v in sp.items() if "xlm" in k.lower()]
    rows.append(_row("Tokenizer (XLM-R Unigram, queries and documents)", "HF tokenizers crate",
                     "identical ids; ≥ 5× faster p50 on both",
                     ", ".join(f"{k}: {v:.2f}×" for k, v in sp.items()) or "not measured",
                     (len(xlmr) >= 2 and min(xlmr) >= 5) if xlmr else None, "tokenizer.md"))
    o = data.get("overhead")
    if o:
        served = o["served_side"]
        floor = o["served_over_floor_p50"][served]
        tr = o["throughput_ratios"]
        rows.append(_row("Host overhead, null model, batch 1, 128 tokens", "FastAPI + uvicorn, one process",
                         "≥ 2.5× lower p50, ≥ 2× lower p99, ≤ 1.5× the floor",
                         f"{o['fastapi_over_served_p50']}× p50, {o['fastapi_over_served_p99']}× p99, "
                         f"{floor}× the floor ({served} p50 {o['stats'][served]['p50']:.3f} ms)"
                         f"; all on one core: {o['one_core']['fastapi_over_served_p50']}× p50, "
                         f"{o['one_core']['fastapi_over_served_p99']}× p99",
                         o["fastapi_over_served_p50"] >= 2.5 and o["fastapi_over_served_p99"] >= 2 and floor <= 1.5,
                         "overhead.md"))
        st = o.get("streamed")
        if st:
            sfloor = st["served_over_floor_p50"][served]
            rows.append(_row("Host overhead as a stream of queries (runs of consecutive requests per side)",
                             "FastAPI + uvicorn, one process",
                             "≥ 2.5× lower p50, ≥ 2× lower p99, ≤ 1.5× the floor",
                             f"{st['fastapi_over_served_p50']}× p50, {st['fastapi_over_served_p99']}× p99, "
                             f"{sfloor}× the floor ({served} p50 {o['streamed_stats'][served]['p50']:.3f} ms)",
                             st["fastapi_over_served_p50"] >= 2.5 and st["fastapi_over_served_p99"] >= 2
                             and sfloor <= 1.5, "overhead.md"))
        rows.append(_row("Host-bound throughput, null model, 64 connections", "FastAPI, 1 worker / 1 per core",
                         "≥ 10× / ≥ 5×",
                         f"{tr['ivy / fastapi 1 worker']}× / {tr['ivy / fastapi 1 worker per core']}×",
                         tr["ivy / fastapi 1 worker"] >= 10 and tr["ivy / fastapi 1 worker per core"] >= 5,
                         "overhead.md"))
        idle = o["idle_cpu_percent_of_a_core"]
        rows.append(_row("Idle cost", "—", "≤ 2% of a core each",
                         ", ".join(f"{k} {v}%" for k, v in idle.items()), max(idle.values()) <= 2, "overhead.md"))
    else:
        rows.append(_row("Host overhead, null model, batch 1, 128 tokens", "FastAPI + uvicorn, one process",
                         "≥ 2.5× lower p50", "not measured", None, "overhead.md"))
    q = data.get("queries")
    if q:
        r = q["ratios_p50"]
        streamed = r.get("streamed: ivy / sentence-transformers")
        rows.append(_row("Online, MiniLM, batch 1, through Ivy", "sentence-transformers encode",
                         "≤ 0.75× its p50", f"{r['ivy / sentence-transformers']}× (streamed: {streamed}×)",
                         r["ivy / sentence-transformers"] <= 0.75, "queries.md"))
        rows.append(_row("Online, MiniLM, batch 1, through Ivy", "bare transformers forward, same ids",
                         "≤ 1.10× its p50", f"{r['ivy / transformers forward']}×",
                         r["ivy / transformers forward"] <= 1.10, "queries.md"))
        ort = r.get("ivy / onnxruntime")
        rows.append(_row("Online, MiniLM, batch 1, through Ivy", "ONNX Runtime in-process (fastembed's runtime)",
                         "≤ 1.0× its p50", f"{ort}× (streamed: {r.get('streamed: ivy / onnxruntime')}×)" if ort
                         else "not measured", (ort <= 1.0) if ort else None, "queries.md"))
        inf = r.get("infinity / ivy")
        rows.append(_row("Online, MiniLM, batch 1, through Ivy", "Infinity, same model", "≥ 2.5× lower p50",
                         f"{inf}× lower" if inf else "not measured", (inf >= 2.5) if inf else None, "queries.md"))
    b = data.get("batch")
    if b:
        r = b["ratios"]
        rows.append(_row("Batch, MiniLM, 100 docs/request, 4 clients", "sentence-transformers in-process",
                         "≥ 1.0×", f"{r['ivy / sentence-transformers']}×",
                         r["ivy / sentence-transformers"] >= 1.0, "batch.md"))
        ort = r.get("ivy / onnxruntime")
        rows.append(_row("Batch, MiniLM, 100 docs/request, 4 clients", "ONNX Runtime in-process (fastembed's runtime)",
                         "≥ 1.5×", f"{ort}×" if ort else "not measured", (ort >= 1.5) if ort else None, "batch.md"))
        inf = r.get("ivy / infinity")
        rows.append(_row("Batch, MiniLM, 100 docs/request, 4 clients", "Infinity", "≥ 1.3×",
                         f"{inf}×" if inf else "not measured", (inf >= 1.3) if inf else None, "batch.md"))
    return rows


def _summary(data, outcome, writer: Writer, pngs, elapsed, gates, load) -> str:
    targets = _targets(data, writer.out_dir)
    mark = {True: "met", False: "**missed**", None: "not measured"}
    lines = [
        "# CPU benchmark suite", "",
        f"Command: `{' '.join(writer.command)}` (what `make bench` runs), {elapsed / 60:.1f} minutes.  ",
        "Every ratio is against a baseline measured in the same run on the same machine; see each "
        "benchmark's markdown file for percentiles, counts, the machine and the versions. Absolute times on "
        "this shared 2-core machine mean little; the ratios are the result.  ",
        f"Load average (1/5/15 min) at the start {load['start']}, at the end {load['end']} "
        f"({len(os.sched_getaffinity(0))} usable cores).", "",
        "## The CPU targets (bench/TARGETS.md)", "",
        table(["benchmark", "baseline (same run)", "target", "measured", "", "details"],
              [[t["benchmark"], t["baseline"], t["target"], t["measured"], mark[t["met"]], t["detail"]]
               for t in targets]), "",
        "## Every benchmark in this run", "",
        table(["benchmark", "status", "file"],
              [[k, v.get("status", "passed" if v.get("passed") else "failed"),
                f"{k}.md" if (writer.out_dir / f"{k}.md").is_file() else "–"] for k, v in outcome.items()]),
        "", "Correctness gates (cosine against sentence-transformers on the same weights, ≥ 0.999):", "",
        table(["side", "rows", "min cosine / check", "passed"],
              [[g["side"], g["rows"], g.get("min_cosine", g.get("shape")), g["passed"]] for g in gates]),
        "", "Plots: " + ", ".join(f"[{p}]({p})" for p in pngs), "",
    ]
    for name, o in outcome.items():
        if o.get("error") or o.get("reason"):
            lines.append(f"- {name}: {o.get('status')}: {o.get('error') or o.get('reason')}")
    return "\n".join(lines) + "\n"
