"""The engine interface: what a host (Tulip, a script, a test) hands to ROSE
and what it gets back. Nothing here knows about models or transports.

A host calls ``engine.step(batch)`` and gets a LazyTensor at once; the bytes
are on the host when ``LazyTensor.event_handle`` has completed (0 = ready).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch


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
    """

    DENSE = "dense"
    SPARSE = "sparse"
    MULTI_VECTOR = "multi_vector"
    SCORE = "score"


@dataclass(frozen=True)
class Batch:
    """A ragged batch: one flat token axis cut by ``cu_seqlens``; no padding.

    All tensors live on the host; the engine moves them to its device.
    """

    token_ids: torch.Tensor  # int32 [T]
    cu_seqlens: torch.Tensor  # int32 [n + 1], cu_seqlens[0] == 0, [-1] == T
    kind: OutputKind = OutputKind.DENSE
    # Dense only, per sequence: Matryoshka truncation (0 = full) and
    # whether to L2-normalise.
    dimensions: torch.Tensor | None = None  # int32 [n]
    normalize: torch.Tensor | None = None  # bool [n]
    lengths: list[int] = field(default_factory=list, compare=False)

    @property
    def num_sequences(self) -> int:
        return self.cu_seqlens.numel() - 1

    @property
    def num_tokens(self) -> int:
        return self.token_ids.numel()

    @classmethod
    def from_lists(
        cls,
        sequences: list[list[int]],
        kind: OutputKind | str = OutputKind.DENSE,
        dimensions: list[int] | None = None,
        normalize: list[bool] | None = None,
    ) -> "Batch":
        """Builds a batch from Python lists (convenient, not the fast path)."""
        lengths = [len(s) for s in sequences]
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        flat = [t for s in sequences for t in s]
        return cls(
            token_ids=torch.tensor(flat, dtype=torch.int32),
            cu_seqlens=torch.tensor(cu, dtype=torch.int32),
            kind=OutputKind(kind),
            dimensions=None if dimensions is None else torch.tensor(dimensions, dtype=torch.int32),
            normalize=None if normalize is None else torch.tensor(normalize, dtype=torch.bool),
            lengths=lengths,
        )

    @classmethod
    def from_buffers(
        cls,
        token_ids: bytes,
        lengths: bytes,
        kind: str,
        dimensions: bytes,
        normalize: bytes,
    ) -> "Batch":
        """Builds a batch from little-endian buffers (the host's fast path):
        int32 ids, int32 lengths, int32 dimensions and uint8 normalize flags
        per sequence (the last two may be empty)."""
        ids = torch.frombuffer(bytearray(token_ids), dtype=torch.int32)
        lens = torch.frombuffer(bytearray(lengths), dtype=torch.int32)
        cu = torch.zeros(lens.numel() + 1, dtype=torch.int32)
        torch.cumsum(lens, 0, out=cu[1:])
        dims = torch.frombuffer(bytearray(dimensions), dtype=torch.int32) if dimensions else None
        norm = torch.frombuffer(bytearray(normalize), dtype=torch.uint8).bool() if normalize else None
        return cls(ids, cu, OutputKind(kind), dims, norm, lens.tolist())
