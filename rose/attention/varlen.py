"""Fused varlen kernels that take ``(q, k, v, cu_seqlens, max_seqlen)``:
PyTorch's own ``varlen_attn``, flash-attn (FA2, and FA3's Hopper build) and
FlashAttention-4 (``flash-attn-4``, CuTe DSL, Hopper and newer).

All are optional: each is looked up only on a CUDA machine, and a failed
import (missing package, wrong CUDA, wrong GPU) just leaves it out. Their
launches depend on tensor shapes and the integer ``max_seqlen`` only, so
they are capture-safe when ``max_seqlen`` is fixed per bucket.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Callable

import torch

from .base import AttentionBackend, AttnPlan, AttnShape, dense_rows, expand_kv, first_output

log = logging.getLogger("rose.attention")

_HALF = (torch.float16, torch.bfloat16)


def _import(module: str, attr: str) -> Callable | None:
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as e:  # ImportError, OSError from CUDA libraries, ...
        log.debug("attention kernel %s.%s unavailable: %s", module, attr, e)
        return None


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


class TorchVarlenBackend(AttentionBackend):
    """``torch.nn.attention.varlen.varlen_attn`` (PyTorch ≥ 2.9; its keyword
    names changed between releases, so they are read from the signature)."""

    name = "torch_varlen"
    capture_safe = True

    def __init__(self, fn: Callable):
        self._fn = fn
        params = inspect.signature(fn).parameters
        self._window = "window_size" in params
        self._native_gqa = "enable_gqa" in params
        self._has_scale = "scale" in params
        self._gqa_unexpanded = self._native_gqa  # else decided in bind()

    def supports(self, shape: AttnShape, device, dtype) -> bool:
        return (device.type == "cuda" and dtype in _HALF and shape.head_dim % 8 == 0
                and shape.head_dim <= 128 and _capability(device)[0] >= 8)

    def bind(self, shape: AttnShape, device, dtype) -> None:
        # The flash kernel under varlen_attn shares KV heads natively; a
        # release without ``enable_gqa`` may still accept fewer KV heads.
        # One tiny call at load time says so, instead of repeating K/V in
        # every layer of every step.
        self._gqa_unexpanded = self._native_gqa or (shape.gqa and self._accepts_fewer_kv_heads(shape, device, dtype))

    def _accepts_fewer_kv_heads(self, shape: AttnShape, device, dtype) -> bool:
        t, hq, hkv, d = 8, shape.num_heads, shape.num_kv_heads, shape.head_dim
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(t, h, d, device=device, dtype=dtype, generator=g) for h in (hq, hkv, hkv))
        cu = torch.tensor([0, t], dtype=torch.int32, device=device)
        plan = AttnPlan(cu, [t], t, False, backend=self)
        try:
            self._gqa_unexpanded = True
            native = self.attend(q, k, v, plan, d ** -0.5)
        except Exception as e:  # the kernel wants equal head counts
            log.debug("torch varlen_attn takes no GQA here: %s", e)
            return False
        finally:
            self._gqa_unexpanded = False
        want = self.attend(q, k, v, plan, d ** -0.5)
        return bool(torch.allclose(native.float(), want.float(), atol=2e-2, rtol=2e-2))

    def attend(self, q, k, v, plan: AttnPlan, scale: float) -> torch.Tensor:
        q, k, v = dense_rows(q, k, v)
        kw = {}
        if self._native_gqa:
            kw["enable_gqa"] = q.shape[1] != k.shape[1]
        elif not self._gqa_unexpanded:
            k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
        if self._has_scale:
            kw["scale"] = scale
        elif abs(scale - q.shape[-1] ** -0.5) > 1e-9:
            raise ValueError("this torch's varlen_attn has no scale argument")
        if self._window:
            kw["window_size"] = (-1, 0) if plan.causal else (-1, -1)
        else:
            kw["is_causal"] = plan.causal
        cu = plan.cu_seqlens
        return first_output(self._fn(q, k, v, cu, cu, plan.max_seqlen, plan.max_seqlen, **kw))


class FlashAttnBackend(AttentionBackend):
    """flash-attn's ``flash_attn_varlen_func``: FA2 (``flash_attn``) or FA3
    (``flash_attn_interface``, Hopper). Native GQA."""

    capture_safe = True

    def __init__(self, name: str, fn: Callable, min_major: int, max_major: int = 99):
        self.name = name
        self._fn = fn
        self._min_major = min_major
        self._max_major = max_major

    def supports(self, shape: AttnShape, device, dtype) -> bool:
        if device.type != "cuda" or dtype not in _HALF or shape.head_dim % 8 or shape.head_dim > 256:
            return False
        return self._min_major <= _capability(device)[0] <= self._max_major

    def attend(self, q, k, v, plan: AttnPlan, scale: float) -> torch.Tensor:
        q, k, v = dense_rows(q, k, v)
        cu = plan.cu_seqlens
        return first_output(self._fn(
            q, k, v, cu, cu, plan.max_seqlen, plan.max_seqlen, softmax_scale=scale, causal=plan.causal,
        ))


class Fa4Backend(AttentionBackend):
    """FlashAttention-4 (``flash_attn.cute``), SM90/SM100+, head dims 64-128."""

    name = "fa4"
    capture_safe = True

    def __init__(self, fn: Callable):
        self._fn = fn

    def supports(self, shape: AttnShape, device, dtype) -> bool:
        return (device.type == "cuda" and dtype in _HALF and shape.head_dim in (64, 96, 128)
                and _capability(device)[0] >= 9)

    def attend(self, q, k, v, plan: AttnPlan, scale: float) -> torch.Tensor:
        q, k, v = dense_rows(q, k, v)
        cu = plan.cu_seqlens
        return first_output(self._fn(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=plan.max_seqlen,
            max_seqlen_k=plan.max_seqlen, softmax_scale=scale, causal=plan.causal,
        ))


def varlen_backends() -> list[AttentionBackend]:
    """The fused varlen kernels that import here (call only with CUDA)."""
    found: list[AttentionBackend] = []
    if (fn := _import("flash_attn.cute", "flash_attn_varlen_func")) is not None:
        found.append(Fa4Backend(fn))
    if (fn := _import("flash_attn_interface", "flash_attn_varlen_func")) is not None:
        found.append(FlashAttnBackend("flash_attn3", fn, min_major=9, max_major=9))
    if (fn := _import("flash_attn", "flash_attn_varlen_func")) is not None:
        found.append(FlashAttnBackend("flash_attn", fn, min_major=8))
    if (fn := _import("torch.nn.attention.varlen", "varlen_attn")) is not None:
        found.append(TorchVarlenBackend(fn))
    return found
