"""The adapter runtime: a step in which any sequence chose a LoRA adapter
(``Batch.adapters``) runs eagerly at its exact shape, its projections
adding each adapter's deltas on that adapter's rows (``rose/adapters``).

It comes first in the runner's order and takes every such step, so the
runtimes after it (the CPU's ONNX Runtime and bfloat16 twin, whose models
are copies without adapters; a configuration's static buffers and CUDA
graph, captured without them) only ever see base steps, and no adapter
step becomes a gated runtime's reference. A base step costs it one
attribute read. Steps it takes report the mode ``lora``.

Where an adapter's sequences are not side by side, the step runs its
sequences in adapter order (one permuted arena, ``AdapterStep.order``),
so each adapter's rows are one range of every projection's input, and
its output rows are put back in the batch's order at the end: one gather
per step instead of one gather and one scatter per projection and
adapter (measured on MiniLM, 20 documents round-robin over 4 adapters:
those were ~40% of the adapters' cost).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..adapters import Bank
from ..interface import Batch, OutputKind
from ..lazy import LazyTensor, StepInfo
from .device import Call, Device
from .inputs import rows_per_sequence


class LoraRuntime:
    labels = ("lora",)
    reference = False  # its output is not the base model's

    def __init__(self, device: Device, dimension: int, bank: Bank):
        self.device = device
        self.dimension = dimension
        self.bank = bank

    def run(self, batch: Batch) -> LazyTensor | None:
        if batch.adapters is None:
            return None
        step = self.bank.step(batch)
        if step is None:  # every sequence on the base model
            return None
        ran = batch if step.order is None else reordered(batch, step.order)
        layout = batch.layout
        arena, staging = self.device.upload(ran, layout, None, self.dimension)
        lengths = ran.lengths
        # The batch as the host sent it: what a modelled device makes its rows from.
        call = Call(batch.kind, arena, layout, lengths, max(lengths), batch, step)
        with self.bank.applied(step):
            out = self.device.forward(call)
        if step.order is not None and isinstance(out, torch.Tensor):
            back = rows_back(batch.kind, np.asarray(batch.lengths), step.order)
            out = out.index_select(0, torch.from_numpy(back).to(out.device))
        return self.device.download(out, call, staging, _info(layout.real_tokens))

    def observe(self, batch: Batch, lazy: LazyTensor) -> None:
        pass


def reordered(batch: Batch, order: np.ndarray) -> Batch:
    """``batch`` (options resolved) with its sequences in ``order``."""
    layout = batch.layout
    cu = batch.numpy_field("cu")
    lengths = np.diff(cu)[order]
    tokens = np.concatenate([np.arange(cu[s], cu[s + 1]) for s in order])
    out = np.empty(layout.size, dtype=np.int32)
    fields = {"ids": tokens, "positions": tokens, "inv_len": order, "dims": order, "norm": order}
    for name, (o, n) in layout.offsets.items():
        if name in fields:
            out[o:o + n] = batch.numpy_field(name)[fields[name]]
    o, n = layout.offsets["seg_ids"]
    out[o:o + n] = np.repeat(np.arange(len(order), dtype=np.int32), lengths)
    o, n = layout.offsets["cu"]
    out[o:o + n] = np.concatenate(([0], np.cumsum(lengths)))
    return Batch(torch.from_numpy(out), layout, batch.kind, resolved=True)


def rows_back(kind: OutputKind, lengths: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Which output row of the step run in ``order`` each output row of the
    batch (sequences of ``lengths``, in its own order) is."""
    rows = rows_per_sequence(kind, lengths)
    start = np.concatenate(([0], np.cumsum(rows[order])))  # of each sequence's rows, as run
    at = np.empty_like(order)
    at[order] = np.arange(len(order))  # where each sequence ran
    if (rows == 1).all():
        return at.astype(np.int64)
    return np.concatenate([np.arange(start[at[s]], start[at[s]] + rows[s]) for s in range(len(order))])


@functools.lru_cache(maxsize=8192)
def _info(tokens: int) -> StepInfo:
    return StepInfo("lora", tokens, tokens)
