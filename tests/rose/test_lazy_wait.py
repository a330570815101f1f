"""LazyTensor waits from Python are bounded: a hung step and a sticky CUDA
error become DeviceError instead of a caller blocked forever (fake events
stand in for CUDA's on the CPU)."""

from __future__ import annotations

import pytest
import torch

from rose import DeviceError
from rose.lazy import LazyTensor


class FakeEvent:
    """query() answers False ``pending`` times, then True (or raises)."""

    def __init__(self, pending: int | None, error: Exception | None = None):
        self.pending, self.error, self.queries = pending, error, 0

    def query(self) -> bool:
        self.queries += 1
        if self.error is not None:
            raise self.error
        return self.pending is not None and self.queries > self.pending


def lazy_with(event) -> LazyTensor:
    return LazyTensor(torch.arange(6, dtype=torch.float32), 2, 3, event=event)


def test_a_pending_event_is_polled_until_complete():
    event = FakeEvent(pending=50)
    lazy = lazy_with(event)
    assert lazy.tensor().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert event.queries == 51


def test_an_event_that_never_completes_is_a_device_error():
    with pytest.raises(DeviceError, match="did not complete"):
        lazy_with(FakeEvent(pending=None)).synchronize(timeout=0.05)


def test_a_sticky_cuda_error_while_waiting_is_a_device_error():
    event = FakeEvent(pending=0, error=RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(DeviceError, match="illegal memory access"):
        lazy_with(event).synchronize()


def test_other_errors_while_waiting_are_not_device_errors():
    with pytest.raises(RuntimeError, match="invalid resource handle") as e:
        lazy_with(FakeEvent(pending=0, error=RuntimeError("CUDA error: invalid resource handle"))).synchronize()
    assert not isinstance(e.value, DeviceError)
