"""Pooling and post-processing over the flat token axis (no padding)."""

from __future__ import annotations

import torch


def pool(hidden: torch.Tensor, mode: str, cu_seqlens: torch.Tensor, seg_ids: torch.Tensor,
         inv_lengths: torch.Tensor) -> torch.Tensor:
    """[T, H] → [n, H] in float32. ``seg_ids[t]`` is the sequence of token t;
    ``inv_lengths`` is 1/len per sequence (float32)."""
    n = cu_seqlens.numel() - 1
    if mode == "cls":
        return hidden[cu_seqlens[:-1].long()].float()
    if mode == "last":
        return hidden[cu_seqlens[1:].long() - 1].float()
    if mode == "mean":
        sums = torch.zeros(n, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, seg_ids, hidden.float())
        return sums * inv_lengths.unsqueeze(1)
    raise ValueError(f"unknown pooling {mode!r}")


def finish_dense(pooled: torch.Tensor, dimensions: torch.Tensor, normalize: torch.Tensor) -> torch.Tensor:
    """Per sequence: keep the first ``dimensions`` values (Matryoshka), then
    L2-normalise where ``normalize`` is set. Values past a sequence's
    dimensions are zero. Shapes stay fixed (capture-friendly)."""
    cols = torch.arange(pooled.shape[1], device=pooled.device)
    keep = cols.unsqueeze(0) < dimensions.unsqueeze(1)
    out = pooled * keep
    norms = out.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return torch.where(normalize.unsqueeze(1), out / norms, out)
