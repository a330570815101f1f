"""The attention backend interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class AttnShape:
    """What a backend needs to know about the model to say if it can run."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool


@dataclass
class AttnPlan:
    """Per-step layout shared by all layers.

    ``cu_seqlens`` is on the compute device; ``lengths`` is the same layout
    on the host (plain ints), for backends that loop over sequences.
    ``max_seqlen`` is an upper bound on any length (fixed per bucket under
    CUDA graphs, so kernels never read host values at replay).
    """

    cu_seqlens: torch.Tensor
    lengths: list[int]
    max_seqlen: int
    causal: bool
    extra: Any = None


class AttentionBackend:
    """Base class: override ``attend``; ``supports`` and ``plan`` as needed."""

    name: str = "base"
    # May run inside a CUDA graph capture: reads no host values at launch.
    capture_safe: bool = False

    def supports(self, shape: AttnShape, device: torch.device, dtype: torch.dtype) -> bool:
        return True

    def plan(self, cu_seqlens: torch.Tensor, lengths: list[int], max_seqlen: int, causal: bool) -> AttnPlan:
        return AttnPlan(cu_seqlens, lengths, max_seqlen, causal)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: AttnPlan, scale: float
    ) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [T, Hkv, D] → [T, Hq, D]."""
        raise NotImplementedError
