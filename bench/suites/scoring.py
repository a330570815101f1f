"""Chart 2, scoring: one request of 5/25/50 pre-tokenized documents of 512
tokens (capped to the model's maximum), over gRPC to Tulip, against a bare
``transformers`` forward of the same batch in the same run, interleaved."""

from __future__ import annotations

from bench.harness import inputs
from bench.harness.results import table
from bench.harness.stack import Stack
from bench.harness.timing import Stats, interleave, ratio, scaled
from bench.suites.online import capped_lengths

TITLE = "Scoring: request batches of 5/25/50 documents, gRPC → Tulip vs transformers forward"
BATCHES = (5, 25, 50)
LENGTH = 512


def run(stack: Stack, rounds: int = 4, warmup: int = 1, batches=BATCHES) -> tuple[dict, str]:
    tulip, bare = stack.tulip(), stack.bare()
    (length,), notes = capped_lengths([LENGTH], stack.max_length)
    docs = [inputs.ids(stack.model_dir, t) for t in inputs.texts_of_tokens(stack.model_dir, length, max(batches))]
    rows, results = [], {}
    with tulip.client() as c:
        for b in batches:
            # Two different batches alternate so no side sees one input only.
            sets = [docs[:b], (docs[b:] + docs)[:b]]
            reqs = [c.request(s) for s in sets]
            prepared = [bare.prepare(s) for s in sets]
            sides = {"tulip": lambda i, r=reqs: c.stub.Embed(r[i % 2]),
                     "transformers forward": lambda i, p=prepared: bare.forward(p[i % 2])}
            interleave(sides, warmup, 0)
            stats = {k: Stats.of(v) for k, v in interleave(sides, rounds, 0, seed=b).items()}
            r = ratio(stats["tulip"].p50, stats["transformers forward"].p50)
            results[str(b)] = {"stats": {k: s.to_dict() for k, s in stats.items()}, "tulip_over_forward_p50": r}
            rows.append([b, stats["tulip"].count, stats["tulip"].p50, stats["tulip"].p99,
                         stats["transformers forward"].p50, r])
    data = {"params": {"rounds": rounds, "warmup": warmup, "length": length, "batches": list(batches),
                       "threads": stack.threads, "dtype": "float32"}, "by_batch": results, "notes": notes}
    md = "\n".join([
        f"Documents of {length} tokens (real text), {rounds} interleaved rounds per batch size after "
        f"{warmup} warm-up, torch threads = {stack.threads}, fp32.\n",
        table(["batch", "count", "Tulip p50 ms", "Tulip p99 ms", "transformers p50 ms",
               "Tulip / transformers p50"], rows),
        *[f"\nNote: {x}" for x in notes]])
    return data, md


def options(scale: float) -> dict:
    return {"rounds": scaled(4, scale, 2), "warmup": 1}
