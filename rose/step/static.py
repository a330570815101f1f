"""The static-buffer runtime: a step padded to its configuration's bucket
runs on that configuration's static arena, and on a device with graphs
through its lazily captured CUDA graph (``graphs.py`` decides warm-up,
capture, replay). A step outside the grid is left to the next runtime."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

import torch

from ..interface import Batch, Layout
from ..lazy import LazyTensor, StepInfo
from .device import Call, Device
from .graphs import Action, Dispatcher, GraphKey, capture_into


class _Outside(enum.Enum):
    """A batch shape outside the graph grid: left to the next runtime."""

    SHAPE = 0


_OUTSIDE: Final = _Outside.SHAPE
# Batch shapes whose plan is kept (a server sees far fewer distinct ones).
_SHAPES = 4096
# A shape's configuration, padded layout, filler length and step records.
_Shape = tuple[GraphKey, Layout, int, dict[Action, StepInfo]]


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
        self._shapes: dict[tuple, _Shape | _Outside] = {}

    def run(self, batch: Batch) -> LazyTensor | None:
        shape = self._shapes.get((batch.kind, batch.layout))
        if shape is None:
            if len(self._shapes) >= _SHAPES:
                self._shapes.clear()
            shape = self._shapes[(batch.kind, batch.layout)] = self._shape(batch)
        if shape is _OUTSIDE:
            return None
        key, layout, filler, infos = shape
        action = self.dispatcher.hit(key)
        entry = self._entry(key)
        arena, staging = self.device.upload(batch, layout, entry.arena, self.dimension)
        call = Call(key.kind, arena, layout, [*batch.lengths, filler], layout.tokens, batch)
        if action is Action.CAPTURE:
            capture_s = self._capture(entry, key, call)
            info = StepInfo(action.value, layout.real_tokens, layout.tokens, capture_s)
        else:
            info = infos[action]
        if entry.graph is not None and action in (Action.CAPTURE, Action.REPLAY):
            out = self.device.replay(entry.graph, entry.out, call)
        else:  # warm-up, a failed capture, or a device without graphs (same buffers)
            out = self.device.forward(call)
        return self.device.download(out, call, staging, info)

    def _shape(self, batch: Batch) -> _Shape | _Outside:
        """What every step of this kind and layout shares: its configuration,
        padded layout, filler length and step records (made once)."""
        key = self.dispatcher.key(batch.kind, batch.num_sequences, batch.num_tokens)
        if key is None:
            return _OUTSIDE
        layout = Layout.of(batch.num_sequences, batch.num_tokens, key.tokens)
        infos = {a: StepInfo(a.value, layout.real_tokens, layout.tokens) for a in (Action.WARMUP, Action.REPLAY)}
        return key, layout, layout.tokens - layout.real_tokens, infos

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
        whole = Call(call.kind, entry.arena, entry.layout, call.lengths, entry.layout.tokens, call.batch)
        return capture_into(entry, key, self.dispatcher, self.device, str(key), lambda: self.device.capture(whole))
