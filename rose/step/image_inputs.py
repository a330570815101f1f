"""From an image step's input (``interface.Images``) to what a device
reads: the pixels checked and every option resolved (``check_images``),
and the *image arena*, one float32 buffer holding the pixels, then each
image's dimensions and normalisation flag as int32 bits, so moving a
step's inputs to the device is one copy and a configuration's static
arena is what its graph reads. A step padded up to its bucket fills the
spare slots with zero images (full dimensions, not normalised): each image
is its own attention sequence, so they change no real row, and their rows
come after the real ones, where they are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InvalidBatchError
from ..interface import Images
from ..models import ImageInput


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
