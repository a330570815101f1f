"""The simulated device as ROSE's ``Device`` (``rose/step/device.py``): the
runner, the dispatcher's configurations (warm-up, capture, replay; padded
buckets), the staging buffers from the pool, the output buffers and the
LazyTensor are the ones a GPU step uses. Only what happens on the device
is modelled: a forward or a graph replay queues a step on the modelled
stream (``stream.py``), whose event completes at the step's modelled end
(its copies included), and the output rows are synthesised
(``outputs.py``) into a buffer from the pool, where the device-to-host
copy puts them on a GPU. The rows are written on the launching thread,
within the launch's modelled host time (``--sim-launch-us``): a second
Python thread writing them would take the GIL from the host's own steps,
which a GPU's copy engine never does.

What cannot be the same without a GPU is listed in one place,
``docs/simulated-device.md``.
"""

from __future__ import annotations

import contextlib

import torch

from ..errors import is_sticky_cuda_error
from ..interface import OutputKind
from ..lazy import LazyTensor, StepInfo
from ..step.device import Call
from ..step.image_inputs import ImageCall, pack
from ..step.inputs import repack
from ..step.staging import PinnedPool
from .cost import VisionWork
from .outputs import OutputSynth
from .stream import Launch, SimStream


class _Graph:
    """A captured configuration: nothing to record, a replay launches its
    forward (a text or an image step's)."""

    def __init__(self, forward):
        self.forward = forward


class SimDevice:
    name = "sim"
    torch_device = torch.device("cpu")
    graphs = True

    def __init__(self, stream: SimStream, synth: OutputSynth, vision: VisionWork | None = None):
        self.stream = stream
        self.synth = synth
        self.vision = vision  # the image tower's shape, for a model that embeds images
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
        host = staging.np_words
        if layout == batch.layout:
            host[: layout.size] = batch.numpy()[: layout.size]
        else:
            repack(batch, layout, host, dimension)
        return host, (staging,)

    def forward(self, call: Call) -> Launch:
        rows, cols = self.synth.shape(call.batch)
        copied = (call.layout.size + rows * cols) * 4  # the arena in, the rows out
        adapted = call.adapters.adapted if call.adapters is not None else 0.0
        return self.stream.launch(call.lengths, call.layout.sequences, copied, adapted)

    def capture(self, call: Call):
        return _Graph(self.forward), None

    def replay(self, graph, out, call) -> Launch:
        return graph.forward(call)

    def download(self, out: Launch, call: Call, staging, info: StepInfo) -> LazyTensor:
        rows, cols = self.synth.shape(call.batch)
        buf = self.pool.acquire(max(rows * cols, 1) * 4)
        if not out.event.code:  # a failed step has no rows
            self.synth.fill(call.batch, buf.np_floats)
        out.event.written()
        self.stream.landed(out)
        return LazyTensor.staged(buf, rows, cols, out.event, self.pool, staging, info)

    def is_sticky(self, e: BaseException) -> bool:
        return is_sticky_cuda_error(e)

    def image_plan(self, images: int) -> None:
        return None

    def upload_images(self, images, layout, dest, dimension):
        staging = self.pool.acquire(layout.size * 4)
        pack(images, layout, staging.np_floats, dimension)
        return staging.np_floats, (staging,)

    def forward_images(self, call: ImageCall) -> Launch:
        if self.vision is None:
            raise RuntimeError("the simulated device has no vision tower to cost")
        slots = call.layout.slots
        copied = (call.layout.size + call.count * self.synth.cols[OutputKind.DENSE]) * 4
        seconds = self.stream.cost.image_seconds(slots, self.vision)
        return self.stream.launch([self.vision.tokens] * slots, slots, copied, seconds=seconds)

    def capture_images(self, call: ImageCall):
        return _Graph(self.forward_images), None

    def download_images(self, out: Launch, call: ImageCall, staging, info: StepInfo) -> LazyTensor:
        rows, cols = call.count, self.synth.cols[OutputKind.DENSE]
        buf = self.pool.acquire(rows * cols * 4)
        if not out.event.code:
            images = call.images
            self.synth.fill_images(images.pixels, images.dims, images.norm, buf.np_floats)
        out.event.written()
        self.stream.landed(out)
        return LazyTensor.staged(buf, rows, cols, out.event, self.pool, staging, info)
