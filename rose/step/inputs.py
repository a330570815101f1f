"""From a batch's arena (see ``interface.Batch``) to the model's inputs.

A CUDA graph's static inputs are views into one static arena, so moving a
step's inputs to the device is one copy. When a batch is padded up to a
bucket, the filler tokens form one extra segment at the end: they attend
only to each other, and every output row they produce comes after all real
rows, where it is discarded.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..attention import AttentionBackend
from ..interface import Batch, Layout, OutputKind
from ..models import StepInputs


def resolve_defaults(batch: Batch, dimension: int, normalize_default: bool) -> None:
    """Replaces "full dimension" (0) and "model default" (-1) in the batch's
    per-sequence options, in place."""
    if batch.resolved:
        return
    batch.resolved = True
    dims = batch.numpy_field("dims")
    if (dims <= 0).any():
        dims[dims <= 0] = dimension
    norm = batch.numpy_field("norm")
    if (norm < 0).any():
        norm[norm < 0] = int(normalize_default)


def repack(batch: Batch, layout: Layout, out: torch.Tensor | np.ndarray, dimension: int) -> None:
    """Writes ``batch`` padded to ``layout`` (one filler segment at the end)
    into the host int32 arena ``out``. NumPy, not torch: this runs on the
    request path, and NumPy's per-call cost on tiny arrays is far lower;
    the filler and every offset come from a plan made once per shape."""
    template, copies = _plan(batch.layout, layout, dimension)
    a = batch.numpy()
    b = out if isinstance(out, np.ndarray) else out.numpy()
    b[: template.size] = template
    for (do, de), (so, se) in copies:
        b[do:de] = a[so:se]


@functools.lru_cache(maxsize=4096)
def _plan(src: Layout, dst: Layout, dimension: int) -> tuple[np.ndarray, tuple]:
    """What ``repack`` writes for a batch of layout ``src`` padded to
    ``dst``: the arena with every filler value in place (``template``), and
    the (destination, source) word ranges that take the batch's own."""
    so, do = src.offsets, dst.offsets
    n, t_real, t = dst.sequences, dst.real_tokens, dst.tokens
    filler = t - t_real
    b = np.zeros(dst.size, dtype=np.int32)
    b[do["positions"][0] + t_real:do["positions"][0] + t] = np.arange(filler, dtype=np.int32)
    b[do["seg_ids"][0] + t_real:do["seg_ids"][0] + t] = n
    b[do["cu"][0] + n + 1] = t
    b[do["inv_len"][0] + n:do["inv_len"][0] + n + 1].view(np.float32)[0] = 1.0 / filler
    b[do["dims"][0] + n] = dimension
    copies = tuple(((do[name][0], do[name][0] + t_real), (so[name][0], so[name][0] + t_real))
                   for name in ("ids", "positions", "seg_ids"))
    copies += tuple(((do[name][0], do[name][0] + so[name][1]), (so[name][0], so[name][0] + so[name][1]))
                    for name in ("cu", "inv_len", "dims", "norm"))
    b.setflags(write=False)
    return b, copies


def step_inputs(arena: torch.Tensor, layout: Layout, backend: AttentionBackend, causal: bool,
                lengths: list[int], max_seqlen: int) -> StepInputs:
    """The model's inputs as views of a (device) arena. ``lengths`` are the
    host-side segment lengths, for backends that loop over sequences;
    capture-safe backends read only device tensors and ``max_seqlen``."""
    v = layout.views(arena)
    plan = backend.plan(v["cu"], lengths, max_seqlen, causal)
    return StepInputs(
        token_ids=v["ids"],
        positions=v["positions"],
        seg_ids=v["seg_ids"],
        cu_seqlens=v["cu"],
        inv_lengths=v["inv_len"],
        dimensions=v["dims"],
        normalize=v["norm"] != 0,
        plan=plan,
    )


def rows_per_sequence(kind: OutputKind, lengths: np.ndarray) -> np.ndarray:
    """How many output rows each sequence of these lengths gets (the row
    layout of each kind is described in ``interface.OutputKind``)."""
    if kind in (OutputKind.SPARSE, OutputKind.TOKEN_STATES):
        return lengths
    if kind is OutputKind.MULTI_VECTOR:
        return lengths - 1
    return np.ones_like(lengths)


def rows_for(kind: OutputKind, layout: Layout) -> int:
    """How many leading output rows belong to real sequences (the row
    layout of each kind is described in ``interface.OutputKind``)."""
    if kind in (OutputKind.DENSE, OutputKind.SCORE, OutputKind.CLASSIFY, OutputKind.SPARSE_VOCAB):
        return layout.sequences
    if kind in (OutputKind.SPARSE, OutputKind.TOKEN_STATES):
        return layout.real_tokens
    return layout.real_tokens - layout.sequences
