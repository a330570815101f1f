"""Pooling and post-processing over the flat token axis (no padding)."""

from __future__ import annotations

import torch


def pool(hidden: torch.Tensor, mode: str, cu_seqlens: torch.Tensor, seg_ids: torch.Tensor,
         inv_lengths: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """[T, H] → [n, H] in float32, as sentence-transformers' Pooling modes
    compute it. ``seg_ids[t]`` is the sequence of token t; ``inv_lengths``
    is 1/len per sequence (float32); ``positions`` (weightedmean only) is
    each token's position in its sequence."""
    n = cu_seqlens.numel() - 1
    if mode == "cls":
        return hidden[cu_seqlens[:-1].long()].float()
    if mode == "last":
        return hidden[cu_seqlens[1:].long() - 1].float()
    if mode in ("mean", "mean_sqrt_len"):
        sums = torch.zeros(n, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, seg_ids, hidden.float())
        scale = inv_lengths if mode == "mean" else inv_lengths.sqrt()
        return sums * scale.unsqueeze(1)
    if mode == "max":
        out = torch.full((n, hidden.shape[1]), float("-inf"), dtype=torch.float32, device=hidden.device)
        index = seg_ids.long().unsqueeze(1).expand(-1, hidden.shape[1])
        return out.scatter_reduce(0, index, hidden.float(), reduce="amax")
    if mode == "weightedmean":
        if positions is None:
            raise ValueError("weightedmean pooling needs token positions")
        # Token i of a sequence weighs i + 1.
        weights = (positions.float() + 1.0).unsqueeze(1)
        sums = torch.zeros(n, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, seg_ids, hidden.float() * weights)
        totals = torch.zeros(n, 1, dtype=torch.float32, device=hidden.device)
        totals.index_add_(0, seg_ids, weights)
        return sums / totals.clamp_min(1e-9)
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
