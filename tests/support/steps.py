"""One engine step as the tests run it, and a gated runtime's bucket
taken from cold to built (the CPU fast path, the bfloat16 twin)."""

from __future__ import annotations

from rose import Batch, Engine


def step(engine: Engine, seqs: list[list[int]], kind: str = "dense", **options):
    """(how the step ran, a copy of its output)."""
    lazy = engine.step(Batch.from_lists(seqs, kind, **options))
    try:
        return lazy.info.mode, lazy.tensor().clone()
    finally:
        lazy.release()


def run_twice(engine: Engine, runtime, seqs: list[list[int]], kind: str = "dense"):
    """First hit (queues the bucket's build), the build and gate, second hit."""
    first = step(engine, seqs, kind)
    assert runtime.wait(600)
    return first, step(engine, seqs, kind)
