"""Engine-level timings on one device: eager vs CUDA graphs per length
(batch 1), the kernel-launch inflection point, and the ``transformers``
eager forward of the same ids as the in-run baseline."""

from __future__ import annotations

import torch

from bench.gpu.models import Shape, forward, pool, token_ids
from bench.harness.timing import Stats, interleave


def arena_step(e, sequences: list[list[int]]):
    """A function that runs one step of ``sequences`` the way Tulip does
    (an arena with options resolved, built once) and waits for the rows."""
    from rose import Batch

    n, t = len(sequences), sum(len(s) for s in sequences)
    raw = Batch.from_lists(sequences, dimensions=[e.info.dimension] * n,
                           normalize=[e.info.normalize_default] * n).arena.numpy().tobytes()

    def step():
        lazy = e.step_arena(bytearray(raw), n, t, "dense")[0]
        lazy.synchronize()
        lazy.release()
    return step


def hf_step(model, shape: Shape, sequences: list[list[int]], device: str):
    """The ``transformers`` forward of equal-length sequences plus pooling,
    rows copied to the host (as ROSE's are)."""
    ids = torch.tensor(sequences, device=device)

    @torch.inference_mode()
    def step():
        pool(forward(model, shape, ids), shape).cpu()
    return step


def eager_vs_graphs(eager, graphs, hf, shape: Shape, lengths: list[int], rounds: int, device: str) -> dict:
    """p50/p99 per length for ROSE eager, ROSE with graphs, and transformers."""
    out = {}
    for n in lengths:
        seqs = [[*token_ids(shape, n, seed=n)]]
        sides = {"rose eager": arena_step(eager, seqs), "rose graphs": arena_step(graphs, seqs)}
        if hf is not None:
            sides["transformers eager"] = hf_step(hf, shape, seqs, device)
        lat = interleave({k: (lambda i, f=f: f()) for k, f in sides.items()}, rounds, warmup=3, seed=n)
        out[str(n)] = {k: Stats.of(v).to_dict() for k, v in lat.items()}
    return out


def inflection(by_length: dict, threshold: float = 0.95) -> int | None:
    """The smallest token count from which graphs save less than 5% of the
    eager p50 (kernel launches no longer dominate); None if they always help."""
    for n in sorted(by_length, key=int):
        cell = by_length[n]
        if cell["rose graphs"]["p50"] >= threshold * cell["rose eager"]["p50"]:
            return int(n)
    return None
