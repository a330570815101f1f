"""LazyTensor: a step's output on its way to the host.

On CUDA the output is copied asynchronously into a page-locked host buffer
on the compute stream, and one event is recorded after the copy, so one
event covers both "the forward pass finished" and "the bytes are on the
host". A host may read ``host_ptr()`` once ``event_handle`` has completed; a
host outside Python waits on it through the CUDA driver, without the GIL.
On the CPU the output is already on the host and ``event_handle`` is 0.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .errors import DeviceError, is_sticky_cuda_error

if TYPE_CHECKING:  # the pool is handed in; this module needs only its release()
    from .step.staging import Buffer, PinnedPool

# Seconds a Python-side wait may take (the same variable bounds Tulip's).
SYNC_TIMEOUT_S = float(os.environ.get("TULIP_EVENT_TIMEOUT_S") or 120)
# How long a wait spins before it starts sleeping between polls (as Tulip's
# Rust wait does): steps up to this long are seen at once.
SPIN_S = 0.02


@dataclass(frozen=True)
class StepInfo:
    """How a step ran (for metrics)."""

    mode: str  # "eager", "warmup", "capture", "replay"
    tokens: int  # real tokens in the batch
    padded_tokens: int  # tokens computed, filler included
    capture_seconds: float = 0.0


class LazyTensor:
    """A float32 ``rows x cols`` matrix that is, or will soon be, on the host."""

    __slots__ = ("_host", "_event", "_pool", "_buffers", "rows", "cols", "info")

    def __init__(self, host: torch.Tensor, rows: int, cols: int, *, event=None,
                 pool: PinnedPool | None = None, buffers: tuple[Buffer, ...] = (),
                 info: StepInfo | None = None):
        if host.dtype != torch.float32 or host.device.type != "cpu" or not host.is_contiguous():
            raise ValueError("LazyTensor holds a contiguous float32 host tensor")
        if host.numel() < rows * cols:
            raise ValueError(f"host buffer holds {host.numel()} floats, need {rows * cols}")
        self._host = host
        self._event = event
        self._pool = pool
        self._buffers = buffers
        self.rows = rows
        self.cols = cols
        self.info = info

    @classmethod
    def ready(cls, out: torch.Tensor, info: StepInfo | None = None) -> "LazyTensor":
        """Wraps an output already on the host (the CPU path)."""
        if out.dtype != torch.float32 or not out.is_contiguous():
            out = out.to(torch.float32).contiguous()
        if out.dim() == 1:
            out = out.unsqueeze(1)
        rows, cols = out.shape
        return cls(out.view(-1), rows, cols, info=info)

    @classmethod
    def staged(cls, buf: Buffer, rows: int, cols: int, event, pool: PinnedPool,
               staging: tuple[Buffer, ...], info: StepInfo | None) -> LazyTensor:
        """An output on its way into pool buffer ``buf`` (whose float32 view
        holds ``rows * cols`` values): the step's own path, so nothing is
        checked again. ``staging`` (the step's input buffers) returns to the
        pool with ``buf``, once ``event`` has completed."""
        lazy = cls.__new__(cls)
        lazy._host, lazy._event, lazy._pool, lazy._buffers = buf.floats, event, pool, (buf, *staging)
        lazy.rows, lazy.cols, lazy.info = rows, cols, info
        return lazy

    @classmethod
    def copy_from_device(cls, out: torch.Tensor, pool: PinnedPool, staging: tuple[Buffer, ...] = (),
                         info: StepInfo | None = None) -> LazyTensor:
        """Queues an async copy of a device ``[rows, cols]`` float32 output into
        a pinned buffer and records the event after it. ``staging`` are pinned
        input buffers this step read from; they return to the pool with the
        output buffer, once the event has completed."""
        rows, cols = out.shape
        buf = pool.acquire(rows * cols * 4)
        buf.floats[: rows * cols].copy_(out.reshape(-1), non_blocking=True)
        event = torch.cuda.Event(blocking=True)
        event.record()
        return cls.staged(buf, rows, cols, event, pool, staging, info)

    def describe(self) -> tuple[int, int, int, int, str, int, float]:
        """Everything a host outside Python reads, in one call: (host_ptr,
        rows, cols, event_handle, mode, padded_tokens, capture_seconds)."""
        info = self.info
        event = 0 if self._event is None else self._event.cuda_event
        if info is None:
            return self._host.data_ptr(), self.rows, self.cols, event, "eager", 0, 0.0
        return (self._host.data_ptr(), self.rows, self.cols, event, info.mode, info.padded_tokens,
                info.capture_seconds)

    def host_ptr(self) -> int:
        """Address of the first float (valid until ``release``)."""
        return self._host.data_ptr()

    @property
    def nbytes(self) -> int:
        return self.rows * self.cols * 4

    @property
    def event_handle(self) -> int:
        """The raw ``cudaEvent_t`` to wait on, or 0 when already complete."""
        if self._event is None:
            return 0
        return self._event.cuda_event

    @property
    def mode(self) -> str:
        return self.info.mode if self.info else "eager"

    @property
    def padded_tokens(self) -> int:
        return self.info.padded_tokens if self.info else 0

    @property
    def capture_seconds(self) -> float:
        return self.info.capture_seconds if self.info else 0.0

    def synchronize(self, timeout: float = SYNC_TIMEOUT_S) -> None:
        """Blocks until the bytes are on the host (from Python), at most
        ``timeout`` seconds: the event is polled, so a hung kernel raises
        ``DeviceError`` instead of blocking its caller (and shutdown) forever."""
        if self._event is None:
            return
        start = time.monotonic()
        pause = 1e-5
        while not _query(self._event):
            waited = time.monotonic() - start
            if waited >= timeout:
                raise DeviceError(f"a step's CUDA event did not complete within {timeout:.0f}s (hung kernel?)")
            # Short steps are seen at once (a spin that still lets other
            # Python threads run); longer ones are polled with a back-off.
            if waited < SPIN_S:
                time.sleep(0)
                continue
            time.sleep(pause)
            pause = min(pause * 2, 2e-4)

    def tensor(self) -> torch.Tensor:
        """The ``[rows, cols]`` host tensor, after waiting. Copy it before
        ``release()``: the buffer is reused afterwards."""
        self.synchronize()
        return self._host[: self.rows * self.cols].view(self.rows, self.cols)

    def release(self) -> None:
        """Gives the buffers back to their pool. Safe to call more than once;
        the pool reuses them only after the event has completed."""
        pool, self._pool = self._pool, None
        if pool is not None:
            for b in self._buffers:
                pool.release(b, self._event)
        self._buffers = ()


def _query(event) -> bool:
    try:
        return event.query()
    except RuntimeError as e:  # torch.AcceleratorError is a RuntimeError
        if is_sticky_cuda_error(e):
            raise DeviceError(str(e)) from e
        raise
