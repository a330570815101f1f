"""The attention backend interface.

Every layer calls ``backend.attend(q, k, v, plan, scale)`` on flat
``[T, heads, head_dim]`` tensors; ``plan`` is built once per step from the
batch layout and shared by all layers. A backend whose ``capture_safe`` is
true reads no host values inside ``attend`` (its launch depends only on
tensor shapes and ``plan.max_seqlen``), so the same call can be recorded in
a CUDA graph for a fixed bucket (token count, sequence count, max length).
"""

from __future__ import annotations

import abc
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

    @property
    def gqa(self) -> bool:
        return self.num_kv_heads != self.num_heads


@dataclass
class AttnPlan:
    """Per-step layout shared by all layers.

    ``cu_seqlens`` (int32, ``[n + 1]``) is on the compute device; ``lengths``
    is the same layout on the host (plain ints), for backends that loop over
    sequences. ``max_seqlen`` is an upper bound on any length: under CUDA
    graphs it is fixed per bucket so kernels never read host values at
    replay. ``backend`` is the backend that made the plan (a selecting
    backend hands each step to one of several); ``extra`` is that backend's
    own per-step state (e.g. a mask built on first use).
    """

    cu_seqlens: torch.Tensor
    lengths: list[int]
    max_seqlen: int
    causal: bool
    backend: "AttentionBackend | None" = None
    extra: Any = None

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)


class AttentionBackend(abc.ABC):
    """Base class: override ``attend``; ``supports`` and ``plan`` as needed."""

    name: str = "base"
    # May run inside a CUDA graph capture: reads no host values at launch.
    capture_safe: bool = False
    # Largest step (in tokens) the backend should be given, if bounded.
    max_tokens: int | None = None
    # Pads every sequence to the longest: its cost follows sequences x
    # longest, not the real tokens.
    pads_to_longest: bool = False

    def supports(self, shape: AttnShape, device: torch.device, dtype: torch.dtype) -> bool:
        return True

    def bind(self, shape: AttnShape, device: torch.device, dtype: torch.dtype) -> None:  # noqa: B027 (optional hook)
        """Called once when a model is built with this backend (backends
        whose per-step plan needs the model's shape keep it here)."""

    def plan(self, cu_seqlens: torch.Tensor, lengths: list[int], max_seqlen: int, causal: bool) -> AttnPlan:
        return AttnPlan(cu_seqlens, lengths, max_seqlen, causal, backend=self)

    @abc.abstractmethod
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: AttnPlan, scale: float
    ) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [T, Hkv, D] → [T, Hq, D]."""

    def __repr__(self) -> str:
        return f"<attention backend {self.name}>"


def expand_kv(k: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[T, Hkv, D] → [T, num_heads, D] for kernels without native GQA."""
    if k.shape[1] == num_heads:
        return k
    return k.repeat_interleave(num_heads // k.shape[1], dim=1)


def first_output(result) -> torch.Tensor:
    """Kernels differ in returning ``out`` or ``(out, lse, ...)``."""
    return result[0] if isinstance(result, (tuple, list)) else result


def dense_rows(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Views cut from a fused QKV projection have a token stride wider than
    heads x dim; not every kernel accepts that, so copy those."""
    return tuple(t if t.is_contiguous() else t.contiguous() for t in ts)
