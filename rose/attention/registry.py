"""Which backends exist here, and which one to use for a shape."""

from __future__ import annotations

import torch

from .base import AttentionBackend, AttnShape
from .sdpa import SdpaBackend


def available_backends() -> dict[str, AttentionBackend]:
    """Every backend that imports on this machine, by name."""
    return {"sdpa": SdpaBackend()}


def get_backend(name: str) -> AttentionBackend:
    backends = available_backends()
    if name not in backends:
        raise ValueError(
            f"attention backend {name!r} is not available here "
            f"(available: {', '.join(sorted(backends))})"
        )
    return backends[name]


def select_backend(
    shape: AttnShape, device: torch.device, dtype: torch.dtype, name: str = "auto"
) -> AttentionBackend:
    """The named backend, or for "auto" the first one that supports the shape."""
    if name != "auto":
        backend = get_backend(name)
        if not backend.supports(shape, device, dtype):
            raise ValueError(f"attention backend {name!r} does not support {shape} on {device}")
        return backend
    for backend in available_backends().values():
        if backend.supports(shape, device, dtype):
            return backend
    raise ValueError(f"no attention backend supports {shape} on {device}")
