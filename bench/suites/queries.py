"""CPU rows 3 and 4: online embedding of real queries, batch 1, through Ivy
(HTTP → tokenize → gRPC → Tulip → ROSE) against, in the same run and
interleaved request by request: ``sentence-transformers`` ``encode``
in-process, a bare ``transformers`` forward on the same token ids (same torch
thread count), fastembed's runtime in-process (ONNX Runtime + tokenizers,
same threads) and Infinity serving the same model directory. A second Ivy
reaches its own Tulip over a Unix socket (Tulip frames), as where both
share a host."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.harness import inputs, metrics, plots
from bench.harness.baseline_servers import INFINITY_MODEL_NAME, Infinity
from bench.harness.httpclient import HttpClient
from bench.harness.profiling import PerfRecord, perf_table
from bench.harness.results import table
from bench.harness.stack import IVY_PATH, Stack
from bench.harness.timing import Stats, interleave, ratio, scaled, stream_stats

TITLE = "Online embedding of real queries, batch 1: Ivy vs in-process and Infinity"
STREAM_BLOCK, STREAM_SETTLE = 50, 5


def run(stack: Stack, rounds: int = 300, warmup: int = 30, n_queries: int = 64) -> tuple[dict, str]:
    texts = inputs.queries(stack.model_dir, n_queries)
    lengths = [len(stack.ids(t)) for t in texts]
    ivy = stack.ivy()
    # As docs/latency.md advises where Ivy and Tulip share a host.
    colocated_tulip, colocated = stack.colocated()
    st, bare = stack.st(), stack.bare()
    notes: list[str] = []
    ort = stack.onnxruntime_or_note(notes)
    inf = stack.infinity_or_note(notes)

    ivy_c = HttpClient("127.0.0.1", ivy.port)
    ivy_reqs = [ivy_c.prepare(IVY_PATH, {"input": t}) for t in texts]
    prepared = [bare.prepare([stack.ids(t)]) for t in texts]
    n = len(texts)
    unix_c = HttpClient("127.0.0.1", colocated.port)
    unix_reqs = [unix_c.prepare(IVY_PATH, {"input": t}) for t in texts]
    sides = {
        "ivy": lambda i: ivy_c.send_ok(ivy_reqs[i % n]),
        "ivy (unix socket)": lambda i: unix_c.send_ok(unix_reqs[i % n]),
        "sentence-transformers": lambda i: st.encode(texts[i % n]),
        "transformers forward": lambda i: bare.forward(prepared[i % n]),
    }
    if ort is not None:
        sides["onnxruntime"] = lambda i: ort.encode([texts[i % n]])
    clients = [ivy_c, unix_c]
    if inf is not None:
        inf_c = HttpClient("127.0.0.1", inf.port)
        clients.append(inf_c)
        inf_reqs = [inf_c.prepare(Infinity.PATH, {"input": t, "model": INFINITY_MODEL_NAME}) for t in texts]
        sides["infinity"] = lambda i: inf_c.send_ok(inf_reqs[i % n])

    interleave(sides, warmup, 0)
    before = metrics.parse(stack.tulip().metrics())
    unix_before = metrics.parse(colocated_tulip.metrics())
    lat = interleave(sides, rounds, 0, seed=1)
    after = metrics.parse(stack.tulip().metrics())
    unix_fast_steps = metrics.steps(metrics.parse(colocated_tulip.metrics()), "onnx") - metrics.steps(unix_before, "onnx")
    stages = metrics.stage_means(before, after)
    fast_steps = metrics.steps(after, "onnx") - metrics.steps(before, "onnx")
    twin_steps = metrics.steps(after, "bf16") - metrics.steps(before, "bf16")
    stats = {k: Stats.of(v) for k, v in lat.items()}
    # As a server answering a stream of queries sees them: runs of
    # consecutive requests per side. Request by request, an in-process
    # side's idle OpenMP threads still spin on the cores when the next
    # side's request arrives.
    streamed = stream_stats(sides, rounds, STREAM_BLOCK, STREAM_SETTLE, seed=2)
    # Profiled on its own pass, so that perf does not slow the timed rounds.
    perf = PerfRecord([ivy.proc.pid, stack.tulip().proc.pid], stack.log_dir / "queries.perf.data", freq=999)
    with perf:
        for i in range(max(rounds // 3, 20)):
            sides["ivy"](i)
    perf_top = perf.top()

    p50 = {k: s.p50 for k, s in stats.items()}
    sp50 = {k: s.p50 for k, s in streamed.items()}
    ratios = {
        "ivy / sentence-transformers": ratio(p50["ivy"], p50["sentence-transformers"]),
        "ivy / transformers forward": ratio(p50["ivy"], p50["transformers forward"]),
        "streamed: ivy / sentence-transformers": ratio(sp50["ivy"], sp50["sentence-transformers"]),
        "streamed: ivy / transformers forward": ratio(sp50["ivy"], sp50["transformers forward"]),
    }
    if "onnxruntime" in p50:
        ratios["ivy / onnxruntime"] = ratio(p50["ivy"], p50["onnxruntime"])
        ratios["streamed: ivy / onnxruntime"] = ratio(sp50["ivy"], sp50["onnxruntime"])
        ratios["ivy (unix socket) / onnxruntime"] = ratio(p50["ivy (unix socket)"], p50["onnxruntime"])
        ratios["streamed: ivy (unix socket) / onnxruntime"] = ratio(sp50["ivy (unix socket)"],
                                                                    sp50["onnxruntime"])
    if "infinity" in p50:
        ratios["infinity / ivy"] = ratio(p50["infinity"], p50["ivy"])
        ratios["streamed: infinity / ivy"] = ratio(sp50["infinity"], sp50["ivy"])
    ivy_mean = stats["ivy"].mean
    server = stages["tulip_request_duration_seconds"]["mean_ms"]
    breakdown = {
        "client-observed mean, ivy (ms)": ivy_mean,
        "outside Tulip: HTTP, JSON, tokenization, gRPC hop (ms)": round(ivy_mean - server, 4) if server else None,
        **{v["what"] + " (ms)": v["mean_ms"] for v in stages.values()},
    }
    data = {
        "params": {"rounds": rounds, "warmup": warmup, "queries": n, "threads": stack.threads,
                   "tokens": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
                   "model_dir": stack.model_dir, "dtype": "float32", "order": "shuffled every round"},
        "stats": {k: s.to_dict() for k, s in stats.items()},
        "streamed_stats": {k: s.to_dict() for k, s in streamed.items()},
        "ratios_p50": ratios,
        "ivy_stage_means": stages,
        "ivy_breakdown_ms": breakdown,
        "perf_ivy_and_tulip": {"top": perf_top, "error": perf.error},
        "tulip_fast_path_steps": fast_steps,
        "colocated_tulip_fast_path_steps": unix_fast_steps,
        "tulip_bf16_steps": twin_steps,
        "notes": notes,
        "http_reconnects": sum(c.reconnects for c in clients),
    }
    md = [f"Real English queries ({min(lengths)}–{max(lengths)} tokens, median {statistics.median(lengths)}), "
          f"batch 1, {rounds} interleaved rounds after {warmup} warm-up rounds, torch threads = {stack.threads}, "
          "fp32.\n",
          table(["side", "count", "p50 ms", "p90 ms", "p99 ms", "mean ms"],
                [[k, s.count, s.p50, s.p90, s.p99, s.mean] for k, s in stats.items()]),
          f"\nStreamed: the same requests in runs of {STREAM_BLOCK} consecutive requests per side (the first "
          f"{STREAM_SETTLE} of each run untimed), sides alternating run by run:\n",
          table(["side", "count", "p50 ms", "p90 ms", "p99 ms", "mean ms"],
                [[k, s.count, s.p50, s.p90, s.p99, s.mean] for k, s in streamed.items()]),
          f"\nTulip ran {fast_steps:.0f} of the {rounds} timed Ivy requests' steps on the CPU fast path "
          f"(ONNX Runtime, `tulip_steps_total{{mode=\"onnx\"}}`) and {twin_steps:.0f} on the bfloat16 twin "
          "(`mode=\"bf16\"`: `--cpu-bf16 auto`, where the CPU has AMX; it then takes small steps too); "
          f"the co-located Tulip ran {unix_fast_steps:.0f} of its {rounds} on the fast path.\n",
          "\nRatios of p50:\n",
          table(["ratio", "value"], [[k, v] for k, v in ratios.items()]),
          "\nWhere Ivy's time goes (means over the timed rounds; Tulip's stages from its /metrics):\n",
          table(["stage", "ms"], [[k, v] for k, v in breakdown.items()]),
          "\nIvy and Tulip on a separate pass of Ivy requests: " + perf_table(perf_top, perf.error),
          *[f"\nNote: {x}" for x in notes]]
    for c in clients:
        c.close()
    return data, "\n".join(md)


def options(scale: float) -> dict:
    return {"rounds": scaled(300, scale, 20), "warmup": scaled(30, scale, 5)}


def plot(data: dict, path: Path) -> Path:
    groups = {"interleaved": {k: v["p50"] for k, v in data["stats"].items()},
              "streamed": {k: v["p50"] for k, v in data["streamed_stats"].items()}}
    return plots.throughput_bars(groups, path, "Queries, batch 1: p50 latency per side", ylabel="p50 latency, ms")
