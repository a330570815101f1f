"""A pool of page-locked host buffers for asynchronous copies.

A buffer handed out by ``acquire`` is not handed out again until it has been
released *and* the event guarding its last copy has completed, so a copy
still in flight can never be overwritten. Buffers are kept per size class
(powers of two), so steady-state serving allocates nothing. Each buffer
comes with the views a step writes and reads through (int32 words, float32
values, as torch and as NumPy), made once with it: a view made per step
costs a torch dispatch each, on the latency-critical path.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import torch

_MIN_CLASS = 1 << 12  # bytes


def _size_class(nbytes: int) -> int:
    return max(_MIN_CLASS, 1 << (max(nbytes, 1) - 1).bit_length())


class Buffer:
    """One pool buffer (``tensor``: uint8, on the host) and its views."""

    __slots__ = ("tensor", "words", "floats", "np_words", "np_floats", "size")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.size = tensor.numel()
        self.words = tensor.view(torch.int32)
        self.floats = tensor.view(torch.float32)
        self.np_words = self.words.numpy()
        self.np_floats = self.floats.numpy()

    def data_ptr(self) -> int:
        return self.tensor.data_ptr()

    def numel(self) -> int:
        return self.size


class PinnedPool:
    """Byte buffers by size class. ``pin=False`` gives ordinary host memory
    (used where there is no CUDA, so the same logic runs everywhere)."""

    def __init__(self, pin: bool | None = None):
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._free: dict[int, list[Buffer]] = defaultdict(list)
        # Released, but the event guarding the last copy may still be pending.
        self._pending: list[tuple[Buffer, object]] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers ever created
        self.in_use = 0  # handed out and not yet released

    def acquire(self, nbytes: int) -> Buffer:
        """A buffer of at least ``nbytes`` that no copy is using."""
        size = _size_class(nbytes)
        with self._lock:
            self._reclaim()
            free = self._free[size]
            if free:
                buf = free.pop()
            else:
                buf = Buffer(torch.empty(size, dtype=torch.uint8, pin_memory=self.pin))
                self.allocated += 1
            self.in_use += 1
        return buf

    def release(self, buf: Buffer, event=None) -> None:
        """Returns ``buf``; it becomes reusable once ``event`` (if any) has
        completed."""
        with self._lock:
            self.in_use -= 1
            if event is None or _done(event):
                self._free[buf.size].append(buf)
            else:
                self._pending.append((buf, event))

    def _reclaim(self) -> None:
        if not self._pending:
            return
        still = []
        for buf, event in self._pending:
            if _done(event):
                self._free[buf.size].append(buf)
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


def _done(event) -> bool:
    """Whether no copy can still be writing a buffer the event guards. A
    step that failed on the device raises from its event's query: its copy
    is over too, so its buffers are free again (a pool that kept them would
    lose two buffers per failed step)."""
    try:
        return event.query()
    except RuntimeError:
        return True
