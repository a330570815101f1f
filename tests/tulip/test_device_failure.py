"""A device failure ends the replica: ROSE raises DeviceError for sticky
CUDA errors (not for other errors), and Tulip's launcher turns it into an
exit with status 70 instead of a replica that keeps failing fast."""

from __future__ import annotations

import pytest

from rose import DeviceError
from rose.errors import is_sticky_cuda_error
from tulip.launcher import EXIT_DEVICE_FAILURE, exit_on_device_error


class FakeEngine:
    def __init__(self, error: Exception | None):
        self.error = error

    def step(self, batch):
        if self.error is not None:
            raise self.error
        return ("stepped", batch)

    def step_arena(self, arena, sequences, tokens, kind):
        """Tulip's path into the engine."""
        return self.step(arena)


def exits(code):
    raise SystemExit(code)


def test_a_device_error_exits_with_its_status():
    engine = FakeEngine(DeviceError("CUDA error: an illegal memory access was encountered"))
    exit_on_device_error(engine, exit=exits)
    with pytest.raises(SystemExit) as e:
        engine.step("batch")
    assert e.value.code == EXIT_DEVICE_FAILURE == 70


def test_the_hosts_step_path_exits_too():
    engine = FakeEngine(DeviceError("CUDA error: unspecified launch failure"))
    exit_on_device_error(engine, exit=exits)
    with pytest.raises(SystemExit) as e:
        engine.step_arena(bytearray(4), 1, 1, "dense")
    assert e.value.code == EXIT_DEVICE_FAILURE


def test_other_errors_and_results_pass_through():
    ok = FakeEngine(None)
    exit_on_device_error(ok, exit=exits)
    assert ok.step("b") == ("stepped", "b")
    bad = FakeEngine(ValueError("bad batch"))
    exit_on_device_error(bad, exit=exits)
    with pytest.raises(ValueError, match="bad batch"):
        bad.step("b")


@pytest.mark.parametrize("text, sticky", [
    ("CUDA error: an illegal memory access was encountered", True),
    ("CUDA error: unspecified launch failure", True),
    ("CUDA error: device-side assert triggered", True),
    ("CUDA error: out of memory", False),
    ("CUDA error: invalid argument", False),
    ("illegal memory access", False),  # not a CUDA error report
])
def test_sticky_cuda_errors_are_recognised(text, sticky):
    assert is_sticky_cuda_error(RuntimeError(text)) is sticky
