"""FlashInfer's ragged prefill (``BatchPrefillWithRaggedKVCacheWrapper``).

Optional (``flashinfer-python``), CUDA only. Its ``plan`` reads the batch
layout on the host once per step and schedules work for every layer, so it
fits the per-step plan here; it is not marked capture-safe (a graph would
need the wrapper's fixed-size CUDA-graph mode).
"""

from __future__ import annotations

import itertools
import logging

import torch

from .base import AttentionBackend, AttnPlan, AttnShape, dense_rows

log = logging.getLogger("rose.attention")

_WORKSPACE_BYTES = 128 << 20


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"
    capture_safe = False

    def __init__(self, module) -> None:
        self._fi = module
        self._wrappers: dict[torch.device, object] = {}
        self._shape: AttnShape | None = None
        self._dtype: torch.dtype | None = None

    def supports(self, shape: AttnShape, device, dtype) -> bool:
        return (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
                and shape.head_dim in (64, 128, 256))

    def bind(self, shape: AttnShape, device, dtype) -> None:
        self._shape, self._dtype = shape, dtype

    def _wrapper(self, device: torch.device):
        w = self._wrappers.get(device)
        if w is None:
            workspace = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            w = self._fi.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
            self._wrappers[device] = w
        return w

    def plan(self, cu_seqlens, lengths, max_seqlen, causal) -> AttnPlan:
        if self._shape is None:
            raise RuntimeError("flashinfer backend used before bind()")
        s = self._shape
        w = self._wrapper(cu_seqlens.device)
        # plan() schedules on the host: indptr built from the host lengths
        # costs nothing, while a device tensor would be copied back (a sync
        # per step).
        indptr = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        w.plan(indptr, indptr, s.num_heads, s.num_kv_heads, s.head_dim,
               causal=causal, sm_scale=s.head_dim ** -0.5, q_data_type=self._dtype, kv_data_type=self._dtype)
        return AttnPlan(cu_seqlens, lengths, max_seqlen, causal, backend=self, extra=w)

    def attend(self, q, k, v, plan: AttnPlan, scale: float) -> torch.Tensor:
        if abs(scale - q.shape[-1] ** -0.5) > 1e-9:
            raise ValueError("flashinfer plans use the default 1/sqrt(head_dim) scale")
        return plan.extra.run(*dense_rows(q, k, v))


def flashinfer_backends() -> list[AttentionBackend]:
    """FlashInfer, when it imports here (call only with CUDA)."""
    try:
        import flashinfer
    except Exception as e:
        log.debug("flashinfer unavailable: %s", e)
        return []
    return [FlashInferBackend(flashinfer)]
