"""The simulated device's event: readiness is the modelled end of a step.

A CUDA event is a pointer (8-byte aligned, so its low bit is 0). A simulated
event is a *tagged handle value* instead: low bit 1, then a 10-bit CUDA
error code (0 = none), then the modelled end time in microseconds of
``CLOCK_MONOTONIC`` (Python's ``time.monotonic_ns`` clock). Tulip's
completion thread waits on both kinds through the same call
(``tulip/src/cuda.rs``, which hands tagged handles to ``sim_event.rs``:
it sleeps until the end time without the GIL, then reports the code the way
``cuEventQuery`` would). Python code waits through ``query()``, as on a
``torch.cuda.Event``.
"""

from __future__ import annotations

import time

TAG = 1
CODE_BITS = 10
TIME_SHIFT = 1 + CODE_BITS

# The CUDA errors the simulated device can report, with torch's message
# for each (what ``rose.errors.is_sticky_cuda_error`` reads).
CUDA_MESSAGES = {
    2: "out of memory",
    400: "invalid resource handle",
    700: "an illegal memory access was encountered",
    710: "device-side assert triggered",
    719: "unspecified launch failure",
    999: "unknown error",
}


def encode(end_ns: int, code: int = 0) -> int:
    """The tagged handle of an event that completes at ``end_ns`` with
    ``code`` (0 = success)."""
    if not 0 <= code < (1 << CODE_BITS):
        raise ValueError(f"CUDA error code {code} does not fit a simulated event")
    end_us = -(-end_ns // 1000)  # rounded up: never ready before its end
    return (end_us << TIME_SHIFT) | (code << 1) | TAG


def decode(handle: int) -> tuple[int, int]:
    """(end in ns, error code) of a tagged handle."""
    if not handle & TAG:
        raise ValueError("not a simulated event handle")
    return (handle >> TIME_SHIFT) * 1000, (handle >> 1) & ((1 << CODE_BITS) - 1)


class SimEvent:
    """Quacks like ``torch.cuda.Event`` where ROSE uses one: ``query()``
    (raising torch's RuntimeError text for a failed step) and
    ``cuda_event`` (the handle a host outside Python waits on)."""

    __slots__ = ("cuda_event", "end_ns", "code")

    def __init__(self, end_ns: int, code: int = 0):
        self.cuda_event = encode(end_ns, code)
        self.end_ns, self.code = decode(self.cuda_event)

    def query(self) -> bool:
        if time.monotonic_ns() < self.end_ns:
            return False
        if self.code:
            raise RuntimeError(f"CUDA error: {CUDA_MESSAGES.get(self.code, 'error')} (simulated device, "
                               f"code {self.code})")
        return True
