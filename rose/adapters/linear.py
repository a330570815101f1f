"""The adapter math of one step, on the flat token axis.

A projection some resident adapter targets is wrapped in a ``LoraLinear``:
the base projection runs on every token as before, then, for each adapter
in the step, ``y[rows_k] += (x[rows_k] @ A_k^T) @ B_k^T`` (the scale
folded into B): two small matmuls per adapter and projection, on the rows
of the sequences that chose it (``AdapterStep``, computed once per step).
Those rows are one range of the token axis (the step's sequences are put
in adapter order first where they were not, ``rose/step/lora.py``), so
they are views: no gather, no scatter. A step with no adapter
(``ACTIVE.step`` None) runs only the base projection.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

# A projection: (layer index, the layer's attribute holding its linear).
Key = tuple[int, str]


@dataclass(frozen=True)
class Delta:
    """One adapter on one (possibly fused) projection: ``a_t`` [in, R],
    ``b_t`` [R, hi - lo] with the scale folded in; it adds to output
    columns ``lo:hi`` (a fused projection's adapted parts, and any between
    them, whose rows of ``b_t`` are zero)."""

    a_t: torch.Tensor
    b_t: torch.Tensor
    lo: int
    hi: int

    def apply(self, x: torch.Tensor, y: torch.Tensor, rows: slice) -> None:
        y[rows, self.lo:self.hi].addmm_(x[rows] @ self.a_t, self.b_t)


@dataclass(frozen=True)
class AdapterStep:
    """The adapters of one step: per adapter, its rows and its deltas by
    projection, and its name; ``order``: the sequences in the order the
    step runs them (None: as the batch has them), so that each adapter's
    rows are one range; ``adapted`` is the tokens that took an adapter,
    weighted by its share of the layers' linear work (the simulated
    device's cost)."""

    groups: tuple[tuple[slice, dict[Key, Delta]], ...]
    names: tuple[str, ...]
    order: np.ndarray | None
    adapted: float


class _Active(threading.local):
    """The step the calling thread is running with adapters, if any (per
    thread: a base step on another thread never sees it)."""

    step: AdapterStep | None = None


ACTIVE = _Active()


class LoraLinear(nn.Module):
    """A projection with the deltas of the step's adapters added."""

    def __init__(self, base: nn.Module, key: Key):
        super().__init__()
        self.base = base
        self.key = key
        self.in_features: int = base.in_features  # type: ignore[assignment]  # nn.Linear or PackedLinear
        self.out_features: int = base.out_features  # type: ignore[assignment]

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight  # type: ignore[return-value]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        step = ACTIVE.step
        if step is None:
            return y
        for rows, deltas in step.groups:
            delta = deltas.get(self.key)
            if delta is not None:
                delta.apply(x, y, rows)
        return y
