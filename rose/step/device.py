"""The seam between the step path and the hardware: where a step's arena
goes, where its forward runs, and how its output reaches the host.

The runtimes that run the model itself (``eager.py``, ``static.py``) only
talk to a ``Device``. Three satisfy it: ``CudaDevice`` (here: pinned
staging, one asynchronous copy in, a captured graph or the eager forward,
an asynchronous copy out and one event), ``CpuDevice``
(``rose/cpu/device.py``: the arena is already where the model reads it)
and ``SimDevice`` (``rose/sim/device.py``: the host path of CUDA with the
device modelled).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

import torch

from ..adapters import AdapterStep
from ..attention import AttentionBackend
from ..errors import is_sticky_cuda_error
from ..interface import Batch, Layout, OutputKind
from ..lazy import LazyTensor, StepInfo
from ..models import EmbeddingModel
from .image_inputs import HostImages, ImageCall, ImageLayout, pack
from .inputs import repack, rows_for, step_inputs
from .staging import Buffer, PinnedPool


class Call:
    """One forward pass as a device runs it: ``arena`` (on the device) laid
    out as ``layout``, the host-side segment ``lengths`` (the filler segment
    of a padded step included) and the longest, and the step's ``batch``
    as the host sent it (unpadded); ``adapters``: the step's adapters
    (``rose/step/lora.py``), None on a base step. A plain class: a frozen
    dataclass costs a setattr call per field, on every step."""

    __slots__ = ("kind", "arena", "layout", "lengths", "max_seqlen", "batch", "adapters")

    def __init__(self, kind: OutputKind, arena, layout: Layout, lengths: list[int], max_seqlen: int, batch: Batch,
                 adapters: AdapterStep | None = None):
        self.kind = kind
        self.arena = arena
        self.layout = layout
        self.lengths = lengths
        self.max_seqlen = max_seqlen
        self.batch = batch
        self.adapters = adapters


# What a forward leaves for ``download``: the output tensor (on the
# simulated device, the modelled step).
Out = TypeVar("Out")


class Device(Protocol[Out]):
    """What the model-running runtimes need from the hardware."""

    name: str  # as ModelInfo.device reports it
    torch_device: torch.device
    pool: PinnedPool
    # Whether a configuration's static buffers replay a captured graph.
    graphs: bool

    def enter_thread(self) -> None:
        """Once per host thread, before its first step (for good)."""

    def guard(self) -> AbstractContextManager:
        """Selects the device for one step on any thread."""

    def prepare(self, batch: Batch) -> None:
        """Before a step is offered to the runtimes (e.g. CPU threads)."""

    def static_arena(self, size: int) -> torch.Tensor:
        """A configuration's static int32 arena on the device."""

    def upload(self, batch: Batch, layout: Layout, dest: torch.Tensor | None,
               dimension: int) -> tuple[torch.Tensor, tuple[Buffer, ...]]:
        """The batch's arena on the device, padded to ``layout`` when that
        is larger, in ``dest`` when given; with the staging buffers to keep
        until the step's output is on the host."""

    def forward(self, call: Call) -> Out:
        """Runs the forward pass (queued, on an asynchronous device)."""

    def capture(self, call: Call) -> tuple[object | None, Out | None]:
        """Captures ``call`` as a graph: (graph, its static output), or
        (None, None) where the device has no graphs."""

    def replay(self, graph: object, out: Out | None, call: Call | ImageCall) -> Out:
        """Replays a captured graph (a text or an image step's); its output."""

    def download(self, out: Out, call: Call, staging: tuple[Buffer, ...],
                 info: StepInfo) -> LazyTensor:
        """The real rows of ``out`` on their way to the host."""

    def is_sticky(self, e: BaseException) -> bool:
        """Whether ``e`` leaves the device unusable for good."""

    # Image steps (``images.py``); ``replay`` and ``static_arena`` serve them too.

    def image_plan(self, images: int) -> object | None:
        """The attention plan of ``images`` images, made once per
        configuration, outside any capture."""

    def upload_images(self, images: HostImages, layout: ImageLayout, dest: torch.Tensor | None,
                      dimension: int) -> tuple[torch.Tensor, tuple[Buffer, ...]]:
        """The images' float32 arena on the device (``dest`` when given),
        spare slots filled; with the staging buffers to keep."""

    def forward_images(self, call: ImageCall) -> Out:
        """Runs the vision tower over every slot of the call's arena."""

    def capture_images(self, call: ImageCall) -> tuple[object | None, Out | None]:
        """``capture`` for an image call."""

    def download_images(self, out: Out, call: ImageCall, staging: tuple[Buffer, ...],
                        info: StepInfo) -> LazyTensor:
        """The real images' rows of ``out`` on their way to the host."""


class CudaDevice:
    """A CUDA GPU: kernels, copies and the event go to ``torch_device``."""

    graphs = True

    def __init__(self, model: EmbeddingModel, backend: AttentionBackend, device: torch.device):
        self.model = model
        self.backend = backend
        self.torch_device = device
        self.name = str(device)
        self.pool = PinnedPool(pin=True)
        self._graph_pool = torch.cuda.graph_pool_handle()
        # With cuda:N, N > 0, the current device has to be N for kernels,
        # the pinned copies and the event; plain "cuda" means the current
        # device, already right (torch.cuda.set_device refuses it).
        self._select = device.index is not None
        if self._select:
            torch.cuda.set_device(device)

    def enter_thread(self) -> None:
        if self._select:  # the current device is per thread
            torch.cuda.set_device(self.torch_device)

    def guard(self) -> AbstractContextManager:
        return torch.cuda.device(self.torch_device)

    def prepare(self, batch: Batch) -> None:
        pass

    def static_arena(self, size: int) -> torch.Tensor:
        return torch.zeros(size, dtype=torch.int32, device=self.torch_device)

    def upload(self, batch, layout, dest, dimension):
        staging = self.pool.acquire(layout.size * 4)
        if layout == batch.layout:
            staging.np_words[: layout.size] = batch.numpy()[: layout.size]
        else:
            repack(batch, layout, staging.np_words, dimension)
        arena = dest if dest is not None else torch.empty(layout.size, dtype=torch.int32, device=self.torch_device)
        arena.copy_(staging.words[: layout.size], non_blocking=True)
        return arena, (staging,)

    def forward(self, call: Call) -> torch.Tensor:
        x = step_inputs(call.arena, call.layout, self.backend, self.model.causal, call.lengths, call.max_seqlen)
        return self.model(call.kind, x)

    def capture(self, call: Call):
        graph = torch.cuda.CUDAGraph()
        # thread_local: the completion thread may query events while this
        # thread captures; in the default (global) mode that query would
        # invalidate the capture. The float32 cast is captured too, so a
        # replay leaves nothing to run eagerly.
        with torch.cuda.graph(graph, pool=self._graph_pool, capture_error_mode="thread_local"):
            out = _f32(self.forward(call))
        return graph, out

    def replay(self, graph, out, call):
        graph.replay()
        return out

    def download(self, out, call, staging, info):
        rows = out[: rows_for(call.kind, call.layout)]
        return LazyTensor.copy_from_device(_f32(rows), self.pool, staging, info)

    def is_sticky(self, e: BaseException) -> bool:
        return is_sticky_cuda_error(e)

    def image_plan(self, images: int) -> object:
        return self.model.image_plan(images, self.torch_device)

    def upload_images(self, images, layout, dest, dimension):
        staging = self.pool.acquire(layout.size * 4)
        pack(images, layout, staging.np_floats, dimension)
        arena = dest if dest is not None else torch.empty(layout.size, dtype=torch.float32, device=self.torch_device)
        arena.copy_(staging.floats[: layout.size], non_blocking=True)
        return arena, (staging,)

    def forward_images(self, call) -> torch.Tensor:
        pixels, dims, norm = call.layout.views(call.arena)
        return self.model.embed_images(pixels, dims, norm != 0, call.plan)

    def capture_images(self, call):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool, capture_error_mode="thread_local"):
            out = _f32(self.forward_images(call))
        return graph, out

    def download_images(self, out, call, staging, info):
        return LazyTensor.copy_from_device(_f32(out[: call.count]), self.pool, staging, info)


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.float()
