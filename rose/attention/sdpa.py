"""PyTorch SDPA, one call per sequence. Always available, CPU included.

Looping keeps the flat layout (no padding is ever computed); the loop reads
host-side lengths, so it is not capture-safe.
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
            qs = q[start:end].transpose(0, 1)
            ks = k[start:end].transpose(0, 1)
            vs = v[start:end].transpose(0, 1)
            o = F.scaled_dot_product_attention(
                qs, ks, vs, is_causal=plan.causal, scale=scale, enable_gqa=gqa
            )
            out[start:end] = o.transpose(0, 1)
            start = end
        return out
