"""CPU rows 2–4, the serving path's own cost: HTTP → Ivy → Tulip → ROSE with
the null model (no compute) against a plain Python server (FastAPI +
uvicorn) doing parse → tokenize → no-op model → respond, same text and
tokenizer on both sides.

- Latency, batch 1, 128 tokens, interleaved request by request: Ivy reaching
  Tulip over TCP (gRPC) and over a Unix socket (Tulip frames, Ivy's default
  there), against FastAPI in one process.
- The floor, measured in the same run: Ivy's HTTP floor (GET /health), a
  bare round trip between two processes with the same message sizes (tonic
  unary gRPC over TCP and over a Unix socket; Tulip frames over a Unix
  socket), ROSE's step in-process as Tulip calls it, and Ivy's own
  tokenization time. served / floor says how much the path adds beyond its
  parts; each side's floor uses the transport that side uses.
- Throughput: 64 concurrent keep-alive connections from a compiled client
  process (`bench/crates/loadgen`) against Ivy, FastAPI with one worker and FastAPI with one worker
  per core; Tulip's sequences per engine step.
- Idle cost: CPU used by Ivy and Tulip while nothing is sent.
- The same interleaved latency with the client and every server pinned to
  one core: no request waits for another core to wake up, which shows how
  much of each side's latency those wake-ups are on the machine at hand."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.harness import affinity, gate, inputs, metrics
from bench.harness.baseline_servers import FastApiBaseline
from bench.harness.httpclient import HttpClient
from bench.harness.profiling import profile_step
from bench.harness.results import REPO, table
from bench.harness.stack import IVY_PATH, Stack, http_embeddings
from bench.harness.timing import Stats, interleave, ratio, scaled, stream_stats, timed
from tulip_rose_cli import launch
from tulip_rose_cli.launch import TARGET_DIR, Ivy, Tulip
from tulip_rose_cli.processes import Process, free_port

TITLE = "Host overhead: Ivy → Tulip → ROSE (null model) vs FastAPI + uvicorn"
TOKENS = 128
NULL_CONFIG = {"model_type": "null", "hidden_size": 384, "vocab_size": 30522, "max_position_embeddings": 512}
FLOOR_BIN = TARGET_DIR / "release" / "grpc-floor"
LOAD_BIN = TARGET_DIR / "release" / "loadgen"


def null_model_dir() -> str:
    d = Path(tempfile.mkdtemp(prefix="bench-null-model-"))
    (d / "config.json").write_text(json.dumps(NULL_CONFIG))
    return str(d)


def build_tools() -> None:
    """The floor's tonic pair (bench/crates/floor) and the load client (bench/crates/loadgen)."""
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "grpc-floor", "-p", "loadgen"], cwd=REPO, check=True)


def hop_floor(log_dir: Path, rounds: int, warmup: int) -> dict[str, Stats]:
    """A bare client ↔ server round trip (128 token ids out, 384 floats
    back): tonic over loopback TCP and over a Unix socket, and Tulip frames
    over a Unix socket."""
    sock = tempfile.mktemp(prefix="grpc-floor-", suffix=".sock")
    out = {}
    for name, addr in (("tcp", f"http://127.0.0.1:{free_port()}"), ("unix", f"unix://{sock}"),
                       ("frames", f"frames://{sock}")):
        # One thread a side, as Ivy and Tulip run on a 2-core machine (their
        # defaults): a second idle worker roughly doubles this round trip.
        server = Process(f"grpc-floor-{name}", [str(FLOOR_BIN), "serve", addr, "--threads", "1"], None, log_dir)
        try:
            for _ in range(100):  # until it listens
                r = subprocess.run([str(FLOOR_BIN), "client", addr, "--rounds", "1", "--warmup", "0"],
                                   capture_output=True, text=True)
                if r.returncode == 0:
                    break
                time.sleep(0.05)
            r = subprocess.run([str(FLOOR_BIN), "client", addr, "--rounds", str(rounds), "--warmup", str(warmup),
                                "--threads", "1"],
                               capture_output=True, text=True, check=True)
            out[name] = Stats.of([us * 1e-6 for us in json.loads(r.stdout)["latency_us"]])
        finally:
            server.stop()
    return out


TRIALS = 3
# The side the targets are checked on: Ivy co-located with Tulip.
SERVED = "ivy (unix socket, frames)"
# Latency as a stream of queries: consecutive requests per side, the first
# few of each run untimed (placement and caches settle after a switch).
STREAM_BLOCK, STREAM_SETTLE = 500, 50


def load(port: int, body: Path, requests: int, connections: int = 64) -> dict:
    """A warm-up, then ``TRIALS`` runs of ``requests`` POSTs from
    ``connections`` keep-alive clients: the run with the median requests/s,
    with every trial's rate (single runs vary a lot on a shared VM)."""
    load_once(port, body, max(requests // 10, 640), connections)
    runs = sorted((load_once(port, body, requests, connections) for _ in range(TRIALS)),
                  key=lambda r: r["requests_per_s"])
    median = dict(runs[len(runs) // 2])
    median["trials_requests_per_s"] = [round(r["requests_per_s"], 1) for r in runs]
    return median


def load_once(port: int, body: Path, requests: int, connections: int = 64) -> dict:
    """``requests`` POSTs from ``connections`` keep-alive clients."""
    r = subprocess.run([str(LOAD_BIN), "--mode", "http", "--target", f"127.0.0.1:{port}", "--input", str(body),
                        "--concurrency", str(connections), "--requests", str(requests), "--warmup", "5"],
                       capture_output=True, text=True, check=True)
    level = json.loads(r.stdout)["levels"][str(connections)]
    level.pop("latencies_us", None)
    if level["errors"]:
        raise RuntimeError(f"{level['errors']} failed requests under load: {level['first_error']}")
    return level


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Percent of one core each process used while nothing was sent."""
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    time.sleep(seconds)
    return {k: round(100 * (cpu_seconds(p) - before[k]) / seconds, 2) for k, p in pids.items()}


def run(stack: Stack, rounds: int = 3000, warmup: int = 300, floor_rounds: int = 3000,
        load_requests: int = 40000, idle_seconds: float = 10.0) -> tuple[dict, str]:
    build_tools()
    tok_dir = stack.model_dir  # the real model's tokenizer; the model itself computes nothing
    dim, max_len = NULL_CONFIG["hidden_size"], NULL_CONFIG["max_position_embeddings"]
    text = inputs.text_of_tokens(tok_dir, TOKENS)
    ids = inputs.ids(tok_dir, text)
    null_dir = null_model_dir()
    sock = tempfile.mktemp(prefix="tulip-", suffix=".sock")
    body = Path(tempfile.mkdtemp(prefix="bench-overhead-")) / "body.json"
    body.write_text(json.dumps({"path": IVY_PATH, "bodies": [{"input": text}]}))
    tulip = Tulip(null_dir, log_dir=stack.log_dir, threads=1, unix_socket=sock)
    procs = [tulip]
    try:
        ivy_tcp = Ivy([tulip.url], tok_dir, log_dir=stack.log_dir)
        ivy_unix = Ivy([f"unix://{sock}"], tok_dir, log_dir=stack.log_dir)
        base = FastApiBaseline(tok_dir, log_dir=stack.log_dir, dim=dim, max_length=max_len)
        procs += [ivy_tcp, ivy_unix, base]
        servers = {SERVED: (ivy_unix.port, IVY_PATH), "ivy (tcp)": (ivy_tcp.port, IVY_PATH),
                   "fastapi": (base.port, FastApiBaseline.PATH)}
        clients = {k: HttpClient("127.0.0.1", port) for k, (port, _) in servers.items()}
        for name, (_, path) in servers.items():
            c = clients[name]
            stack.gates.append(gate.check_shape(name, http_embeddings(c, path, [text]), 1, dim,
                                                "one 384-dim row for one input"))
            status, got = c.post_json(path, {"input": text})
            if got["usage"]["prompt_tokens"] != TOKENS:
                raise gate.GateFailed(f"{name} counted {got['usage']['prompt_tokens']} tokens, expected {TOKENS}")
        reqs = {k: clients[k].prepare(path, {"input": text}) for k, (_, path) in servers.items()}
        sides = {k: (lambda i, c=clients[k], r=reqs[k]: c.send_ok(r)) for k in servers}
        interleave(sides, warmup, 0)
        before = metrics.parse(tulip.metrics())
        ivy_before = ivy_unix.metrics()
        lat = interleave(sides, rounds, 0, seed=2)
        stats = {k: Stats.of(v) for k, v in lat.items()}
        streamed = stream_stats(sides, rounds, STREAM_BLOCK, STREAM_SETTLE, seed=3)
        ivy_after = ivy_unix.metrics()
        tulip_stages = metrics.stage_means(before, metrics.parse(tulip.metrics()))
        tokenize_ms = _stage_mean(ivy_before, ivy_after, "tokenize")
        with affinity.one_core([p.proc.pid for p in procs]) as cpu:
            one_core = {k: Stats.of(v) for k, v in interleave(sides, rounds, warmup, seed=4).items()}

        health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        c = clients[SERVED]
        for _ in range(100):
            c.send_ok(health)
        http_floor = Stats.of([timed(lambda: c.send_ok(health)) for _ in range(floor_rounds)])
        for c in clients.values():
            c.close()

        idle = idle_cpu({"ivy": ivy_unix.proc.pid, "tulip": tulip.proc.pid}, idle_seconds)
        busy_before = metrics.parse(tulip.metrics())
        tput = {SERVED: load(ivy_unix.port, body, load_requests)}
        batches = metrics.batch_means(busy_before, metrics.parse(tulip.metrics()))
        for p in (ivy_tcp, base):
            p.stop()
            procs.remove(p)
    finally:
        for p in reversed(procs):
            p.stop()
    for workers, name in ((1, "fastapi, 1 worker"), (len(os.sched_getaffinity(0)), "fastapi, 1 worker per core")):
        server = FastApiBaseline(tok_dir, log_dir=stack.log_dir, dim=dim, max_length=max_len, workers=workers)
        try:
            tput[name] = load(server.port, body, load_requests // 4)
        finally:
            server.stop()

    floor_hop = hop_floor(stack.log_dir, floor_rounds, warmup)
    step = profile_step(null_dir, [ids], steps=floor_rounds)
    step_ms = step["mean_ms_per_step"]
    floor = {
        SERVED: http_floor.p50 + floor_hop["frames"].p50 + step_ms + tokenize_ms,
        "ivy (tcp)": http_floor.p50 + floor_hop["tcp"].p50 + step_ms + tokenize_ms,
    }
    fa = stats["fastapi"]
    summary = {
        "served_side": SERVED,
        "fastapi_over_served_p50": ratio(fa.p50, stats[SERVED].p50),
        "fastapi_over_served_p99": ratio(fa.p99, stats[SERVED].p99),
        "streamed": {
            "fastapi_over_served_p50": ratio(streamed["fastapi"].p50, streamed[SERVED].p50),
            "fastapi_over_served_p99": ratio(streamed["fastapi"].p99, streamed[SERVED].p99),
            "served_over_floor_p50": {k: ratio(streamed[k].p50, floor[k]) for k in floor},
        },
        "served_over_floor_p50": {k: ratio(stats[k].p50, floor[k]) for k in floor},
        "throughput_ratios": {
            "ivy / fastapi 1 worker": ratio(tput[SERVED]["requests_per_s"], tput["fastapi, 1 worker"]["requests_per_s"]),
            "ivy / fastapi 1 worker per core": ratio(tput[SERVED]["requests_per_s"],
                                                     tput["fastapi, 1 worker per core"]["requests_per_s"]),
        },
        "one_core": {
            "cpu": cpu,
            "fastapi_over_served_p50": ratio(one_core["fastapi"].p50, one_core[SERVED].p50),
            "fastapi_over_served_p99": ratio(one_core["fastapi"].p99, one_core[SERVED].p99),
        },
        "sequences_per_step": batches["tulip_batch_sequences"]["mean"],
        "idle_cpu_percent_of_a_core": idle,
    }
    data = {
        "params": {"ivy_binary": str(launch.IVY_BIN), "rounds": rounds, "warmup": warmup, "tokens": TOKENS, "batch": 1, "tokenizer": tok_dir,
                   "null_model": NULL_CONFIG, "order": "shuffled every round", "load_connections": 64,
                   "load_requests": {"ivy": load_requests, "fastapi": load_requests // 4},
                   "idle_seconds": idle_seconds},
        "stats": {k: s.to_dict() for k, s in stats.items()},
        "streamed_stats": {k: s.to_dict() for k, s in streamed.items()},
        "one_core_stats": {k: s.to_dict() for k, s in one_core.items()},
        "floor_ms": {"ivy_http_floor_p50": http_floor.p50, "grpc_tcp_p50": floor_hop["tcp"].p50,
                     "grpc_unix_p50": floor_hop["unix"].p50, "frames_unix_p50": floor_hop["frames"].p50,
                     "rose_step_mean": step_ms,
                     "ivy_tokenize_mean": tokenize_ms, "total": floor},
        "hop_floor": {k: s.to_dict() for k, s in floor_hop.items()},
        "throughput": tput,
        "tulip_stage_means": tulip_stages,
        "tulip_batches_under_load": batches,
        "rose_null_step": step,
        **summary,
    }
    return data, _markdown(data, stats, streamed, one_core, floor, tput, rounds, warmup)


def _shown(path: str) -> str:
    """A path relative to the repository when it is inside it."""
    p = Path(path)
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else path


def _stage_mean(before: dict[str, float], after: dict[str, float], stage: str) -> float:
    key = f'ivy_stage_duration_seconds_{{}}{{{{stage="{stage}"}}}}'
    n = after.get(key.format("count"), 0) - before.get(key.format("count"), 0)
    s = after.get(key.format("sum"), 0) - before.get(key.format("sum"), 0)
    return round(s / n * 1e3, 4) if n else 0.0


def _latency_table(stats: dict[str, Stats]) -> str:
    return table(["side", "count", "p50 ms", "p90 ms", "p99 ms", "mean ms"],
                 [[k, s.count, s.p50, s.p90, s.p99, s.mean] for k, s in stats.items()])


def _markdown(data, stats, streamed, one_core, floor, tput, rounds, warmup) -> str:
    fl = data["floor_ms"]
    served = data["served_side"]
    tr = data["throughput_ratios"]
    return "\n".join([
        f"One input of {TOKENS} tokens (real English text, the all-MiniLM-L6-v2 tokenizer on both sides), "
        f"null model (zeros, no compute), {rounds} interleaved rounds after {warmup} warm-up rounds; "
        "one Tulip serves both Ivy sides (one reaches it over TCP with gRPC, one over its Unix socket with "
        "Tulip frames). "
        f"Ivy binary: `{_shown(data['params']['ivy_binary'])}`.\n",
        "## Latency, batch 1\n",
        _latency_table(stats),
        f"\nServed = {served}. FastAPI p50 / served p50 = **{data['fastapi_over_served_p50']}×** "
        f"(target ≥ 2.5); p99 ratio **{data['fastapi_over_served_p99']}×** (target ≥ 2).\n",
        "Above, the sides take turns request by request, so before every request the other servers' work "
        "has run on the cores and displaced caches. Below, the same "
        f"request as a server answering a stream of queries sees it: runs of {STREAM_BLOCK} consecutive "
        f"requests per side (the first {STREAM_SETTLE} of each run untimed), sides alternating run by run.\n",
        _latency_table(streamed),
        f"\nStreamed: FastAPI p50 / served p50 = **{data['streamed']['fastapi_over_served_p50']}×**; "
        f"p99 ratio **{data['streamed']['fastapi_over_served_p99']}×**.\n",
        f"Interleaved again, with this client and every server process (all their threads) pinned to CPU "
        f"{data['one_core']['cpu']}: each hop is a context switch on that core instead of a wake-up of "
        "another (on a virtual machine, an idle virtual CPU is woken through the hypervisor). Not a "
        "target; the difference from the first table is what those wake-ups cost each side here.\n",
        _latency_table(one_core),
        f"\nOne core: FastAPI p50 / served p50 = **{data['one_core']['fastapi_over_served_p50']}×**; "
        f"p99 ratio **{data['one_core']['fastapi_over_served_p99']}×**.\n",
        "## The floor (same run)\n",
        table(["part", "ms"], [
            ["Ivy's HTTP floor: GET /health, client-observed p50", fl["ivy_http_floor_p50"]],
            ["bare tonic ↔ tonic unary round trip, 128 ids out, 384 floats back, one runtime thread a side, TCP p50",
             fl["grpc_tcp_p50"]],
            ["the same over a Unix socket, p50", fl["grpc_unix_p50"]],
            ["Tulip frames round trip over a Unix socket (Ivy's transport to a unix:// Tulip), one runtime "
             "thread a side, p50", fl["frames_unix_p50"]],
            ["ROSE's step in-process as Tulip calls it (step_arena → release), mean",
             fl["rose_step_mean"]],
            ["Ivy's tokenization of the input (its own stage metric), mean", fl["ivy_tokenize_mean"]],
            *[[f"floor for {k}", round(v, 4)] for k, v in floor.items()],
        ]),
        "\nserved p50 / floor: " + ", ".join(f"{k} **{v}×**" for k, v in data["served_over_floor_p50"].items())
        + " (target ≤ 1.5); streamed: " + ", ".join(
            f"{k} **{v}×**" for k, v in data["streamed"]["served_over_floor_p50"].items())
        + ". The floor's parts are each measured alone, back to back (warm).\n",
        "## Throughput, 64 concurrent keep-alive connections (compiled client, `bench/crates/loadgen`)\n",
        f"Each server: a warm-up, then {TRIALS} runs; the table shows the run with the median requests/s.\n",
        table(["server", "requests", "requests/s", "p50 ms", "p99 ms", "requests/s of every run"],
              [[k, v["count"], round(v["requests_per_s"], 1), v["p50"], v["p99"],
                ", ".join(map(str, v["trials_requests_per_s"]))] for k, v in tput.items()]),
        f"\nIvy / FastAPI one worker **{tr['ivy / fastapi 1 worker']}×** (target ≥ 10); Ivy / FastAPI one "
        f"worker per core **{tr['ivy / fastapi 1 worker per core']}×** (target ≥ 5). Tulip under this load: "
        f"{data['sequences_per_step']} sequences per engine step.\n",
        "## Idle cost\n",
        "CPU while idle, percent of one core: " + ", ".join(
            f"{k} {v}%" for k, v in data["idle_cpu_percent_of_a_core"].items()) + " (target ≤ 2% each).\n",
        "Tulip's own clock during the latency rounds (/metrics means): " + ", ".join(
            f"{v['what']} {v['mean_ms']} ms" for v in data["tulip_stage_means"].values()) + ".\n",
    ])


def options(scale: float) -> dict:
    return {"rounds": scaled(3000, scale, 100), "warmup": scaled(300, scale, 20),
            "floor_rounds": scaled(3000, scale, 100), "load_requests": scaled(40000, scale, 2000),
            "idle_seconds": max(2.0, 10.0 * scale)}
