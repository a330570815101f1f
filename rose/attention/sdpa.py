"""PyTorch SDPA backends. Always available, CPU included.

``sdpa`` calls SDPA once per sequence: no padding is ever computed, but the
loop reads host-side lengths, so it is not capture-safe. ``sdpa_masked``
makes one SDPA call over the whole flat axis with a block-diagonal mask
built on the device from ``cu_seqlens``: capture-safe and launch-cheap, but
quadratic in the batch's tokens, so it only pays off for small batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import AttentionBackend, AttnPlan


class SdpaBackend(AttentionBackend):
    name = "sdpa"
    capture_safe = False

    def attend(self, q, k, v, plan: AttnPlan, scale: float) -> torch.Tensor:
        out = torch.empty_like(q)
        gqa = q.shape[1] != k.shape[1]
        start = 0
        for n in plan.lengths:
            end = start + n
            # [n, H, D] -> [H, n, D]
            o = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1),
                k[start:end].transpose(0, 1),
                v[start:end].transpose(0, 1),
                is_causal=plan.causal,
                scale=scale,
                enable_gqa=gqa,
            )
            out[start:end] = o.transpose(0, 1)
            start = end
        return out


def block_mask(cu_seqlens: torch.Tensor, num_tokens: int, causal: bool) -> torch.Tensor:
    """[T, T] bool: token i may attend to token j. Built on the device from
    ``cu_seqlens`` alone; tokens past ``cu_seqlens[-1]`` (bucket padding)
    attend among themselves, so no row is empty."""
    idx = torch.arange(num_tokens, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    seg = torch.searchsorted(cu_seqlens[1:].contiguous(), idx, right=True)
    mask = seg.unsqueeze(1) == seg.unsqueeze(0)
    if causal:
        mask &= idx.unsqueeze(1) >= idx.unsqueeze(0)
    return mask


class MaskedSdpaBackend(AttentionBackend):
    name = "sdpa_masked"
    capture_safe = True
    # The [T, T] mask and scores grow quadratically; past this the
    # per-sequence and fused kernels are always the better choice.
    max_tokens = 4096

    def attend(self, q, k, v, plan: AttnPlan, scale: float) -> torch.Tensor:
        if plan.extra is None:  # built once per step, shared by all layers
            plan.extra = block_mask(plan.cu_seqlens, q.shape[0], plan.causal)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0),
            attn_mask=plan.extra,
            scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        return o.squeeze(0).transpose(0, 1)
