"""The four published charts at reduced request counts, through a real
Tulip server (and Ivy for the concurrency chart when its binary is there),
with the ``transformers`` eager forward on the same device as the in-run
baseline; and overlap on vs off through two Tulip servers."""

from __future__ import annotations

import random
import statistics
import time

from bench.gpu.loadgen import Loadgen, grpc_input, http_input
from bench.gpu.models import Shape, token_ids
from bench.gpu.timing import hf_step
from bench.harness.clients import grpc_clients, http_clients
from bench.harness.httpclient import HttpClient
from bench.harness.timing import Stats, interleave, ratio


def online(tulip, hf, shape: Shape, lengths: list[int], rounds: int, device: str, lg: Loadgen | None = None) -> dict:
    """Batch 1 per length. With the compiled load generator, Tulip's side is
    timed by it (and its floor against a null server is reported next to
    it); without, by the Python gRPC client interleaved with transformers."""
    out = {}
    with tulip.client() as c:
        for n in lengths:
            seqs = [token_ids(shape, n, seed=n + k) for k in range(4)]
            hf_steps = [hf_step(hf, shape, [s], device) for s in seqs]
            if lg is not None:
                sides = lg.run("grpc", tulip.target, grpc_input([[s] for s in seqs]), [1], rounds, floor=True)
                lat = interleave({"transformers eager": lambda i, h=hf_steps: h[i % 4]()}, rounds, warmup=3, seed=n)
                out[str(n)] = {"tulip": sides["1"], "loadgen floor": sides["floor"],
                               **{k: Stats.of(v).to_dict() for k, v in lat.items()}}
                continue
            reqs = [c.request([s]) for s in seqs]
            lat = interleave({"tulip": lambda i, r=reqs: c.stub.Embed(r[i % 4]),
                              "transformers eager": lambda i, h=hf_steps: h[i % 4]()}, rounds, warmup=3, seed=n)
            out[str(n)] = {k: Stats.of(v).to_dict() for k, v in lat.items()}
    return out


def scoring(tulip, hf, shape: Shape, length: int, batches: list[int], rounds: int, device: str) -> dict:
    out = {}
    with tulip.client() as c:
        for b in batches:
            seqs = [token_ids(shape, length, seed=1000 + k) for k in range(b)]
            req, h = c.request(seqs), hf_step(hf, shape, seqs, device)
            lat = interleave({"tulip": lambda i, req=req: c.stub.Embed(req), "transformers eager": lambda i, h=h: h()},
                             rounds, warmup=3, seed=b)
            out[str(b)] = {k: Stats.of(v).to_dict() for k, v in lat.items()}
    return out


def throughput(tulip, hf, shape: Shape, lengths: list[int], clients: int, batch: int, requests: int,
               device: str) -> dict:
    out = {}
    for n in lengths:
        docs = [token_ids(shape, n, seed=2000 + k) for k in range(batch * 2)]
        rng = random.Random(n)
        per_client = [[rng.sample(docs, batch) for _ in range(requests)] for _ in range(clients)]
        total = clients * requests * batch
        wall = grpc_clients(tulip.target, per_client).wall
        steps = [hf_step(hf, shape, b, device) for c in per_client for b in c]
        steps[0]()  # warm
        start = time.perf_counter()
        for s in steps:
            s()
        hf_wall = time.perf_counter() - start
        out[str(n)] = {"tulip_embeddings_per_s": round(total / wall, 2),
                       "transformers_embeddings_per_s": round(total / hf_wall, 2),
                       "ratio": ratio(hf_wall, wall), "embeddings": total}
    return out


def concurrency(target_port: int | None, tulip, shape: Shape, texts: list[str] | None, length: int,
                levels: list[int], per_level: int, lg: Loadgen | None = None) -> dict:
    """Through Ivy (``target_port``) with real text when given, else
    pre-tokenized over gRPC to Tulip; by the compiled load generator when
    there is one (its floor under "floor"), else by Python client processes."""
    if lg is not None:
        if target_port is not None:
            return lg.run("http", f"127.0.0.1:{target_port}", http_input([{"input": t} for t in texts]), levels,
                          per_level, floor=True)
        seqs = [token_ids(shape, length, seed=3000 + k) for k in range(16)]
        return lg.run("grpc", tulip.target, grpc_input([[s] for s in seqs]), levels, per_level, floor=True)
    out = {}
    for c in levels:
        per = max(2, -(-per_level // c))
        if target_port is not None:
            enc = HttpClient("127.0.0.1", 0)
            reqs = [[enc.prepare("/v1/embeddings", {"input": texts[(k + j) % len(texts)]}) for j in range(per)]
                    for k in range(c)]
            run = http_clients(target_port, reqs)
        else:
            seqs = [token_ids(shape, length, seed=3000 + k) for k in range(16)]
            run = grpc_clients(tulip.target, [[[seqs[(k + j) % 16]] for j in range(per)] for k in range(c)])
        out[str(c)] = {**Stats.of(run.latencies).to_dict(), "requests_per_s": round(run.requests / run.wall, 2)}
    return out


def overlap(servers: dict, shape: Shape, length: int, clients: int, requests: int, rounds: int) -> dict:
    """Throughput and latency of batch-1 requests from concurrent clients,
    ``servers`` = {"on": Tulip(max_inflight=2), "off": Tulip(max_inflight=1)}."""
    seqs = [token_ids(shape, length, seed=4000 + k) for k in range(16)]
    per_client = [[[seqs[(k + j) % 16]] for j in range(requests)] for k in range(clients)]
    for t in servers.values():
        grpc_clients(t.target, [c[:4] for c in per_client])
    rates: dict[str, list[float]] = {k: [] for k in servers}
    lat: dict[str, list[float]] = {k: [] for k in servers}
    for r in range(rounds):
        for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
            run = grpc_clients(servers[name].target, per_client)
            rates[name].append(run.requests / run.wall)
            lat[name] += run.latencies
    med = {k: round(statistics.median(v), 2) for k, v in rates.items()}
    return {"requests_per_s": med, "latency": {k: Stats.of(v).to_dict() for k, v in lat.items()},
            "on_over_off": ratio(med["on"], med["off"])}
