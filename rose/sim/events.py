"""The simulated device's event: complete once its step's modelled end has
passed and the step's rows are in their host buffer.

A CUDA event is a pointer (8-byte aligned, so its low bit is 0). A simulated
event owns a two-word slot and its handle is the slot's address with the
low bit set. Word 0: the modelled end in ns of ``CLOCK_MONOTONIC``
(Python's ``time.monotonic_ns`` clock). Word 1: 0 while the rows are being
written, then ``code << 1 | 1`` (code 0 = success, else the CUDA error code
the step reports). Tulip's completion thread queries both kinds of event in
one wait loop (``tulip/src/event.rs``, which reads a simulated slot through
``sim_event.rs``); Python code waits through ``query()``, as on a
``torch.cuda.Event``. The slot lives as long as the event, which the step's
LazyTensor keeps until it is released.
"""

from __future__ import annotations

import ctypes
import time

TAG = 1
CODE_BITS = 10

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


_Slot = ctypes.c_int64 * 2


class SimEvent:
    """Quacks like ``torch.cuda.Event`` where ROSE uses one: ``query()``
    (raising torch's RuntimeError text for a failed step) and
    ``cuda_event`` (the handle a host outside Python waits on)."""

    __slots__ = ("_slot", "cuda_event", "code")

    def __init__(self, end_ns: int, code: int = 0):
        if not 0 <= code < (1 << CODE_BITS):
            raise ValueError(f"CUDA error code {code} does not fit a simulated event")
        # A ctypes array: malloc'd (16-byte aligned), and far cheaper to make
        # and to address than a NumPy one, on every step.
        self._slot = _Slot(end_ns, 0)
        self.cuda_event = ctypes.addressof(self._slot) | TAG
        self.code = code

    @property
    def end_ns(self) -> int:
        return self._slot[0]

    def written(self) -> None:
        """The step's rows are in their host buffer (or, for a failed step,
        there are none to write): complete once its end has passed."""
        self._slot[1] = (self.code << 1) | 1

    def query(self) -> bool:
        state = self._slot[1]
        if not state & 1 or time.monotonic_ns() < self._slot[0]:
            return False
        if self.code:
            raise RuntimeError(f"CUDA error: {CUDA_MESSAGES.get(self.code, 'error')} (simulated device, "
                               f"code {self.code})")
        return True
