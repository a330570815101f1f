"""Ragged attention behind one interface.

A backend turns per-batch layout (``cu_seqlens``) into a plan once per step,
then every layer calls ``attend(q, k, v, plan)`` on flat ``[T, heads, dim]``
tensors. Backends for GPUs are optional: a missing one is simply not listed.
"""

from __future__ import annotations

from .base import AttentionBackend, AttnPlan, AttnShape
from .registry import available_backends, get_backend, select_backend

__all__ = [
    "AttentionBackend",
    "AttnPlan",
    "AttnShape",
    "available_backends",
    "get_backend",
    "select_backend",
]
