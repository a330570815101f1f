"""Chart 3, batch embedding: requests of 100 pre-tokenized documents from
several concurrent client processes over gRPC to Tulip, in embeddings per
second, against a bare ``transformers`` forward of the same batches
in-process, in alternating blocks of the same run."""

from __future__ import annotations

import random
import time

from bench.harness import inputs
from bench.harness.clients import grpc_clients
from bench.harness.results import table
from bench.harness.stack import Stack
from bench.harness.timing import ratio, scaled
from bench.suites.online import capped_lengths

TITLE = "Batch embedding: 100 documents per request, concurrent gRPC clients → Tulip vs transformers forward"
LENGTHS = (512, 1024, 4096)


def run(stack: Stack, clients: int = 4, requests: int = 1, batch: int = 100, rounds: int = 2,
        lengths=LENGTHS) -> tuple[dict, str]:
    tulip, bare = stack.tulip(), stack.bare()
    todo, notes = capped_lengths(lengths, stack.max_length)
    rows, results = [], {}
    for n in todo:
        docs = [inputs.ids(stack.model_dir, t) for t in inputs.texts_of_tokens(stack.model_dir, n, 2 * batch)]
        rng = random.Random(n)
        per_client = [[rng.sample(docs, batch) for _ in range(requests)] for _ in range(clients)]
        prepared = [bare.prepare(b) for c in per_client for b in c]
        total = clients * requests * batch
        rates = {"tulip": [], "transformers forward": []}
        for r in range(rounds):
            order = ["tulip", "transformers forward"] if r % 2 == 0 else ["transformers forward", "tulip"]
            for side in order:
                if side == "tulip":
                    run_ = grpc_clients(tulip.target, per_client)
                    rates[side].append(total / run_.wall)
                else:
                    start = time.perf_counter()
                    for p in prepared:
                        bare.forward(p)
                    rates[side].append(total / (time.perf_counter() - start))
        best = {k: round(max(v), 2) for k, v in rates.items()}
        r_ = ratio(best["tulip"], best["transformers forward"])
        results[str(n)] = {"embeddings_per_s": {k: [round(x, 2) for x in v] for k, v in rates.items()},
                           "best": best, "tulip_over_forward": r_}
        rows.append([n, total, best["tulip"], best["transformers forward"], r_])
    data = {"params": {"clients": clients, "requests_per_client": requests, "batch": batch, "rounds": rounds,
                       "lengths": todo, "threads": stack.threads, "client": "spawned processes, Python grpcio"},
            "by_length": results, "notes": notes}
    md = "\n".join([
        f"{clients} client processes × {requests} request(s) × {batch} documents per block; {rounds} "
        f"alternating blocks per side, best block reported; the in-process forward runs the same batches "
        f"one after another. Torch threads = {stack.threads}, fp32.\n",
        table(["tokens", "embeddings per block", "Tulip emb/s", "transformers emb/s", "Tulip / transformers"],
              rows),
        *[f"\nNote: {x}" for x in notes]])
    return data, md


def options(scale: float) -> dict:
    return {"requests": scaled(1, scale), "rounds": scaled(2, scale, 1)}
