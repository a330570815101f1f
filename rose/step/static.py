"""The static-buffer runtime: a step padded to its configuration's bucket
runs on that configuration's static arena, and on a device with graphs
through its lazily captured CUDA graph (``graphs.py`` decides warm-up,
capture, replay). A step outside the grid is left to the next runtime."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from ..interface import Batch, Layout
from ..lazy import LazyTensor, StepInfo
from .device import Call, Device
from .graphs import Action, Dispatcher, GraphKey

log = logging.getLogger("rose.graphs")


@dataclass
class _Entry:
    """One configuration's static input arena, graph and output."""

    layout: Layout
    arena: torch.Tensor
    graph: object | None = None
    out: torch.Tensor | None = None


class StaticRuntime:
    labels = tuple(a.value for a in (Action.WARMUP, Action.CAPTURE, Action.REPLAY))
    reference = True

    def __init__(self, device: Device, dispatcher: Dispatcher, dimension: int):
        self.device = device
        self.dispatcher = dispatcher
        self.dimension = dimension
        self._entries: dict[GraphKey, _Entry] = {}

    def run(self, batch: Batch) -> LazyTensor | None:
        key = self.dispatcher.key(batch.kind, batch.num_sequences, batch.num_tokens)
        if key is None:
            return None
        action = self.dispatcher.hit(key)
        entry = self._entry(key)
        layout = Layout.of(batch.num_sequences, batch.num_tokens, key.tokens)
        arena, staging = self.device.upload(batch, layout, entry.arena, self.dimension)
        lengths = [*batch.lengths, layout.tokens - layout.real_tokens]
        call = Call(key.kind, arena, layout, lengths, layout.tokens, batch)
        capture_s = self._capture(entry, key, call) if action is Action.CAPTURE else 0.0
        if entry.graph is not None and action in (Action.CAPTURE, Action.REPLAY):
            out = self.device.replay(entry.graph, entry.out, call)
        else:  # warm-up, a failed capture, or a device without graphs (same buffers)
            out = self.device.forward(call)
        info = StepInfo(action.value, layout.real_tokens, layout.tokens, capture_s)
        return self.device.download(out, call, staging, info)

    def observe(self, batch: Batch, lazy: LazyTensor) -> None:
        pass

    def _entry(self, key: GraphKey) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            layout = Layout.of(key.sequences, key.tokens - 1, key.tokens)
            entry = self._entries[key] = _Entry(layout, self.device.static_arena(layout.size))
        return entry

    def _capture(self, entry: _Entry, key: GraphKey, call: Call) -> float:
        """Captures the configuration (its full-bucket layout; the sizes
        match ``call``'s); a capture that fails leaves it eager on its
        static buffers. Seconds spent, 0 on a device without graphs."""
        started = time.perf_counter()
        whole = Call(call.kind, entry.arena, entry.layout, call.lengths, entry.layout.tokens, call.batch)
        try:
            graph, out = self.device.capture(whole)
        except Exception as e:  # a kernel that cannot be captured: stay eager
            if self.device.is_sticky(e):
                raise
            log.exception("capture of %s failed; it will run eagerly on static buffers", key)
            self.dispatcher.failed(key)
            return time.perf_counter() - started
        entry.graph, entry.out = graph, out
        self.dispatcher.captured(key)
        if graph is None:
            return 0.0
        elapsed = time.perf_counter() - started
        log.info("captured %s in %.0f ms", key, elapsed * 1e3)
        return elapsed
