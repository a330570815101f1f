"""A pool of page-locked host buffers for asynchronous copies.

A buffer handed out by ``acquire`` is not handed out again until it has been
released *and* the event guarding its last copy has completed, so a copy
still in flight can never be overwritten. Buffers are kept per size class
(powers of two), so steady-state serving allocates nothing.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import torch

_MIN_CLASS = 1 << 12  # bytes


def _size_class(nbytes: int) -> int:
    return max(_MIN_CLASS, 1 << (max(nbytes, 1) - 1).bit_length())


class PinnedPool:
    """Byte buffers by size class. ``pin=False`` gives ordinary host memory
    (used where there is no CUDA, so the same logic runs everywhere)."""

    def __init__(self, pin: bool | None = None):
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._free: dict[int, list[torch.Tensor]] = defaultdict(list)
        # Released, but the event guarding the last copy may still be pending.
        self._pending: list[tuple[torch.Tensor, object]] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers ever created
        self.in_use = 0  # handed out and not yet released

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of at least ``nbytes`` that no copy is using."""
        size = _size_class(nbytes)
        with self._lock:
            self._reclaim()
            free = self._free[size]
            if free:
                buf = free.pop()
            else:
                buf = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
                self.allocated += 1
            self.in_use += 1
        return buf

    def release(self, buf: torch.Tensor, event=None) -> None:
        """Returns ``buf``; it becomes reusable once ``event`` (if any) has
        completed."""
        with self._lock:
            self.in_use -= 1
            if event is None or event.query():
                self._free[buf.numel()].append(buf)
            else:
                self._pending.append((buf, event))

    def _reclaim(self) -> None:
        if not self._pending:
            return
        still = []
        for buf, event in self._pending:
            if event.query():
                self._free[buf.numel()].append(buf)
            else:
                still.append((buf, event))
        self._pending = still

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def free_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._free.values())
