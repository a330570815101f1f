"""The engine interface: what a host (Tulip, a script, a test) hands to ROSE
and what it gets back. Nothing here knows about models or transports.

A host calls ``engine.step(batch)`` and gets a LazyTensor at once; the bytes
are on the host when ``LazyTensor.event_handle`` has completed (0 = ready).
``step`` raises ``InvalidBatchError`` for a batch the caller got wrong; any
other exception is the engine's own failure.

LoRA adapters, one pool of a base model serving many fine-tunes:

- ``Engine.load_adapter(name, path)``: a directory in PEFT's format
  (``adapter_config.json``, ``adapter_model.safetensors``); ``name`` is
  1 to 128 of letters, digits and ``._:/@+-``. ``AdapterError`` (a
  ``RoseError``) says why one is refused, the engine unchanged.
  ``Engine.unload_adapter(name)``; ``Engine.adapters()``: the loaded ones
  (``AdapterInfo``: name, path, rank, alpha, targets, parameters...).
- Bounds, fixed at start-up (``Engine.from_dir(max_adapters=8,
  max_adapter_rank=64)``) and in ``ModelInfo.max_adapters`` and
  ``.max_adapter_rank`` (both 0: this engine takes none).
- A batch names one per sequence (``Batch.adapters``: a loaded adapter's
  name, or None for the base model; ``step_arena(..., adapters)`` on the
  host's path), so sequences of several adapters and of the base model
  share a step. A name not loaded is an ``InvalidBatchError``.
- A step with any adapter runs eagerly (step mode ``lora``, declared in
  ``ModelInfo.step_modes``): never on the CPU's fast paths or a CUDA
  graph; a step with none runs exactly as it would with no adapter
  loaded, on whatever runtime it would.

Images, for a model that embeds them (CLIP, SigLIP: ``ModelInfo.image_size``
is not ``(0, 0)``):

- ``engine.step_images(images) -> LazyTensor``: ``Images`` holds the
  pixels the host prepared (decoded, resized, cropped, rescaled and
  normalised as the model's ``preprocessor_config.json`` says), float32
  ``[N, 3, H, W]`` at ``ModelInfo.image_size``, and per image the dense
  options a text row takes (``dimensions``, ``normalize``). The result is
  laid out as a ``dense`` step's: one row per image, ``dimension`` float32
  values, zero past an image's dimensions; rows are in the same space as
  the text rows of ``step`` (the text tower's, ``dense``).
- Each image costs ``ModelInfo.image_tokens`` tokens of the vision tower
  (for the host's token budget). Image steps report their own step modes
  (``ModelInfo.image_step_modes``, listed in ``step_modes`` too).
- A wrong shape, dtype, image count (0), a non-finite value, options of
  another length, or a model without images is an ``InvalidBatchError``.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .errors import InvalidBatchError

__all__ = ["Batch", "Images", "InvalidBatchError", "Layout", "OutputKind"]


class OutputKind(str, enum.Enum):
    """What one step produces. Row layout of the LazyTensor, per kind:

    - ``dense``: one row per sequence, ``dimension`` float32 values; values
      past a sequence's requested dimensions are zero.
    - ``sparse``: one row per token, 1 value: the token's lexical weight
      (0 for special tokens and tokens with no weight).
    - ``multi_vector``: ``len - 1`` rows per sequence (every token after the
      first), ``multi_vector_dimension`` values each, L2-normalised.
    - ``score``: one row per sequence, 2 values: the raw logit and the
      model's activation of it (sigmoid).
    - ``classify``: one row per sequence, one raw logit per label (in the
      order of ``ModelInfo.labels``); the host applies softmax or sigmoid.
    - ``sparse_vocab``: one row per sequence, one weight per vocabulary
      entry (SPLADE), mostly zero; the host keeps the non-zero ones.
    - ``token_states``: one row per token (special tokens included), the
      encoder's last hidden state, ``token_states_dimension`` float32
      values each, not normalised (TEI's ``/embed_all``). Every embedding
      model produces it; ``ModelInfo.kinds`` does not list it.
    """

    DENSE = "dense"
    SPARSE = "sparse"
    MULTI_VECTOR = "multi_vector"
    SCORE = "score"
    CLASSIFY = "classify"
    SPARSE_VOCAB = "sparse_vocab"
    TOKEN_STATES = "token_states"


@dataclass(frozen=True)
class Layout:
    """Sizes of one batch: ``tokens`` on the flat axis over ``segments``
    segments, of which the first ``sequences`` are real. A padded batch has
    one extra segment at the end holding the filler tokens."""

    sequences: int
    segments: int
    tokens: int
    real_tokens: int

    @classmethod
    def of(cls, sequences: int, real_tokens: int, padded_tokens: int | None = None) -> "Layout":
        """The layout of a batch (one shared instance per shape, so its
        offsets are computed once)."""
        return _layout(sequences, real_tokens, padded_tokens)

    @classmethod
    def _make(cls, sequences: int, real_tokens: int, padded_tokens: int | None) -> "Layout":
        tokens = real_tokens if padded_tokens is None else padded_tokens
        if tokens < real_tokens:
            raise ValueError(f"cannot pad {real_tokens} tokens down to {tokens}")
        segments = sequences + (1 if tokens > real_tokens else 0)
        return cls(sequences, segments, tokens, real_tokens)

    @property
    def size(self) -> int:
        """int32 words in the arena."""
        return 3 * self.tokens + (self.segments + 1) + 3 * self.segments

    @functools.cached_property
    def offsets(self) -> dict[str, tuple[int, int]]:
        """(start, length) in int32 words of each field of the arena."""
        t, s = self.tokens, self.segments
        out, o = {}, 0
        for name, n in (("ids", t), ("positions", t), ("seg_ids", t), ("cu", s + 1),
                        ("inv_len", s), ("dims", s), ("norm", s)):
            out[name] = (o, n)
            o += n
        return out

    @functools.cached_property
    def _split(self) -> list[int]:
        return [n for _, n in self.offsets.values()]

    def views(self, arena: torch.Tensor) -> dict[str, torch.Tensor]:
        """Tensor views of each field of an int32 arena (``inv_len`` as float32)."""
        # One split call is several times cheaper than seven slicings, and
        # the tensor method skips torch.split's two Python wrappers.
        if arena.numel() != self.size:
            arena = arena[: self.size]
        parts = arena.split_with_sizes(self._split)
        out = dict(zip(self.offsets, parts))
        out["inv_len"] = out["inv_len"].view(torch.float32)
        return out


# Kind by name: an enum lookup by value is several times slower.
_KINDS: dict[object, OutputKind] = {**{k.value: k for k in OutputKind}, **{k: k for k in OutputKind}}


@functools.lru_cache(maxsize=4096)
def _layout(sequences: int, real_tokens: int, padded_tokens: int | None) -> Layout:
    return Layout._make(sequences, real_tokens, padded_tokens)


class Batch:
    """A ragged batch: one flat token axis cut by ``cu_seqlens``; no padding.

    Everything the engine reads besides weights is packed in one int32
    *arena* on the host, in this order (T tokens, n sequences):

    ====================  =====  ==========================================
    field                 words  meaning
    ====================  =====  ==========================================
    ``ids``               T      token ids
    ``positions``         T      position of each token in its sequence
    ``seg_ids``           T      sequence index of each token
    ``cu``                n + 1  ``cu_seqlens``: 0, then cumulative lengths
    ``inv_len``           n      1 / length, as float32 bits
    ``dims``              n      dense: Matryoshka dimensions (0 = full)
    ``norm``              n      dense: L2-normalise (1), not (0), default (-1)
    ====================  =====  ==========================================

    A host outside Python (Tulip) builds the arena itself, with every option
    resolved (no 0 dims, no -1 norm), so a step costs Python almost nothing;
    ``from_lists`` builds it from Python lists and leaves defaults to the
    engine (``resolved`` is False).

    ``adapters``, beside the arena: None (every sequence on the base model,
    the usual case), or one entry per sequence, the name of a loaded
    adapter or None for the base model. A name no loaded adapter has makes
    the step an ``InvalidBatchError`` (an adapter unloaded while the host
    held a request for it included).
    """

    __slots__ = ("_arena", "layout", "kind", "resolved", "_np", "_lengths", "adapters")

    def __init__(self, arena: torch.Tensor, layout: Layout, kind: OutputKind | str = OutputKind.DENSE,
                 resolved: bool = False, adapters: Sequence[str | None] | None = None):
        if arena.dtype != torch.int32 or arena.numel() < layout.size:
            raise ValueError(f"arena must be int32 with at least {layout.size} words")
        # One of _arena and _np is always set: the other is made from it on use.
        self._arena: torch.Tensor | None = arena
        self.layout = layout
        self.kind = OutputKind(kind)
        self.resolved = resolved
        self._np: np.ndarray | None = None
        self._lengths: list[int] | None = None
        self.adapters = adapters

    @property
    def arena(self) -> torch.Tensor:
        """The arena as an int32 tensor (made once, sharing the memory)."""
        if self._arena is None:
            assert self._np is not None
            self._arena = torch.from_numpy(self._np)
        return self._arena

    def numpy(self) -> np.ndarray:
        """The arena as NumPy (a view, made once): host-side work on small
        arrays is cheaper in NumPy."""
        if self._np is None:
            assert self._arena is not None
            self._np = self._arena.numpy()
        return self._np

    def numpy_field(self, name: str) -> np.ndarray:
        """A NumPy view of one field."""
        o, n = self.layout.offsets[name]
        return self.numpy()[o:o + n]

    @property
    def num_sequences(self) -> int:
        return self.layout.sequences

    @property
    def num_tokens(self) -> int:
        return self.layout.tokens

    def field(self, name: str) -> torch.Tensor:
        o, n = self.layout.offsets[name]
        t = self.arena[o:o + n]
        return t.view(torch.float32) if name == "inv_len" else t

    @property
    def token_ids(self) -> torch.Tensor:
        return self.arena[: self.layout.tokens]

    @property
    def cu_seqlens(self) -> torch.Tensor:
        return self.field("cu")

    @property
    def lengths(self) -> list[int]:
        """Segment lengths. A one-segment batch (a lone query, the
        latency-critical case) takes its length from the layout instead of
        a NumPy round trip over ``cu``; ``checked_lengths`` reads ``cu``."""
        if self._lengths is None:
            if self.layout.segments == 1:
                self._lengths = [self.layout.tokens]
            else:
                self._lengths = self.checked_lengths()
        return self._lengths

    def checked_lengths(self) -> list[int]:
        """Segment lengths as ``cu_seqlens`` says (what validation checks)."""
        cu = self.numpy_field("cu")
        self._lengths = (cu[1:] - cu[:-1]).tolist()
        return self._lengths

    @classmethod
    def from_arena(cls, arena: bytearray | memoryview, sequences: int, tokens: int,
                   kind: OutputKind | str = OutputKind.DENSE,
                   adapters: Sequence[str | None] | None = None) -> "Batch":
        """Wraps an arena built by the host, options resolved (no copy when
        it is writable); ``adapters`` as ``Batch.adapters``."""
        if isinstance(arena, bytes):
            arena = bytearray(arena)
        # NumPy first: a step on static buffers only ever reads it as NumPy,
        # and a tensor costs a torch dispatch to make.
        batch = cls.__new__(cls)
        batch._np = np.frombuffer(arena, dtype=np.int32)
        batch._arena = None
        batch.layout = _layout(sequences, tokens, None)
        batch.kind = _KINDS.get(kind) or OutputKind(kind)
        batch.resolved = True
        batch._lengths = None
        batch.adapters = adapters
        if batch._np.size < batch.layout.size:
            raise ValueError(f"arena must hold at least {batch.layout.size} int32 words")
        return batch

    @classmethod
    def from_lists(
        cls,
        sequences: list[list[int]],
        kind: OutputKind | str = OutputKind.DENSE,
        dimensions: list[int] | None = None,
        normalize: list[bool] | None = None,
        adapters: Sequence[str | None] | None = None,
    ) -> "Batch":
        """Builds a batch from Python lists (convenient, not the fast path);
        ``adapters`` as ``Batch.adapters``."""
        lengths = [len(s) for s in sequences]
        n, t = len(sequences), sum(lengths)
        if any(x < 0 or x > 0x7FFFFFFF for s in sequences for x in s):
            raise ValueError("token ids must be non-negative 32-bit integers")
        layout = Layout.of(n, t)
        arena = torch.empty(layout.size, dtype=torch.int32)
        v = layout.views(arena)
        if t:
            v["ids"].copy_(torch.tensor([x for s in sequences for x in s], dtype=torch.int64))
        lens = torch.tensor(lengths, dtype=torch.int32)
        v["cu"][0] = 0
        torch.cumsum(lens, 0, out=v["cu"][1:])
        seg = torch.repeat_interleave(torch.arange(n, dtype=torch.int32), lens)
        v["seg_ids"].copy_(seg)
        v["positions"].copy_(torch.arange(t, dtype=torch.int32) - v["cu"][:-1][seg])
        v["inv_len"].copy_(1.0 / lens.clamp_min(1).to(torch.float32))
        v["dims"].copy_(torch.tensor(dimensions if dimensions is not None else [0] * n, dtype=torch.int32))
        v["norm"].copy_(torch.tensor([-1] * n if normalize is None else [int(bool(x)) for x in normalize],
                                     dtype=torch.int32))
        return cls(arena, layout, kind, adapters=adapters)


@dataclass(frozen=True)
class Images:
    """One image step's input (``Engine.step_images``): ``pixels``, float32
    ``[N, C, H, W]`` (a CPU tensor or a NumPy array), normalised as the
    model's preprocessor says; per image, as a dense text row takes them,
    ``dimensions`` (Matryoshka; 0 or None: full) and ``normalize`` (None:
    the model's default)."""

    pixels: torch.Tensor | np.ndarray
    dimensions: Sequence[int] | np.ndarray | None = None
    normalize: Sequence[bool] | np.ndarray | None = None

    @property
    def count(self) -> int:
        """Images in the step (0 for pixels that are not a batch)."""
        shape = self.pixels.shape
        return int(shape[0]) if len(shape) == 4 else 0
