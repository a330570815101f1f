"""Where the host path's time goes at GPU speed: batch-1 requests of 128
tokens, sequential, to Tulip's gRPC (pre-tokenized) and through Ivy (text),
timed by the compiled load generator.

Two runs per path. Unprofiled: the CPU each process spent per request
(Ivy; Tulip by thread; the load generator) and the machine's, from /proc
(``cpu.py``). Profiled: ``perf`` on Ivy and Tulip (native frames: Rust,
the kernel, the interpreter) and ``py-spy --native`` on Tulip (ROSE's
Python frames); the samples say which part of the path the CPU went to,
and the flame graphs go beside the results."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench.gpu.loadgen import Loadgen, grpc_input, http_input
from bench.harness import flamegraph, inputs
from bench.sim.cpu import CpuMeter
from bench.sim.latency import token_ids
from bench.sim.replicas import device_ms, now_ns, window

LENGTH = 128

# Parts of Tulip's CPU, by a frame its stack contains (first rule wins).
TULIP_PARTS = [
    ("ROSE's step (Python, under the GIL)", ("EngineHandle::step", "EngineHandle::release")),
    ("event wait (yield-spin until the step's end)", ("event::wait_for", "event::is_complete")),
    ("gRPC: tonic, hyper, h2, TCP", ("h2::", "hyper", "tonic::", "tcp_", "sock_", "sys_sendmsg", "sys_recvfrom",
                                     "__x64_sys_write", "__x64_sys_read")),
    ("request: validate, queue, rows, reply", ("service::", "validate::", "queue::", "completion::", "output::",
                                               "scheduler::", "prost::")),
    ("thread switches and wake-ups (kernel, tokio)", ("finish_task_switch", "schedule", "futex", "tokio::",
                                                      "epoll")),
]
IVY_PARTS = [
    ("tokenization", ("tokenizer::", "encode::", "unigram", "wordpiece", "pretokenize", "normalize")),
    ("JSON in and out", ("serde_json", "serde::", "body::", "respond::", "itoa", "ryu")),
    ("gRPC to Tulip: tonic, h2", ("h2::", "tonic::", "frame_client")),
    ("HTTP: hyper, axum, TCP", ("hyper", "axum", "tcp_", "sock_", "sys_sendmsg", "sys_recvfrom",
                                "__x64_sys_write", "__x64_sys_read")),
    ("pipeline and balancing", ("pipeline::", "upstream::", "request::", "metrics::")),
    ("thread switches and wake-ups (kernel, tokio)", ("finish_task_switch", "schedule", "futex", "tokio::",
                                                      "epoll")),
]
# ROSE's Python: the simulator's own host work (rows, log line) apart.
SIM_FRAMES = ("rose/sim/",)


def parts(folded: Counter, rules) -> dict[str, float]:
    """Share of the samples per part of the path."""
    total = sum(folded.values()) or 1
    out: Counter = Counter()
    for stack, n in folded.items():
        out[next((name for name, keys in rules if any(k in stack for k in keys)), "other")] += n
    return {k: round(v / total, 4) for k, v in out.most_common()}


def rose_python(folded: Counter) -> dict:
    """Of the samples inside ``step_arena``: ROSE's own, the simulator's."""
    step = {s: n for s, n in folded.items() if "step_arena" in s}
    total = sum(step.values()) or 1
    sim = sum(n for s, n in step.items() if any(k in s for k in SIM_FRAMES))
    return {"samples": sum(step.values()), "simulator_share": round(sim / total, 4)}


def profile(tulip, ivy, log: Path, model_dir: str, lg: Loadgen, requests: int, out_dir: Path, scratch: Path,
            profile_seconds: float = 8.0) -> dict:
    """The flame graphs go to ``out_dir``; the samplers' raw files (hundreds
    of MB of perf data) to ``scratch``."""
    seqs = [token_ids(LENGTH, seed=LENGTH + k) for k in range(4)]
    texts = [inputs.text_of_tokens(model_dir, LENGTH, start=7 * k) for k in range(4)]
    paths = {"tulip": ("grpc", tulip.target, grpc_input([[s] for s in seqs])),
             "ivy": ("http", f"127.0.0.1:{ivy.port}", http_input([{"input": t} for t in texts]))}
    pids = {"ivy": ivy.proc.pid, "tulip": tulip.proc.pid}
    out: dict = {"length": LENGTH, "requests": requests}
    for name, (mode, target, payload) in paths.items():
        lg.run(mode, target, payload, [1], 200)  # warm
        t0 = now_ns()
        with CpuMeter(pids) as meter:
            stats = lg.run(mode, target, payload, [1], requests, floor=True)
        steps = window(log, t0, now_ns())
        cpu = meter.result()
        sent = requests + 3  # the load generator's warm-up requests
        per = {k: round(v["cpu_s"] / sent * 1e6, 1) for k, v in cpu["processes"].items()}
        per["load generator"] = round(cpu["clients_cpu_s"] / sent * 1e6, 1)
        d = device_ms(steps)
        # Profiled: a separate run (the samplers cost CPU), long enough to cover it.
        sampler = flamegraph.Sampler(scratch / f"sim-host-{name}", pids, {"tulip": tulip.proc.pid},
                                     profile_seconds)
        # As many requests as the samplers' window holds at the measured rate.
        profiled = max(int(stats["1"]["requests_per_s"] * profile_seconds * 0.8), 100)
        with sampler:
            lg.run(mode, target, payload, [1], profiled, warmup=0, timeout=profile_seconds * 4 + 60)
        tulip_native = sampler.perf("tulip")
        ivy_native = sampler.perf("ivy")
        rose = sampler.pyspy("tulip")
        for label, folded in (("tulip", flamegraph.merged(tulip_native)), ("ivy", flamegraph.merged(ivy_native)),
                              ("tulip-python", rose)):
            if folded:
                flamegraph.write_svg(folded, out_dir / f"sim-host-{name}-{label}.svg",
                                     f"{label} during batch-1 {LENGTH}-token requests {'to Tulip' if name == 'tulip' else 'through Ivy'}")
        out[name] = {
            "latency_ms": stats["1"], "client_floor_ms": stats.get("floor"), "device_ms": round(d, 4),
            "added_p50_ms": round(stats["1"]["p50"] - d, 4), "added_p99_ms": round(stats["1"]["p99"] - d, 4),
            "cpu_us_per_request": per, "cpu": cpu,
            "tulip_parts": parts(flamegraph.merged(tulip_native), TULIP_PARTS) if tulip_native else None,
            "ivy_parts": parts(flamegraph.merged(ivy_native), IVY_PARTS) if ivy_native and name == "ivy" else None,
            "rose_python": rose_python(rose) if rose else None,
            "profiler_notes": sampler.notes,
        }
    return out
