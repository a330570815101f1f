"""One step, read top to bottom: inputs → runtime choice → run → staged
outputs.

The runner resolves the batch's per-sequence defaults, lets the device
prepare for it, and offers it to its runtimes in order (the CPU's gated
runtimes, then a configuration's static buffers and graph, then the eager
forward); the first that takes it returns its staged output, a
LazyTensor, at once. The host never waits here: on CUDA the output is on
its way to a pinned buffer behind one event.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from ..errors import DeviceError
from ..interface import Batch
from ..lazy import LazyTensor
from .device import Device
from .graphs import Dispatcher, GraphKey
from .image_inputs import HostImages
from .images import ImageRuntime
from .inputs import resolve_defaults
from .runtime import RunnerStats, Runtime


class Runner:
    """Executes steps for one model on one device."""

    def __init__(self, device: Device, runtimes: Sequence[Runtime], dispatcher: Dispatcher, dimension: int,
                 normalize_default: bool, images: ImageRuntime | None = None):
        self.device = device
        self.runtimes = tuple(runtimes)
        self.dispatcher = dispatcher  # which graph configurations exist (disabled: none)
        self.dimension = dimension
        self.normalize_default = normalize_default
        self.images = images  # image steps, for a model that embeds images
        # Every label a step may report, in runtime order (image steps'
        # last): the host's metric labels.
        image_labels = images.labels if images is not None else ()
        self.labels = tuple(dict.fromkeys([*(label for r in self.runtimes for label in r.labels), *image_labels]))
        self.stats = RunnerStats(self.labels)
        self._host_thread = threading.local()

    def runtime(self, label: str) -> Runtime | None:
        """The runtime that reports ``label``, if this runner has one."""
        return next((r for r in self.runtimes if label in r.labels), None)

    def run(self, batch: Batch) -> LazyTensor:
        """A step from any thread (a Python caller's)."""
        # The current CUDA device is per thread: selected for this step only.
        with torch.inference_mode(), self.device.guard():
            return self._run(batch)

    def run_on_host_thread(self, batch: Batch) -> LazyTensor:
        """``run`` for a host's own threads, which only ever run steps: they
        enter inference mode and select the device once, for good."""
        if not getattr(self._host_thread, "ready", False):
            # Never exited: the guard lives as long as the thread.
            self._host_thread.inference = torch._C._InferenceMode(True)
            self._host_thread.inference.__enter__()
            self.device.enter_thread()
            self._host_thread.ready = True
        return self._run(batch)

    def _run(self, batch: Batch) -> LazyTensor:
        resolve_defaults(batch, self.dimension, self.normalize_default)
        self.device.prepare(batch)
        try:
            for runtime in self.runtimes:
                lazy = runtime.run(batch)
                if lazy is not None:
                    break
            else:
                raise RuntimeError("no runtime took the step")  # the eager runtime takes every step
        except RuntimeError as e:
            if self.device.is_sticky(e):
                raise DeviceError(f"the CUDA context is unusable after: {e}") from e
            raise
        if runtime.reference:
            for earlier in self.runtimes[:self.runtimes.index(runtime)]:
                earlier.observe(batch, lazy)
        assert lazy.info is not None  # every runtime labels its steps (Runtime.labels)
        self.stats.count(lazy.info)
        return lazy

    def run_images(self, images: HostImages) -> LazyTensor:
        """An image step (checked, options resolved) from any thread."""
        if self.images is None:
            raise ValueError("this runner has no image steps")
        with torch.inference_mode(), self.device.guard():
            try:
                lazy = self.images.run(images)
            except RuntimeError as e:
                if self.device.is_sticky(e):
                    raise DeviceError(f"the CUDA context is unusable after: {e}") from e
                raise
        assert lazy.info is not None
        self.stats.count(lazy.info)
        return lazy

    def capture(self, key: GraphKey) -> None:
        """Warms up and captures one configuration now (for operators who
        prefer paying capture at start-up)."""
        if not self.dispatcher.enabled:
            raise ValueError("CUDA graphs are not enabled on this engine")
        n, t = key.sequences, key.tokens - 1
        if n > t:
            raise ValueError(f"{key}: more sequences than tokens")
        lengths = [t // n + (1 if i < t % n else 0) for i in range(n)]
        batch = Batch.from_lists([[1] * k for k in lengths], key.kind)
        for _ in range(2):
            out = self.run(batch)
            out.synchronize()
            out.release()
