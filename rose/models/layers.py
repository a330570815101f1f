"""Small building blocks shared by the model families."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelLoadError
from ..loader import WeightReader

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # CLIP's
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


def activation(name: str):
    """The activation function a config names."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ModelLoadError(f"activation {name!r} is not supported") from None


def copy_linear(m: nn.Linear, w: WeightReader, name: str) -> None:
    m.weight.copy_(w.take(f"{name}.weight"))
    if m.bias is not None:
        m.bias.copy_(w.take(f"{name}.bias"))


def copy_fused(m: nn.Linear, w: WeightReader, names: list[str]) -> None:
    """Loads several projections stacked into one Linear (QKV, gate/up)."""
    m.weight.copy_(torch.cat([w.take(f"{n}.weight") for n in names]))
    if m.bias is not None:
        m.bias.copy_(torch.cat([w.take(f"{n}.bias") for n in names]))


def copy_norm(m: nn.Module, w: WeightReader, name: str) -> None:
    # Module attributes are typed Tensor | Module; a norm's weight and bias are tensors.
    cast(torch.Tensor, m.weight).copy_(w.take(f"{name}.weight"))
    if getattr(m, "bias", None) is not None:
        cast(torch.Tensor, m.bias).copy_(w.take(f"{name}.bias"))


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, scaled in the model's dtype (as Qwen3)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def segment_cumsum(flags: torch.Tensor, cu_seqlens: torch.Tensor, seg_ids: torch.Tensor) -> torch.Tensor:
    """Inclusive running count of ``flags`` (int) within each sequence of
    the flat axis, on the device."""
    total = torch.cumsum(flags, 0)
    before_start = (total - flags)[cu_seqlens[:-1].long()]
    return total - before_start[seg_ids]


def first_token_index(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Flat index of each sequence's first token."""
    return cu_seqlens[:-1].long()


def rows_after_first(values: torch.Tensor, positions: torch.Tensor, seg_ids: torch.Tensor,
                     num_sequences: int) -> torch.Tensor:
    """[T, D] → [T - n, D]: every token except each sequence's first, in
    order. Shapes depend only on T and n (no host read)."""
    t = values.shape[0]
    keep = t - num_sequences
    # Non-first token t goes to row t - seg - 1; first tokens go to a spare row.
    dest = torch.where(positions == 0, keep, torch.arange(t, device=values.device) - seg_ids - 1)
    out = values.new_empty(keep + 1, values.shape[1])
    out.index_copy_(0, dest, values)
    return out[:keep]
