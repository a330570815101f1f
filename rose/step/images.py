"""Image steps (``Engine.step_images``), read top to bottom as a text step
is: the input checked and its options resolved (``image_inputs.py``), the
runtime choice (a configuration's static buffers and lazily captured CUDA
graph, bucketed by image count, or the eager forward), the run, the staged
output.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..lazy import LazyTensor, StepInfo
from ..models import ImageInput
from .device import Device
from .graphs import Action, Dispatcher, GraphKey, capture_into
from .image_inputs import HostImages, ImageCall, ImageLayout

# Step labels, by the dispatcher's action.
_LABELS = {a: f"image_{a.value}" for a in Action}


@dataclass
class _Entry:
    """One configuration's static image arena, attention plan, graph and output."""

    layout: ImageLayout
    arena: torch.Tensor
    plan: object | None
    graph: object | None = None
    out: object | None = None


class ImageRuntime:
    """Runs image steps on ``device``: a step whose count has a bucket
    (``Dispatcher.image_key``) on that configuration's static buffers and,
    on a device with graphs, its lazily captured graph (warm-up, capture,
    replay, as ``static.py`` does for text); the others eagerly."""

    labels = tuple(_LABELS[a] for a in (Action.EAGER, Action.WARMUP, Action.CAPTURE, Action.REPLAY))

    def __init__(self, device: Device, image: ImageInput, dispatcher: Dispatcher, dimension: int):
        self.device = device
        self.image = image
        self.dispatcher = dispatcher  # the image configurations' own (not the text steps')
        self.dimension = dimension
        self._entries: dict[GraphKey, _Entry] = {}

    def run(self, images: HostImages) -> LazyTensor:
        key = self.dispatcher.image_key(images.count, self.image.tokens)
        action = self.dispatcher.hit(key)
        tokens = images.count * self.image.tokens
        if key is None:
            layout = ImageLayout(images.count, self.image)
            arena, staging = self.device.upload_images(images, layout, None, self.dimension)
            call = ImageCall(arena, layout, images, None)
            out = self.device.forward_images(call)
            return self.device.download_images(out, call, staging, _info(_LABELS[action], tokens, tokens))
        entry = self._entry(key)
        arena, staging = self.device.upload_images(images, entry.layout, entry.arena, self.dimension)
        call = ImageCall(arena, entry.layout, images, entry.plan)
        if action is Action.CAPTURE:
            info = StepInfo(_LABELS[action], tokens, key.tokens, self._capture(entry, key, call))
        else:
            info = _info(_LABELS[action], tokens, key.tokens)
        if entry.graph is not None and action in (Action.CAPTURE, Action.REPLAY):
            out = self.device.replay(entry.graph, entry.out, call)
        else:  # warm-up, a failed capture, or a device without graphs (same buffers)
            out = self.device.forward_images(call)
        return self.device.download_images(out, call, staging, info)

    def _entry(self, key: GraphKey) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            layout = ImageLayout(key.sequences, self.image)
            arena = self.device.static_arena(layout.size).view(torch.float32)
            entry = self._entries[key] = _Entry(layout, arena, self.device.image_plan(key.sequences))
        return entry

    def _capture(self, entry: _Entry, key: GraphKey, call: ImageCall) -> float:
        """Captures the configuration; one that fails stays eager on its
        static buffers. Seconds spent, 0 on a device without graphs."""
        return capture_into(entry, key, self.dispatcher, self.device, f"{key.sequences}-image steps",
                            lambda: self.device.capture_images(call))


@functools.lru_cache(maxsize=1024)
def _info(mode: str, tokens: int, padded_tokens: int) -> StepInfo:
    return StepInfo(mode, tokens, padded_tokens)
