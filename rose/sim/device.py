"""The simulated device as ROSE's ``Device`` (``rose/step/device.py``): the
runner, the dispatcher's configurations (warm-up, capture, replay; padded
buckets), the staging buffers from the pool, the output buffers and the
LazyTensor are the ones a GPU step uses. Only what happens on the device
is modelled: a forward or a graph replay queues a step on the modelled
stream (``stream.py``), whose event completes at the step's modelled end,
and the output rows are synthesised (``outputs.py``) into a buffer from
the pool, as the device-to-host copy would fill it.

What cannot be the same without a GPU is listed in one place,
``docs/simulated-device.md``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..errors import is_sticky_cuda_error
from ..lazy import LazyTensor, StepInfo
from ..step.device import Call
from ..step.inputs import repack
from ..step.staging import PinnedPool
from .events import SimEvent
from .outputs import OutputSynth
from .stream import SimStream


@dataclass(frozen=True)
class _Launched:
    """A step on the modelled stream: its output is its event."""

    event: SimEvent


class _Graph:
    """A captured configuration: nothing to record, a replay launches."""


class SimDevice:
    name = "sim"
    torch_device = torch.device("cpu")
    graphs = True

    def __init__(self, stream: SimStream, synth: OutputSynth):
        self.stream = stream
        self.synth = synth
        self.pool = PinnedPool(pin=False)  # page-locked memory needs CUDA; the same pool logic

    def enter_thread(self) -> None:
        pass

    def guard(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    def prepare(self, batch) -> None:
        pass

    def static_arena(self, size: int) -> torch.Tensor:
        return torch.zeros(size, dtype=torch.int32)

    def upload(self, batch, layout, dest, dimension):
        # The staging buffer is packed as on CUDA; the copy to the device is
        # the modelled step's business (its arena is never read).
        staging = self.pool.acquire(layout.size * 4)
        host = staging.view(torch.int32)[: layout.size]
        if layout == batch.layout:
            host.copy_(batch.arena[: layout.size])
        else:
            repack(batch, layout, host, dimension)
        return host, (staging,)

    def forward(self, call: Call) -> _Launched:
        return _Launched(self.stream.launch(call.lengths, call.layout.sequences))

    def capture(self, call: Call):
        return _Graph(), None

    def replay(self, graph, out, call: Call) -> _Launched:
        return self.forward(call)

    def download(self, out: _Launched, call: Call, staging, info: StepInfo) -> LazyTensor:
        rows, cols = self.synth.shape(call.batch)
        buf = self.pool.acquire(max(rows * cols, 1) * 4)
        host = buf.view(torch.float32)
        self.synth.fill(call.batch, host.numpy())
        return LazyTensor(host, rows, cols, event=out.event, pool=self.pool, buffers=(buf, *staging), info=info)

    def is_sticky(self, e: BaseException) -> bool:
        return is_sticky_cuda_error(e)
