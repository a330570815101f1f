"""Which backends exist here, and which one to use for a shape and batch."""

from __future__ import annotations

import functools

import torch

from .base import AttentionBackend, AttnPlan, AttnShape
from .flashinfer import flashinfer_backends
from .sdpa import MaskedSdpaBackend, PaddedSdpaBackend, SdpaBackend
from .selection import SelectionTable, device_kind
from .varlen import varlen_backends

# Used when the selection table has nothing comparable: fused varlen
# kernels first, then the always-available SDPA paths. There is no GPU
# table yet (tables/ holds cpu.json only), so on a GPU "auto" takes the
# first capture-safe, non-padding backend here that imports and supports
# the shape. On the H200 image (torch 2.11 + CUDA 13, no flash-attn,
# FlashAttention-4 or FlashInfer) that is torch_varlen in bf16/fp16 for
# head dims <= 128 and a multiple of 8 (BGE-M3: 64, Qwen3-0.6B: 128), with
# sdpa_masked as the only other candidate (never preferred without a
# table); in fp32 it is sdpa_masked. bench/scripts/attention_sweep.py writes the
# table once a GPU run measures the cells.
DEFAULT_ORDER = ("fa4", "flash_attn3", "flash_attn", "flashinfer", "torch_varlen", "sdpa", "sdpa_padded",
                 "sdpa_masked")


def available_backends(device: torch.device | str | None = None) -> dict[str, AttentionBackend]:
    """Every backend that imports on this machine, by name (fresh instances).
    GPU kernels are only looked up when CUDA is available, so a CPU run
    never imports them."""
    found: list[AttentionBackend] = [SdpaBackend(), PaddedSdpaBackend(), MaskedSdpaBackend()]
    dev = torch.device(device) if device is not None else None
    if torch.cuda.is_available() and (dev is None or dev.type == "cuda"):
        found += varlen_backends() + flashinfer_backends()
    return {b.name: b for b in found}


def get_backend(name: str, device: torch.device | str | None = None) -> AttentionBackend:
    backends = available_backends(device)
    if name not in backends:
        raise ValueError(
            f"attention backend {name!r} is not available here "
            f"(available: {', '.join(sorted(backends))})"
        )
    return backends[name]


class SelectingBackend(AttentionBackend):
    """Picks one of several backends per step from the selection table,
    by the step's token and sequence counts. Each plan records the backend
    that made it (``plan.backend``); a graph runner checks that one's
    ``capture_safe``."""

    name = "auto"

    def __init__(self, backends: list[AttentionBackend], table: SelectionTable, shape: AttnShape,
                 dtype: torch.dtype, device: torch.device | None = None):
        self.backends = {b.name: b for b in backends}  # in DEFAULT_ORDER
        # Eager CPU steps see their real lengths; under CUDA graphs a bucket
        # must keep the backend it was warmed up and captured with.
        self.skew_aware = device is not None and torch.device(device).type == "cpu"
        self.default = backends[0]
        self.table = table
        self.shape = shape
        self.dtype = dtype
        self.capture_safe = all(b.capture_safe for b in backends)
        self.pads_to_longest = any(b.pads_to_longest for b in backends)
        # Per instance: a class-level cache would keep every selector alive.
        self.choose = functools.lru_cache(maxsize=4096)(self._choose)

    def bind(self, shape, device, dtype) -> None:
        for b in self.backends.values():
            b.bind(shape, device, dtype)

    def _choose(self, tokens: int, sequences: int, skewed: bool = False) -> AttentionBackend:
        """``skewed``: padding to the longest would more than double the
        work, which the table's cells (lengths within 0.5-1.5x of their
        mean) never measured, so padding backends are left out."""
        fits = {n: b for n, b in self.backends.items()
                if (b.max_tokens is None or tokens <= b.max_tokens) and not (skewed and b.pads_to_longest)}
        for name in self.table.rank(self.shape, self.dtype, tokens, sequences):
            if name in fits:
                return fits[name]
        return next(iter(fits.values()), self.default)

    def plan(self, cu_seqlens, lengths, max_seqlen, causal) -> AttnPlan:
        tokens = sum(lengths)
        skewed = self.skew_aware and len(lengths) * max_seqlen > 2 * tokens
        return self.choose(tokens, len(lengths), skewed).plan(cu_seqlens, lengths, max_seqlen, causal)

    def attend(self, q, k, v, plan: AttnPlan, scale: float) -> torch.Tensor:
        assert plan.backend is not None  # plan() made it: the chosen backend's plan names that backend
        return plan.backend.attend(q, k, v, plan, scale)


def select_backend(
    shape: AttnShape, device: torch.device, dtype: torch.dtype, name: str = "auto",
    table: SelectionTable | None = None,
) -> AttentionBackend:
    """The named backend, or for "auto" every backend that supports the
    shape (on CUDA: every capture-safe one, when there is one), chosen per
    step by the device's selection table."""
    device = torch.device(device)
    if name != "auto":
        backend = get_backend(name, device)
        if not backend.supports(shape, device, dtype):
            raise ValueError(f"attention backend {name!r} does not support {shape} in {dtype} on {device}")
        backend.bind(shape, device, dtype)
        return backend
    backends = available_backends(device)
    usable = [backends[n] for n in DEFAULT_ORDER if n in backends and backends[n].supports(shape, device, dtype)]
    if not usable:
        raise ValueError(f"no attention backend supports {shape} in {dtype} on {device}")
    if device.type == "cuda" and any(b.capture_safe for b in usable):
        # CUDA graphs remove far more host time than the few percent that
        # separate kernels, so "auto" keeps to kernels a graph can hold, and
        # of those not one that pads every sequence to the longest: in a
        # graph the longest is the whole bucket.
        usable = [b for b in usable if b.capture_safe]
        if any(not b.pads_to_longest for b in usable):
            usable = [b for b in usable if not b.pads_to_longest]
    if table is None:
        table = SelectionTable.load(device_kind(device))
    chosen = usable[0] if len(usable) == 1 else SelectingBackend(usable, table, shape, dtype, device)
    chosen.bind(shape, device, dtype)
    return chosen
