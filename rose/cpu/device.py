"""The CPU as a step's device: the arena is already where the model reads
it, the forward runs on the calling thread, and its output is on the host
when it returns (a LazyTensor with no event)."""

from __future__ import annotations

import contextlib

import torch

from ..attention import AttentionBackend
from ..interface import Batch
from ..lazy import LazyTensor
from ..models import EmbeddingModel
from ..step.device import Call
from ..step.image_inputs import pack
from ..step.inputs import repack, rows_for, step_inputs
from ..step.staging import PinnedPool
from .threads import ThreadBudget


class CpuDevice:
    """Steps on the host. ``threads`` sets the torch threads per step by
    its size (``threads.py``)."""

    name = "cpu"
    torch_device = torch.device("cpu")
    # Static buffers on the CPU run the same bookkeeping without graphs,
    # so that path is tested where there is no GPU.
    graphs = False

    def __init__(self, model: EmbeddingModel, backend: AttentionBackend, threads: ThreadBudget):
        self.model = model
        self.backend = backend
        self.threads = threads
        self.pool = PinnedPool(pin=False)  # unused on the CPU: outputs are the model's own tensors

    def enter_thread(self) -> None:
        pass

    def guard(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    def prepare(self, batch: Batch) -> None:
        self.threads.apply(batch.layout.real_tokens)

    def static_arena(self, size: int) -> torch.Tensor:
        return torch.zeros(size, dtype=torch.int32)

    def upload(self, batch, layout, dest, dimension):
        if dest is None:  # eager: the host's arena is the device's
            return batch.arena, ()
        repack(batch, layout, dest, dimension)
        return dest, ()

    def forward(self, call: Call) -> torch.Tensor:
        x = step_inputs(call.arena, call.layout, self.backend, self.model.causal, call.lengths, call.max_seqlen)
        return self.model(call.kind, x)

    def capture(self, call: Call):
        return None, None

    def replay(self, graph, out, call):  # never called: no graphs
        raise RuntimeError("the CPU has no graphs to replay")

    def download(self, out, call, staging, info):
        return LazyTensor.ready(out[: rows_for(call.kind, call.layout)], info)

    def is_sticky(self, e: BaseException) -> bool:
        return False

    def image_plan(self, images: int) -> object:
        return self.model.image_plan(images, self.torch_device)

    def upload_images(self, images, layout, dest, dimension):
        arena = dest if dest is not None else torch.empty(layout.size, dtype=torch.float32)
        pack(images, layout, arena.numpy(), dimension)
        return arena, ()

    def forward_images(self, call) -> torch.Tensor:
        self.threads.apply(call.layout.slots * call.layout.image.tokens)
        pixels, dims, norm = call.layout.views(call.arena)
        return self.model.embed_images(pixels, dims, norm != 0, call.plan)

    def capture_images(self, call):
        return None, None

    def download_images(self, out, call, staging, info):
        return LazyTensor.ready(out[: call.count], info)
