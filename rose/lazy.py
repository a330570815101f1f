"""LazyTensor: a step's output on its way to the host.

On CUDA, the output is copied asynchronously into a page-locked host buffer
on the compute stream and one event is recorded after the copy, so one event
covers both "the forward pass finished" and "the bytes are on the host". The
host may read ``host_ptr()`` once ``event_handle`` has completed (a host
outside Python waits on it through the CUDA runtime, without the GIL).
On the CPU the output is already on the host: ``event_handle`` is 0.
"""

from __future__ import annotations

import torch


class LazyTensor:
    """A float32 ``rows x cols`` matrix that is, or will soon be, on the host."""

    __slots__ = ("_host", "_event", "_on_release", "rows", "cols")

    def __init__(self, host: torch.Tensor, event=None, on_release=None):
        if host.dtype != torch.float32 or host.device.type != "cpu" or not host.is_contiguous():
            raise ValueError("LazyTensor holds a contiguous float32 host tensor")
        self._host = host
        self._event = event
        self._on_release = on_release
        self.rows = host.shape[0] if host.dim() > 0 else 1
        self.cols = host.shape[1] if host.dim() > 1 else 1

    @classmethod
    def ready(cls, out: torch.Tensor) -> "LazyTensor":
        """Wraps an output already on the host (the CPU path)."""
        out = out.detach().to(torch.float32).contiguous()
        if out.dim() == 1:
            out = out.unsqueeze(1)
        return cls(out)

    def host_ptr(self) -> int:
        """Address of the first float (valid while this object is alive)."""
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

    def synchronize(self) -> None:
        """Blocks until the bytes are on the host (from Python)."""
        if self._event is not None:
            self._event.synchronize()

    def tensor(self) -> torch.Tensor:
        """The host tensor, after waiting. Copy it before ``release()``."""
        self.synchronize()
        return self._host

    def release(self) -> None:
        """Gives the host buffer back to its pool; the data must not be read
        afterwards. Safe to call more than once."""
        if self._on_release is not None:
            cb, self._on_release = self._on_release, None
            cb(self._host, self._event)
