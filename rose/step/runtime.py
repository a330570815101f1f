"""What the runner asks of a runtime, and what it counts.

A runtime is one way to run a step: ONNX Runtime or the bfloat16 twin on
the CPU (``rose/cpu/``), a configuration's static buffers and CUDA graph
(``static.py``), the eager forward (``eager.py``). The runner offers each
step to its runtimes in order; the first that takes it returns the
step's staged output, a LazyTensor. Each runtime names the step labels it
reports (``StepInfo.mode``), which the host counts (Tulip's
``tulip_steps_total{mode}``) and refuses when undeclared.
"""

from __future__ import annotations

from typing import Protocol

from ..interface import Batch
from ..lazy import LazyTensor, StepInfo


class Runtime(Protocol):
    """One way to run a step."""

    # The step labels this runtime reports (``LazyTensor.info.mode``).
    labels: tuple[str, ...]
    # Whether its output is the model's own computation in the engine's
    # dtype: what a gated runtime's first step is compared against.
    reference: bool

    def run(self, batch: Batch) -> LazyTensor | None:
        """The step's staged output, or None when this runtime does not
        take it (the runner offers it to the next)."""
        ...

    def observe(self, batch: Batch, lazy: LazyTensor) -> None:
        """A step this runtime declined, as a reference runtime ran it (a
        gated runtime keeps a cold bucket's first step for its gate)."""
        ...


class RunnerStats:
    """Steps by label, filler tokens computed, seconds spent capturing."""

    def __init__(self, labels: tuple[str, ...]):
        self.steps: dict[str, int] = dict.fromkeys(labels, 0)
        self.capture_seconds = 0.0
        self.padded_tokens = 0

    def count(self, info: StepInfo) -> None:
        self.steps[info.mode] += 1
        self.padded_tokens += info.padded_tokens - info.tokens
        self.capture_seconds += info.capture_seconds
