"""PyTorch SDPA backends. Always available, CPU included.

``sdpa`` calls SDPA once per sequence: no padding is ever computed, but the
loop reads host-side lengths (not capture-safe), and many small calls each
pay a thread-pool round trip, which hurts on a busy CPU. ``sdpa_padded``
gathers q, k and v into a padded ``[n, heads, max_seqlen, dim]`` block for
attention only (the linear layers stay ragged) and makes one masked call:
capture-safe, launch-cheap, at the price of attention work on padding.
``sdpa_masked`` makes one call over the whole flat axis with a
block-diagonal mask: capture-safe, but quadratic in the batch's tokens, so
only for small batches. Index and mask tensors are built on the device
from ``cu_seqlens`` once per step and shared by all layers.
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


class PaddedLayout:
    """Where each (sequence, slot) of the padded block reads from, and
    where each flat token's output is."""

    def __init__(self, cu_seqlens: torch.Tensor, num_tokens: int, max_seqlen: int, causal: bool):
        dev = cu_seqlens.device
        cu = cu_seqlens.long()
        slots = torch.arange(max_seqlen, device=dev)
        lengths = cu[1:] - cu[:-1]
        valid = slots.unsqueeze(0) < lengths.unsqueeze(1)  # [n, L]
        self.shape = (lengths.numel(), max_seqlen)
        self.gather = torch.where(valid, cu[:-1].unsqueeze(1) + slots, 0).flatten()  # [n * L]
        mask = valid[:, None, None, :]  # keys
        if causal:
            mask = mask & (slots.unsqueeze(1) >= slots.unsqueeze(0))
        self.mask = mask
        flat = torch.arange(num_tokens, device=dev)
        seq = torch.searchsorted(cu[1:].contiguous(), flat, right=True).clamp_max(lengths.numel() - 1)
        self.scatter = seq * max_seqlen + flat - cu[seq]  # each token's row in the [n * L] block


class PaddedSdpaBackend(AttentionBackend):
    name = "sdpa_padded"
    capture_safe = True
    pads_to_longest = True

    def attend(self, q, k, v, plan: AttnPlan, scale: float) -> torch.Tensor:
        if plan.extra is None:  # built once per step, shared by all layers
            plan.extra = PaddedLayout(plan.cu_seqlens, q.shape[0], plan.max_seqlen, plan.causal)
        lay = plan.extra
        n, width = lay.shape
        # [T, H, D] -> [n, H, L, D]
        qp, kp, vp = (t.index_select(0, lay.gather).view(n, width, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=lay.mask, scale=scale,
                                           enable_gqa=q.shape[1] != k.shape[1])
        return o.transpose(1, 2).reshape(n * width, *q.shape[1:]).index_select(0, lay.scatter)
