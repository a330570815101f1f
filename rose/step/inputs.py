"""From a batch's arena (see ``interface.Batch``) to the model's inputs.

A CUDA graph's static inputs are views into one static arena, so moving a
step's inputs to the device is one copy. When a batch is padded up to a
bucket, the filler tokens form one extra segment at the end: they attend
only to each other, and every output row they produce comes after all real
rows, where it is discarded.
"""

from __future__ import annotations

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


def repack(batch: Batch, layout: Layout, out: torch.Tensor, dimension: int) -> None:
    """Writes ``batch`` padded to ``layout`` (one filler segment at the end)
    into the host int32 arena ``out``. NumPy, not torch: this runs on the
    request path, and NumPy's per-call cost on tiny arrays is far lower."""
    src = batch.layout.offsets
    dst = layout.offsets
    a = batch.arena.numpy()
    b = out.numpy()
    n, t_real, t = layout.sequences, layout.real_tokens, layout.tokens
    filler = t - t_real
    for name in ("ids", "positions", "seg_ids"):
        (so, _), (do, _) = src[name], dst[name]
        b[do:do + t_real] = a[so:so + t_real]
    do = dst["ids"][0]
    b[do + t_real:do + t] = 0
    do = dst["positions"][0]
    b[do + t_real:do + t] = np.arange(filler, dtype=np.int32)
    do = dst["seg_ids"][0]
    b[do + t_real:do + t] = n
    for name in ("cu", "inv_len", "dims", "norm"):
        (so, sn), (do, _) = src[name], dst[name]
        b[do:do + sn] = a[so:so + sn]
    b[dst["cu"][0] + n + 1] = t
    b[dst["inv_len"][0] + n:dst["inv_len"][0] + n + 1].view(np.float32)[0] = 1.0 / filler
    b[dst["dims"][0] + n] = dimension
    b[dst["norm"][0] + n] = 0


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


def rows_for(kind: OutputKind, layout: Layout) -> int:
    """How many leading output rows belong to real sequences (the row
    layout of each kind is described in ``interface.OutputKind``)."""
    if kind in (OutputKind.DENSE, OutputKind.SCORE, OutputKind.CLASSIFY, OutputKind.SPARSE_VOCAB):
        return layout.sequences
    if kind in (OutputKind.SPARSE, OutputKind.TOKEN_STATES):
        return layout.real_tokens
    return layout.real_tokens - layout.sequences
