"""Image steps (``Engine.step_images``), read top to bottom as a text step
is: the input checked and its options resolved (``check_images``), the
runtime choice (a configuration's static buffers and lazily captured CUDA
graph, bucketed by image count, or the eager forward), the run, the
staged output.

An image step's inputs travel as one float32 *image arena*: the pixels,
then each image's dimensions and normalisation flag as int32 bits, so
moving them to the device is one copy and a configuration's static arena
is what its graph reads. A step padded up to its bucket fills the spare
slots with zero images (full dimensions, not normalised): each image is
its own attention sequence, so they change no real row, and their rows
come after the real ones, where they are dropped.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InvalidBatchError
from ..interface import Images
from ..lazy import LazyTensor, StepInfo
from ..models import ImageInput
from .device import Device
from .graphs import Action, Dispatcher, GraphKey

log = logging.getLogger("rose.graphs")

# Step labels, by the dispatcher's action.
_LABELS = {a: f"image_{a.value}" for a in Action}


@dataclass(frozen=True)
class HostImages:
    """Checked images on the host, options resolved: ``pixels`` float32
    ``[N, C, H, W]`` (contiguous), ``dims`` and ``norm`` int32 ``[N]``."""

    pixels: np.ndarray
    dims: np.ndarray
    norm: np.ndarray

    @property
    def count(self) -> int:
        return int(self.pixels.shape[0])


@dataclass(frozen=True)
class ImageLayout:
    """An image arena of ``slots`` images of ``image``'s shape."""

    slots: int
    image: ImageInput

    @property
    def size(self) -> int:
        """float32 words in the arena."""
        return self.slots * (self.image.values + 2)

    def views(self, arena: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pixels ``[slots, C, H, W]``, dims int32, norm int32) of a float32 arena."""
        i, s = self.image, self.slots
        p = s * i.values
        pixels = arena[:p].view(s, i.channels, i.height, i.width)
        return pixels, arena[p:p + s].view(torch.int32), arena[p + s:p + 2 * s].view(torch.int32)


def pack(images: HostImages, layout: ImageLayout, out: np.ndarray, dimension: int) -> None:
    """Writes ``images`` into the flat float32 host arena ``out``, the spare
    slots as zero images."""
    n, s, v = images.count, layout.slots, layout.image.values
    out[: n * v] = images.pixels.reshape(-1)
    out[n * v: s * v] = 0.0
    words = out.view(np.int32)
    dims, norm = s * v, s * v + s
    words[dims:dims + n] = images.dims
    words[dims + n:dims + s] = dimension
    words[norm:norm + n] = images.norm
    words[norm + n:norm + s] = 0


class ImageCall:
    """One image forward as a device runs it: ``arena`` (on the device) laid
    out as ``layout``, of which the first ``images.count`` slots are real;
    ``plan``: the attention plan a configuration made once (None: the
    forward makes its own)."""

    __slots__ = ("arena", "layout", "images", "plan")

    def __init__(self, arena, layout: ImageLayout, images: HostImages, plan: object | None):
        self.arena = arena
        self.layout = layout
        self.images = images
        self.plan = plan

    @property
    def count(self) -> int:
        return self.images.count


def check_images(images: Images, image: ImageInput, dimension: int, normalize_default: bool) -> HostImages:
    """``images`` checked against the model (``InvalidBatchError`` says
    what is wrong), as host arrays with every option resolved."""
    if not isinstance(images, Images):
        raise InvalidBatchError(f"an image step takes Images, not {type(images).__name__}")
    pixels = images.pixels
    if isinstance(pixels, torch.Tensor):
        if pixels.device.type != "cpu":
            raise InvalidBatchError(f"pixels must be on the host, not on {pixels.device}")
        pixels = pixels.detach().numpy()
    if not isinstance(pixels, np.ndarray):
        raise InvalidBatchError(f"pixels must be a tensor or a NumPy array, not {type(pixels).__name__}")
    want = (image.channels, image.height, image.width)
    if pixels.ndim != 4 or tuple(pixels.shape[1:]) != want:
        raise InvalidBatchError(f"pixels must be [N, {', '.join(map(str, want))}], got {list(pixels.shape)}")
    n = pixels.shape[0]
    if n < 1:
        raise InvalidBatchError("an image step needs at least one image")
    if pixels.dtype != np.float32:
        raise InvalidBatchError(f"pixels must be float32, not {pixels.dtype}")
    if not np.isfinite(pixels).all():
        raise InvalidBatchError("pixels must be finite (a NaN or an infinity reached the engine)")
    dims = _per_image(images.dimensions, n, "dimensions", 0)
    if (dims < 0).any() or (dims > dimension).any():
        raise InvalidBatchError(f"dimensions must be in [0, {dimension}] (0: full)")
    dims[dims == 0] = dimension
    norm = _per_image(images.normalize, n, "normalize", int(normalize_default)).astype(bool).astype(np.int32)
    return HostImages(np.ascontiguousarray(pixels), dims, norm)


def _per_image(values, n: int, name: str, default: int) -> np.ndarray:
    if values is None:
        return np.full(n, default, dtype=np.int32)
    try:
        out = np.array(values, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise InvalidBatchError(f"{name} must be integers, one per image") from None
    if out.size != n:
        raise InvalidBatchError(f"{out.size} {name} for {n} images")
    if (np.abs(out) > 0x7FFFFFFF).any():
        raise InvalidBatchError(f"{name} out of range")
    return out.astype(np.int32)


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
        started = time.perf_counter()
        try:
            graph, out = self.device.capture_images(call)
        except Exception as e:  # a kernel that cannot be captured: stay eager
            if self.device.is_sticky(e):
                raise
            log.exception("capture of %d-image steps failed; they will run eagerly on static buffers",
                          key.sequences)
            self.dispatcher.failed(key)
            return time.perf_counter() - started
        entry.graph, entry.out = graph, out
        self.dispatcher.captured(key)
        if graph is None:
            return 0.0
        elapsed = time.perf_counter() - started
        log.info("captured %d-image steps in %.0f ms", key.sequences, elapsed * 1e3)
        return elapsed


@functools.lru_cache(maxsize=1024)
def _info(mode: str, tokens: int, padded_tokens: int) -> StepInfo:
    return StepInfo(mode, tokens, padded_tokens)
