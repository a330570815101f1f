"""The overhead of routing by model (issue 29): one Ivy in front of one
model against one Ivy in front of three, the same request mix (one input of
128 tokens, batch 1), interleaved request by request. Every model is the
null model (no compute) on its own Tulip, so what differs is Ivy's work:
finding the request's pool, its tokenizer and templates, and picking among
that pool's replicas. The three-model side names the models in turn; the
one-model side names its one model on every request."""

from __future__ import annotations

import shutil
from pathlib import Path

from bench.harness import inputs
from bench.harness.httpclient import HttpClient
from bench.harness.results import table
from bench.harness.timing import Stats, interleave, ratio, scaled
from bench.suites.overhead import NULL_CONFIG, TOKENS, null_model_dir
from tulip_rose_cli.launch import Ivy, Tulip

TITLE = "Routing by model: one Ivy in front of one model vs three (null model)"
MODELS = ("null-a", "null-b", "null-c")
# The 3-model Ivy with every request naming the model the 1-model Ivy
# serves: the same Tulip behind both, so only Ivy's work differs.
ONLY_A = "3 models, all to null-a"


def run(stack, rounds: int = 3000, warmup: int = 300) -> tuple[dict, str]:
    tok_dir = stack.model_dir  # the real tokenizer; the models compute nothing
    text = inputs.text_of_tokens(tok_dir, TOKENS)
    null_dir = null_model_dir()
    # Its tokenizer.json travels in each replica's Info, so every pool
    # tokenizes alike (--tokenizer would name the default model's only).
    shutil.copy(Path(tok_dir) / "tokenizer.json", Path(null_dir) / "tokenizer.json")
    procs: list = []
    try:
        tulips = {m: Tulip(null_dir, log_dir=stack.log_dir, threads=1, model_id=m) for m in MODELS}
        procs += tulips.values()
        # The same Tulip answers model a on both sides.
        one = Ivy([tulips[MODELS[0]].url], tokenizer=False, log_dir=stack.log_dir)
        three = Ivy([t.url for t in tulips.values()], tokenizer=False, log_dir=stack.log_dir,
                    default_model=MODELS[0])
        procs += [one, three]
        for m in MODELS[1:]:  # three's other pools come up after its first
            _wait_pool(three, m)
        clients = {"1 model": HttpClient("127.0.0.1", one.port), "3 models": HttpClient("127.0.0.1", three.port),
                   ONLY_A: HttpClient("127.0.0.1", three.port)}
        reqs = {
            "1 model": [clients["1 model"].prepare("/v1/embeddings", {"input": text, "model": MODELS[0]})],
            "3 models": [clients["3 models"].prepare("/v1/embeddings", {"input": text, "model": m}) for m in MODELS],
            ONLY_A: [clients[ONLY_A].prepare("/v1/embeddings", {"input": text, "model": MODELS[0]})],
        }
        sides = {k: (lambda i, c=clients[k], r=reqs[k]: c.send_ok(r[i % len(r)])) for k in clients}
        lat = interleave(sides, rounds, warmup, seed=5)
        for c in clients.values():
            c.close()
    finally:
        for p in reversed(procs):
            p.stop()
    stats = {k: Stats.of(v) for k, v in lat.items()}
    data = {
        "params": {"rounds": rounds, "warmup": warmup, "tokens": TOKENS, "batch": 1, "null_model": NULL_CONFIG,
                   "models": list(MODELS), "order": "shuffled every round"},
        "stats": {k: s.to_dict() for k, s in stats.items()},
        "three_over_one_p50": ratio(stats["3 models"].p50, stats["1 model"].p50),
        "three_over_one_p99": ratio(stats["3 models"].p99, stats["1 model"].p99),
        "same_tulip_three_over_one_p50": ratio(stats[ONLY_A].p50, stats["1 model"].p50),
        "same_tulip_three_over_one_p99": ratio(stats[ONLY_A].p99, stats["1 model"].p99),
    }
    md = "\n".join([
        f"One input of {TOKENS} tokens to `/v1/embeddings` naming its model, batch 1, {rounds} interleaved "
        f"rounds after {warmup} warm-up rounds. Each model is the null model on its own Tulip (one thread); "
        "the 3-model Ivy names the three in turn (and, as a third side, only the one the 1-model Ivy serves), the "
        "1-model Ivy its one.\n",
        table(["side", "count", "p50 ms", "p90 ms", "p99 ms", "mean ms"],
              [[k, s.count, s.p50, s.p90, s.p99, s.mean] for k, s in stats.items()]),
        f"\n3 models / 1 model: p50 **{data['three_over_one_p50']}×**, p99 **{data['three_over_one_p99']}×** "
        "(each of the three Tulips gets a third of the requests). With every request to the model both Ivys "
        f"serve (the same Tulip): p50 **{data['same_tulip_three_over_one_p50']}×**, p99 "
        f"**{data['same_tulip_three_over_one_p99']}×**: Ivy's own cost of finding the pool.\n",
    ])
    return data, md


def _wait_pool(ivy: Ivy, model: str) -> None:
    from tulip_rose_cli.processes import wait_for

    wait_for(lambda: ivy.series("ivy_replica_up", model=model) == 1, f"model {model}'s pool", timeout=60)


def options(scale: float) -> dict:
    return {"rounds": scaled(3000, scale, 100), "warmup": scaled(300, scale, 20)}
