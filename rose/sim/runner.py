"""The host path of a GPU step, with the device modelled.

Everything up to the launch is what ``rose/runner.py`` does on CUDA: options
resolved, the graph dispatcher's padded configuration (warm-up, capture,
replay), the batch packed into a staging buffer from the pinned pool
(``repack`` for a padded step), an output buffer from the same pool, and a
LazyTensor whose buffers return to the pool once its event has completed.
Only the forward pass and the two copies are replaced: the simulated device
(``device.py``) queues the step, and the outputs are written on the host
(``outputs.py``) while the modelled step runs. A graph capture costs
nothing here (a real one takes tens of milliseconds, once per
configuration).
"""

from __future__ import annotations

import torch

from ..errors import DeviceError, is_sticky_cuda_error
from ..graphs import Action, Dispatcher, GraphSettings
from ..interface import Batch, Layout
from ..layout import repack, resolve_defaults
from ..lazy import LazyTensor, StepInfo
from ..pinned import PinnedPool
from ..runner import RunnerStats
from .device import SimDevice
from .outputs import OutputSynth


class SimRunner:
    """``rose.runner.Runner``'s interface over a simulated device."""

    threads = None  # no CPU thread budget: the "device" computes
    fast = None  # no CPU fast path either

    def __init__(self, device: SimDevice, synth: OutputSynth, dimension: int, normalize_default: bool,
                 settings: GraphSettings | None = None, graphs: bool = True):
        self.device = device
        self.synth = synth
        self.dimension = dimension
        self.normalize_default = normalize_default
        self.dispatcher = Dispatcher(settings or GraphSettings(), enabled=graphs)
        self.pool = PinnedPool(pin=False)  # no CUDA to pin with; same pool logic
        self.stats = RunnerStats()

    def run(self, batch: Batch) -> LazyTensor:
        try:
            return self._run(batch)
        except RuntimeError as e:  # as rose/runner.py: a lost context outlives the step
            if is_sticky_cuda_error(e):
                raise DeviceError(f"the CUDA context is unusable after: {e}") from e
            raise

    def _run(self, batch: Batch) -> LazyTensor:
        resolve_defaults(batch, self.dimension, self.normalize_default)
        key = self.dispatcher.key(batch.kind, batch.num_sequences, batch.num_tokens)
        action = self.dispatcher.hit(key)
        layout = batch.layout
        lengths = batch.lengths
        if action is Action.EAGER:
            staging = self.pool.acquire(layout.size * 4)
            staging.view(torch.int32)[: layout.size].copy_(batch.arena[: layout.size])
            padded = layout
        else:
            padded = Layout.of(batch.num_sequences, batch.num_tokens, key.tokens)
            staging = self.pool.acquire(padded.size * 4)
            repack(batch, padded, staging.view(torch.int32)[: padded.size], self.dimension)
            if padded.tokens > padded.real_tokens:
                lengths = [*lengths, padded.tokens - padded.real_tokens]
            if action is Action.CAPTURE:
                self.dispatcher.captured(key)
        self.stats.steps[action.value] += 1
        self.stats.padded_tokens += padded.tokens - padded.real_tokens
        event = self.device.launch(lengths, layout.sequences)
        rows, cols = self.synth.shape(batch)
        buf = self.pool.acquire(max(rows * cols, 1) * 4)
        host = buf.view(torch.float32)
        self.synth.fill(batch, host.numpy())
        info = StepInfo(action.value, layout.real_tokens, padded.tokens)
        return LazyTensor(host, rows, cols, event=event, pool=self.pool, buffers=(buf, staging), info=info)

    run_on_host_thread = run

    def capture(self, key) -> None:
        """Nothing to capture: the configuration replays from now on."""
        self.dispatcher.hit(key)
        self.dispatcher.captured(key)

