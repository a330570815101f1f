"""Chart 1, online embedding: batch 1, sequential, pre-tokenized, over gRPC
to Tulip, at lengths 128/512/4096 (capped to the model's maximum on models
that take less), against a bare ``transformers`` forward on the same ids
in the same run, interleaved."""

from __future__ import annotations

import statistics

from bench.harness import inputs
from bench.harness.results import table
from bench.harness.stack import Stack
from bench.harness.timing import Stats, interleave, ratio, scaled

TITLE = "Online embedding, batch 1, pre-tokenized, gRPC → Tulip vs transformers forward"
LENGTHS = (128, 512, 4096)


def capped_lengths(lengths, max_length: int) -> tuple[list[int], list[str]]:
    """Lengths the model can take, and a note for each one capped."""
    out, notes = [], []
    for n in lengths:
        if n > max_length:
            notes.append(f"length {n} capped to the model's maximum of {max_length} tokens")
            n = max_length
        if n not in out:
            out.append(n)
    return out, notes


def run(stack: Stack, rounds: int = 100, warmup: int = 10, lengths=LENGTHS) -> tuple[dict, str]:
    tulip, bare = stack.tulip(), stack.bare()
    todo, notes = capped_lengths(lengths, stack.max_length)
    rows, results = [], {}
    with tulip.client() as c:
        for n in todo:
            seqs = [inputs.ids(stack.model_dir, t) for t in inputs.texts_of_tokens(stack.model_dir, n, 4)]
            reqs = [c.request([s]) for s in seqs]
            prepared = [bare.prepare([s]) for s in seqs]
            server_us: list[int] = []

            def grpc(i, reqs=reqs, server_us=server_us):
                server_us.append(c.stub.Embed(reqs[i % len(reqs)]).timing.total_us)

            sides = {"tulip": grpc, "transformers forward": lambda i, p=prepared: bare.forward(p[i % len(p)])}
            interleave(sides, warmup, 0)
            server_us.clear()
            lat = interleave(sides, rounds, 0, seed=n)
            stats = {k: Stats.of(v) for k, v in lat.items()}
            server_p50 = statistics.median(server_us) / 1e3
            r = ratio(stats["tulip"].p50, stats["transformers forward"].p50)
            results[str(n)] = {"stats": {k: s.to_dict() for k, s in stats.items()},
                               "tulip_server_p50_ms": round(server_p50, 4), "tulip_over_forward_p50": r}
            rows.append([n, stats["tulip"].count, stats["tulip"].p50, stats["tulip"].p99, server_p50,
                         stats["transformers forward"].p50, stats["transformers forward"].p99, r])
    data = {"params": {"rounds": rounds, "warmup": warmup, "lengths": todo, "threads": stack.threads,
                       "model_dir": stack.model_dir, "dtype": "float32", "client": "Python grpcio, one channel"},
            "by_length": results, "notes": notes}
    md = "\n".join([
        f"Batch 1, real text cut to exact token counts, {rounds} interleaved rounds per length after "
        f"{warmup} warm-up rounds, torch threads = {stack.threads}, fp32.\n",
        table(["tokens", "count", "Tulip p50 ms", "Tulip p99 ms", "Tulip server-side p50 ms",
               "transformers p50 ms", "transformers p99 ms", "Tulip / transformers p50"], rows),
        *[f"\nNote: {x}" for x in notes]])
    return data, md


def options(scale: float) -> dict:
    return {"rounds": scaled(100, scale, 10), "warmup": scaled(10, scale, 2)}
