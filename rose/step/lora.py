"""The adapter runtime: a step in which any sequence chose a LoRA adapter
(``Batch.adapters``) runs eagerly at its exact shape, its projections
adding each adapter's deltas on that adapter's rows (``rose/adapters``).

It comes first in the runner's order and takes every such step, so the
runtimes after it (the CPU's ONNX Runtime and bfloat16 twin, whose models
are copies without adapters; a configuration's static buffers and CUDA
graph, captured without them) only ever see base steps, and no adapter
step becomes a gated runtime's reference. A base step costs it one
attribute read. Steps it takes report the mode ``lora``.
"""

from __future__ import annotations

import functools

from ..adapters import Bank
from ..interface import Batch
from ..lazy import LazyTensor, StepInfo
from .device import Call, Device


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
        layout = batch.layout
        arena, staging = self.device.upload(batch, layout, None, self.dimension)
        lengths = batch.lengths
        call = Call(batch.kind, arena, layout, lengths, max(lengths), batch, step)
        with self.bank.applied(step):
            out = self.device.forward(call)
        return self.device.download(out, call, staging, _info(layout.real_tokens))

    def observe(self, batch: Batch, lazy: LazyTensor) -> None:
        pass


@functools.lru_cache(maxsize=8192)
def _info(tokens: int) -> StepInfo:
    return StepInfo("lora", tokens, tokens)
