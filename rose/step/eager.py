"""The eager runtime: the model's forward at the batch's exact shape, no
padding. It takes every step no runtime before it took."""

from __future__ import annotations

import functools

from ..interface import Batch
from ..lazy import LazyTensor, StepInfo
from .device import Call, Device


class EagerRuntime:
    labels = ("eager",)
    reference = True

    def __init__(self, device: Device, dimension: int):
        self.device = device
        self.dimension = dimension

    def run(self, batch: Batch) -> LazyTensor:
        layout = batch.layout
        arena, staging = self.device.upload(batch, layout, None, self.dimension)
        lengths = batch.lengths
        call = Call(batch.kind, arena, layout, lengths, max(lengths), batch)
        out = self.device.forward(call)
        return self.device.download(out, call, staging, _info(layout.real_tokens, layout.tokens))

    def observe(self, batch: Batch, lazy: LazyTensor) -> None:
        pass


@functools.lru_cache(maxsize=8192)
def _info(tokens: int, padded_tokens: int) -> StepInfo:
    """One shared (frozen) StepInfo per size: building one is a slow
    dataclass ``__init__`` on every step."""
    return StepInfo("eager", tokens, padded_tokens)
