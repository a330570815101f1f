"""Load on the simulated device: saturation (is the device kept busy?),
fan-out (how many replicas one Ivy feeds) and priority classes at GPU
defaults (queries while indexing)."""

from __future__ import annotations

import statistics

from bench.gpu.loadgen import Loadgen, http_input
from bench.harness.clients import grpc_clients
from bench.sim.cpu import CpuMeter
from bench.sim.latency import token_ids
from bench.sim.replicas import busy, now_ns, window
from rose.sim import overlapping

NS = 1e9


def saturation(servers: dict, length: int, batch: int, clients: int, requests: int, rounds: int) -> dict:
    """``clients`` processes send ``requests`` requests of ``batch``
    pre-tokenized documents each, back to back, to each of ``servers``
    ({"on": (tulip, log) with --max-inflight 2, "off": ... 1}) in
    alternating blocks. Busy fraction = modelled device busy time / the
    clients' wall time."""
    docs = [token_ids(length, seed=2000 + k) for k in range(batch * 2)]
    per_client = [[[docs[(c * 31 + r * batch + j) % len(docs)] for j in range(batch)] for r in range(requests)]
                  for c in range(clients)]
    for tulip, _ in servers.values():  # warm: every step shape seen once
        grpc_clients(tulip.target, [c[:1] for c in per_client], timeout=600)
    res: dict[str, dict[str, list[float]]] = {k: {"emb_per_s": [], "busy": []} for k in servers}
    steps: dict[str, list[dict]] = {k: [] for k in servers}
    for r in range(rounds):
        for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
            tulip, log = servers[name]
            run = grpc_clients(tulip.target, per_client, timeout=600)
            starts = [s for c in run.spans for s, _ in c]
            ends = [e for c in run.spans for _, e in c]
            # perf_counter is CLOCK_MONOTONIC on Linux: the sim log's clock.
            lo, hi = int(min(starts) * NS), int(max(ends) * NS)
            res[name]["emb_per_s"].append(clients * requests * batch / run.wall)
            res[name]["busy"].append(busy(log, lo, hi))
            steps[name] += window(log, lo, hi)
    out = {}
    for name, v in res.items():
        st = steps[name]
        out[name] = {"emb_per_s": round(statistics.median(v["emb_per_s"]), 1),
                     "busy_fraction": round(statistics.median(v["busy"]), 4),
                     "rounds": {k: [round(x, 4) for x in xs] for k, xs in v.items()},
                     "steps": len(st), "overlapping_launches": overlapping(st),
                     "device_ms_per_step": round(statistics.median(s["end"] - s["start"] for s in st) / 1e6, 3),
                     "sequences_per_step": round(statistics.median(s["sequences"] for s in st), 1)}
    # What one device could do if never idle, from the cost model's own
    # step times: the ceiling the measured rate is set against.
    on_steps = steps["on"]
    seqs, busy_ns = sum(s["sequences"] for s in on_steps), sum(s["end"] - s["start"] for s in on_steps)
    out["device_roof_emb_per_s"] = round(seqs / (busy_ns / NS), 1)
    out["on_over_off"] = round(out["on"]["emb_per_s"] / out["off"]["emb_per_s"], 3)
    return out


def fanout(fleet, levels: list[int], texts_per_request: int, length: int, requests_per_replica: int,
           clients_per_replica: int, lg: Loadgen | None, first=None) -> dict:
    """One Ivy over N simulated replicas, real text (``texts_per_request``
    texts of ``length`` tokens, base64 vectors, as OpenAI's Python client
    asks), ``clients_per_replica * N`` concurrent clients."""
    from bench.harness import inputs

    texts = inputs.texts_of_tokens(fleet.model_dir, length, 32)
    bodies = [{"input": [texts[(k + j) % len(texts)] for j in range(texts_per_request)],
               "encoding_format": "base64"} for k in range(16)]
    replicas: list = [first] if first is not None else []  # (tulip, log); the caller stops ``first``
    out: dict = {"levels": {}}
    try:
        for n in levels:
            while len(replicas) < n:
                replicas.append(fleet.tulip(f"fanout-{len(replicas) + 1}"))
            ivy = fleet.ivy([t for t, _ in replicas[:n]], f"fan-out over {n}")
            clients = clients_per_replica * n
            requests = requests_per_replica * n
            procs = {"ivy": ivy.proc.pid, **{f"replica {i + 1}": t.proc.pid for i, (t, _) in enumerate(replicas[:n])}}
            meter = CpuMeter(procs)
            with meter:
                t0 = now_ns()
                if lg is not None:
                    r = lg.run("http", f"127.0.0.1:{ivy.port}", http_input(bodies), [clients], requests, warmup=2)
                    level = r[str(clients)]
                    sent = requests + 2 * clients
                else:
                    from bench.harness.clients import http_clients
                    from bench.harness.httpclient import HttpClient

                    enc = HttpClient("127.0.0.1", 0)
                    per = max(2, requests // clients)
                    run = http_clients(ivy.port, [[enc.prepare("/v1/embeddings", bodies[(k + j) % 16])
                                                   for j in range(per)] for k in range(clients)], timeout=600)
                    level = {"requests_per_s": run.requests / run.wall}
                    sent = run.requests + clients
                t1 = now_ns()
            fleet.stop(ivy)
            cpu = meter.result()
            cpu0, cpu1 = 0.0, cpu["processes"]["ivy"]["cpu_s"]
            wall = (t1 - t0) / NS
            per_replica = [busy(log, t0, t1) for _, log in replicas[:n]]
            device_per_request = (sum(sum(s["end"] - s["start"] for s in window(log, t0, t1))
                                      for _, log in replicas[:n]) / NS / sent)
            out["levels"][str(n)] = {
                "clients": clients,
                "emb_per_s": round(level["requests_per_s"] * texts_per_request, 1),
                "busy_per_replica": [round(b, 3) for b in per_replica],
                "ivy_cpu_s_per_1k_requests": round((cpu1 - cpu0) / sent * 1000, 3),
                "ivy_cores_used": round((cpu1 - cpu0) / wall, 3),
                "device_ms_per_request": round(device_per_request * 1e3, 3),
                "p50_ms": level.get("p50"), "p99_ms": level.get("p99"),
                "cpu_cores": attribution(cpu),
                "cpu": cpu,
            }
    finally:
        for t, _ in replicas[1 if first is not None else 0:]:
            fleet.stop(t)
    one = out["levels"][str(levels[0])]["emb_per_s"] / levels[0]
    for n, lv in out["levels"].items():
        lv["vs_n_times_one"] = round(lv["emb_per_s"] / (int(n) * one), 3)
    # Replicas one Ivy core can feed at this mix: a replica kept busy serves
    # 1 / (device time per request) requests/s; one Ivy core serves
    # 1 / (Ivy CPU per request).
    lv1 = out["levels"][str(levels[0])]
    out["replicas_per_ivy_core"] = round(lv1["device_ms_per_request"] / lv1["ivy_cpu_s_per_1k_requests"], 2) \
        if lv1["ivy_cpu_s_per_1k_requests"] else None
    out["mix"] = {"texts_per_request": texts_per_request, "tokens_per_text": length, "encoding": "base64",
                  "clients_per_replica": clients_per_replica}
    return out


def attribution(cpu: dict) -> dict:
    """Cores each part of the machine used over a block: Ivy, the replicas
    (their event-wait threads apart from the rest), the clients (the load
    generator, or the Python client processes), and what no named process
    used; with the machine's busy fraction."""
    wall = cpu["wall_s"] or 1.0
    procs = cpu["processes"]
    replicas = [p for k, p in procs.items() if k.startswith("replica")]
    # Linux keeps 15 characters of a thread's name: "tulip-completion"
    # reads as "tulip-completio" in /proc.
    wait = sum(p["threads"].get("tulip-completion"[:15], 0.0) for p in replicas)
    out = {"ivy": procs["ivy"]["cpu_s"] / wall,
           "replicas: completion threads (event waits)": wait / wall,
           "replicas: the rest (gRPC, steps, scheduler)": (sum(p["cpu_s"] for p in replicas) - wait) / wall,
           "clients": cpu["clients_cpu_s"] / wall,
           "unattributed": cpu["unattributed_cpu_s"] / wall}
    return {**{k: round(v, 3) for k, v in out.items()}, "machine_busy_fraction": cpu["machine_busy_fraction"]}


def isolation(model_dir, work, cost: str, rounds: int, seconds: float, query_rate: float, index_clients: int = 3,
              bulk_docs: int = 16000, scenarios=None) -> tuple[dict, str, list]:
    """``bench/suites/isolation.py``'s scenarios on the simulated device with one
    cost model (``roofline`` or ``published``): a Tulip per scenario behind
    its own Ivy, each with its own device log. Returns the data, the
    markdown and the correctness gates."""
    from bench.sim.replicas import Fleet
    from bench.suites import isolation as iso
    from rose.sim.cost import MODELS

    scenarios = scenarios or iso.SCENARIOS
    fleet = Fleet(model_dir, work, cost=cost)
    try:
        sides = {}
        for sc in scenarios:
            tulip, log = fleet.tulip(f"{cost}-{sc.name}", **sc.tulip_flags)
            sides[sc.name] = iso.Side(tulip, fleet.ivy([tulip], f"{cost} {sc.name}", **sc.ivy_flags), log)
        load = iso.make_load(fleet.model_dir, query_rate, 64, index_clients, bulk_docs, work)
        model = MODELS.get(cost)
        params = {"cost_model": model.to_dict() if model else cost, "cost_text": model.describe() if model else cost,
                  "launch_us": fleet.launch_us}
        data, md = iso.measure(sides, load, rounds, seconds, SIM_GOALS, params,
                               title=f"Isolation on the simulated device, {cost} cost model", scenarios=scenarios)
    finally:
        fleet.close()
    return data, md, fleet.gates


# Issue 42's targets at GPU speed (both cost models).
SIM_GOALS = {"p99_vs_fcfs": 4.0, "throughput_vs_fcfs": 0.95, "p99_over_idle_ms": 1.0}
