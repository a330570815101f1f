"""Issue 4's CPU benchmark: overlap of host and engine work on (two steps in
flight, ``--max-inflight 2``) vs off (``--max-inflight 1``) on small batches
of the default model, as a throughput ratio measured in one run (two Tulip
servers, alternating blocks of the same load)."""

from __future__ import annotations

import statistics

from bench.harness import inputs
from bench.harness.clients import grpc_clients
from bench.harness.results import table
from bench.harness.stack import Stack
from bench.harness.timing import ratio, scaled

TITLE = "Overlap on (2 steps in flight) vs off (1), small batches, gRPC → Tulip"


def run(stack: Stack, clients: int = 8, requests: int = 40, rounds: int = 3, seqs: int = 2,
        tokens: int = 32, max_batch_sequences: int = 4) -> tuple[dict, str]:
    texts = inputs.texts_of_tokens(stack.model_dir, tokens, 16)
    seq_ids = [inputs.ids(stack.model_dir, t) for t in texts]
    per_client = [[[seq_ids[(k + j + i) % len(seq_ids)] for i in range(seqs)] for j in range(requests)]
                  for k in range(clients)]
    servers = {}
    try:
        for name, depth in (("on", 2), ("off", 1)):
            servers[name] = stack.gated_tulip(f"Tulip, --max-inflight {depth}", max_inflight=depth,
                                              max_batch_sequences=max_batch_sequences)
        for t in servers.values():  # warm both
            grpc_clients(t.target, [c[:3] for c in per_client])
        total = clients * requests * seqs
        rates: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(rounds):
            for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
                rates[name].append(total / grpc_clients(servers[name].target, per_client).wall)
    finally:
        for t in servers.values():
            t.stop()
    med = {k: round(statistics.median(v), 2) for k, v in rates.items()}
    r_ = ratio(med["on"], med["off"])
    data = {"params": {"clients": clients, "requests_per_client": requests, "sequences_per_request": seqs,
                       "tokens_per_sequence": tokens, "max_batch_sequences": max_batch_sequences,
                       "rounds": rounds, "threads": stack.threads},
            "sequences_per_s": {k: [round(x, 2) for x in v] for k, v in rates.items()},
            "median": med, "on_over_off": r_}
    md = "\n".join([
        f"{clients} client processes × {requests} requests of {seqs} sequences × {tokens} tokens; Tulip with "
        f"`--max-batch-sequences {max_batch_sequences}` so every step is a small batch; {rounds} alternating "
        f"blocks per setting, median reported. Torch threads = {stack.threads}.\n",
        table(["overlap", "sequences/s (median)", "all blocks"],
              [[k, med[k], ", ".join(f"{x:.1f}" for x in rates[k])] for k in ("on", "off")]),
        f"\nThroughput on / off = **{r_}**. On the CPU a step's output is ready when `step()` returns, so "
        "overlap can only hide the host work between steps (batch assembly, completion), not compute.",
    ])
    return data, md


def options(scale: float) -> dict:
    return {"requests": scaled(40, scale, 8), "rounds": scaled(3, scale, 2)}
