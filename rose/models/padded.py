"""Attention for models whose scores need more than a ragged kernel gives:
an additive per-pair bias (MPNet's relative positions) or a mask beyond
"same sequence" (ModernBERT's and Gemma3's sliding windows).

Each sequence's q, k and v are gathered into a padded block [n, heads, L,
d] (L = the step's longest-sequence bound), SDPA runs once with the mask,
and the rows are scattered back; the linear layers stay ragged. Masks are
built once per step on the device from ``cu_seqlens`` and ``max_seqlen``
only, so no host value is read (capture-safe).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention import AttentionBackend, AttnPlan
from ..attention.sdpa import PaddedLayout
from .base import StepInputs


class PaddedAttention(AttentionBackend):
    """SDPA on padded per-sequence blocks; the plan's ``extra`` is
    (PaddedLayout, mask), the mask bool (True = attend) or additive float,
    broadcastable to [n, heads, L, L]."""

    name = "sdpa_padded_mask"
    capture_safe = True

    def attend(self, q, k, v, plan: AttnPlan, scale: float) -> torch.Tensor:
        lay, mask = plan.extra
        o = F.scaled_dot_product_attention(to_blocks(q, lay), to_blocks(k, lay), to_blocks(v, lay), attn_mask=mask,
                                           scale=scale, enable_gqa=q.shape[1] != k.shape[1])
        return from_blocks(o, lay)

    def plan_for(self, x: StepInputs, tokens: int, mask_fn) -> AttnPlan:
        """A plan whose mask is ``mask_fn(layout, slots)`` (slots: the
        positions 0..L-1 of the padded block); ``mask_fn`` sees the key
        padding mask as ``layout.mask`` ([n, 1, 1, L], True = real)."""
        width = x.plan.max_seqlen
        lay = PaddedLayout(x.cu_seqlens, tokens, width, causal=False)
        slots = torch.arange(width, device=x.cu_seqlens.device)
        return AttnPlan(x.cu_seqlens, x.plan.lengths, width, False, backend=self, extra=(lay, mask_fn(lay, slots)))


def to_blocks(t: torch.Tensor, lay: PaddedLayout) -> torch.Tensor:
    """[T, heads, d] on the flat axis → [n, heads, L, d] padded blocks."""
    n, width = lay.shape
    return t.index_select(0, lay.gather).view(n, width, *t.shape[1:]).transpose(1, 2)


def from_blocks(o: torch.Tensor, lay: PaddedLayout) -> torch.Tensor:
    """[n, heads, L, d] padded blocks → [T, heads, d], padding dropped."""
    n, width = lay.shape
    return o.transpose(1, 2).reshape(n * width, o.shape[1], o.shape[3]).index_select(0, lay.scatter)


def window_mask(lay: PaddedLayout, slots: torch.Tensor, window: int) -> torch.Tensor:
    """Real keys within ``window`` positions either side (inclusive)."""
    near = (slots.unsqueeze(0) - slots.unsqueeze(1)).abs() <= window
    return lay.mask & near
