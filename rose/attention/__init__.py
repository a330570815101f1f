"""Ragged attention behind one interface.

A backend turns per-batch layout (``cu_seqlens``) into a plan once per step,
then every layer calls ``attend(q, k, v, plan, scale)`` on flat
``[T, heads, dim]`` tensors. Backends for GPUs are optional: a missing one
is simply not listed. ``select_backend(..., "auto")`` picks per step from a
measured selection table (``tables/<device>.json``).
"""

from __future__ import annotations

from .base import AttentionBackend, AttnPlan, AttnShape
from .registry import DEFAULT_ORDER, SelectingBackend, available_backends, get_backend, select_backend
from .selection import SelectionTable, device_kind

__all__ = [
    "DEFAULT_ORDER",
    "AttentionBackend",
    "AttnPlan",
    "AttnShape",
    "SelectingBackend",
    "SelectionTable",
    "available_backends",
    "device_kind",
    "get_backend",
    "select_backend",
]
