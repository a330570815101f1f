"""A runtime that takes a CPU step's token bucket over once it is built and
gated: what every CPU runtime (``onnx.py``, ``int8.py``, ``bf16.py``)
shares, mirroring the lazily captured CUDA graphs of
``rose/step/graphs.py``.

A bucket's first step runs eagerly (float32) and its input and output are
kept; a background thread builds the runtime once, runs it on that same
step and compares: every row must reach a cosine of ``FIDELITY`` with the
eager output, or the bucket is left for good to the runtimes after it (the
float32 ones: ONNX Runtime's float32 session after its int8 copy, else
eager). The request path only calls ``run`` and ``observe``, and neither
ever waits for a build.

A runtime class also says whether it can run for an engine at all
(``refusal``, one line a log can show); ``rose/cpu/__init__.py`` lists the
runtimes and selects them.
"""

from __future__ import annotations

import abc
import enum
import functools
import logging
import os
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

import numpy as np
import torch

from ..attention import AttentionBackend
from ..config import ModelSpec
from ..interface import Batch, OutputKind
from ..lazy import LazyTensor, StepInfo

log = logging.getLogger("rose.cpu")

# Cosine every row of a bucket's first step must reach against eager.
FIDELITY = 0.999


class State(enum.Enum):
    COLD = "cold"  # never seen
    PENDING = "pending"  # ran eagerly once; waiting for the build and the gate
    READY = "ready"  # runs on the runtime
    FAILED = "failed"  # the gate or the build failed: always eager


def min_cosine(got: np.ndarray, want: np.ndarray) -> float:
    """The smallest row-wise cosine between two outputs (-1 when their
    shapes differ)."""
    a, b = got.astype(np.float64), want.astype(np.float64)
    if a.shape != b.shape:
        return -1.0
    if a.ndim == 1:
        a, b = a[:, None], b[:, None]
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    both_zero = (na == 0) & (nb == 0)  # e.g. a zero-dimension tail: equal
    cos = np.where(both_zero, 1.0, (a * b).sum(axis=1) / np.maximum(na * nb, 1e-30))
    return float(cos.min()) if cos.size else 1.0


def power_of_two_bucket(tokens: int, min_bucket: int) -> int:
    """The smallest power-of-two multiple of ``min_bucket`` holding ``tokens``."""
    b = min_bucket
    while b < tokens:
        b *= 2
    return b


def power_of_two_buckets(min_bucket: int, up_to: int) -> list[int]:
    """Every bucket from ``min_bucket`` to the one holding ``up_to``."""
    out = [min_bucket]
    while out[-1] < up_to:
        out.append(out[-1] * 2)
    return out


@dataclass(frozen=True)
class Context:
    """What a CPU runtime may know of the engine it would serve."""

    spec: ModelSpec
    kind: OutputKind  # the model's primary output kind
    dimension: int
    device: torch.device
    dtype: torch.dtype
    backend: AttentionBackend
    packed: int  # linear layers packed for oneDNN (rose/models/packed.py)


def float32_cpu_refusal(ctx: Context) -> str | None:
    """Why no gated runtime can stand in for this engine's steps, or None:
    the gate compares against float32 CPU steps."""
    if ctx.device.type != "cpu" or ctx.dtype != torch.float32:
        return f"it takes float32 CPU steps only (this engine: {ctx.dtype} on {ctx.device})"
    if ctx.spec.model_type == "null":
        return "the null model computes nothing"
    return None


# What a gated runtime builds once and runs its steps on (``_load``).
R = TypeVar("R")


class GatedRuntime(abc.ABC, Generic[R]):
    """Bucket states, the background builder and the gate of one runtime.
    Subclasses name themselves (``name``: the step label, ``title``: how
    the log names them), say why they cannot serve an engine
    (``refusal``), which steps they take (``key``), build the runtime once
    (``_load``) and run a step on it (``_execute``); their ``settings``
    give ``warm_steps()``, the step sizes that reach every bucket."""

    name: ClassVar[str]  # the step label (LazyTensor.info.mode) and the selection's key
    title: ClassVar[str]  # how the log names it
    Settings: ClassVar[type]  # its settings class (what selects it)
    nice = 0  # the builder thread's niceness: behind the server's own steps
    reference = False  # its output is not the engine's own float32 computation

    @classmethod
    @abc.abstractmethod
    def refusal(cls, ctx: Context, settings, beside: tuple[str, ...]) -> str | None:
        """Why this runtime cannot serve the engine of ``ctx``, or None.
        ``beside``: the names of the other runtimes the engine gets."""

    def __init__(self, ctx: Context, settings):
        self.kind = ctx.kind
        self.settings = settings
        self.labels: tuple[str, ...] = (self.name,)
        self._states: dict[int, State] = {}
        self._lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._runtime: R | None = None
        self._broken: str | None = None  # why the runtime cannot be built for this model
        self.build_seconds = 0.0
        self.gates: dict[int, float] = {}  # bucket -> min cosine at its gate

    @abc.abstractmethod
    def key(self, batch: Batch) -> int | None:
        """The bucket of a step this runtime may take, or None."""

    @abc.abstractmethod
    def _load(self) -> R:
        """Builds the runtime (once, on the builder thread)."""

    @abc.abstractmethod
    def _execute(self, batch: Batch) -> torch.Tensor:
        """Runs one step on the built runtime: float32 rows on the host."""

    def state(self, bucket: int) -> State:
        return self._states.get(bucket, State.COLD)

    def counts(self) -> dict[str, int]:
        """Buckets by state: those its settings list (``buckets()``, what
        warming reaches) and any other a step has reached; what Tulip's
        metrics and ``Info`` show (``Engine.cpu_readiness``)."""
        with self._lock:
            seen = Counter(s.value for s in self._states.values())
            cold = sum(1 for b in self.settings.buckets() if b not in self._states)
        return {s.value: 0 for s in State} | seen | {State.COLD.value: cold}

    def cached(self) -> bool:
        """Whether the runtime would be built from what is on disk alone,
        with nothing exported or converted (start-up warms such a runtime
        by default: ``Engine.warm(cached_only=True)``)."""
        return False

    def run(self, batch: Batch) -> LazyTensor | None:
        """The step's output when its bucket is ready, else None (a
        reference runtime runs it and this one ``observe``s it)."""
        bucket = self.key(batch)
        if bucket is None or self._states.get(bucket) is not State.READY:
            return None
        return LazyTensor.ready(self._execute(batch), _info(self.name, batch.layout.tokens))

    def run_ungated(self, batch: Batch) -> torch.Tensor | None:
        """A resolved step on the built runtime whatever its bucket's gate
        said, None before the build (benchmarks: what a refused bucket
        would have given, and in what time). Never on the request path."""
        return None if self._runtime is None else self._execute(batch)

    def observe(self, batch: Batch, lazy: LazyTensor) -> None:
        """A cold bucket's first step, as the engine ran it: kept for the
        bucket's gate, and its build queued."""
        bucket = self.key(batch)
        if bucket is not None and self._states.get(bucket, State.COLD) is State.COLD:
            self.offer(bucket, batch, lazy.tensor())

    def offer(self, bucket: int, batch: Batch, eager_out: torch.Tensor) -> None:
        """After an eager step of a cold bucket: keeps a copy of its input
        and output and queues the bucket's build (returns at once)."""
        with self._lock:
            if self._states.get(bucket, State.COLD) is not State.COLD:
                return
            self._states[bucket] = State.PENDING
            sample = Batch(batch.arena[: batch.layout.size].clone(), batch.layout, batch.kind, batch.resolved)
            self._jobs.put((bucket, sample, eager_out.detach().clone()))
            if self._thread is None:
                self._thread = threading.Thread(target=self._builder, name=f"rose-{self.name}", daemon=True)
                self._thread.start()

    def wait(self, timeout: float = 600.0) -> bool:
        """Blocks until every queued build is done (tests, benchmarks,
        start-up warming); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if State.PENDING not in self._states.values():
                    return True
            time.sleep(0.01)
        return False

    def _builder(self) -> None:
        """Builds queued buckets; ends when none has come for a while (a
        later cold bucket starts it again)."""
        if self.nice:
            try:  # Linux: per thread, and inherited by the threads it starts
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except OSError:
                pass
        while True:
            try:
                bucket, sample, want = self._jobs.get(timeout=5.0)
            except queue.Empty:
                with self._lock:  # jobs are queued under this lock
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            try:
                self._build(bucket, sample, want)
            except Exception:  # never let one bucket take the thread down
                log.exception("%s: bucket %d failed; it stays eager", self.title, bucket)
                self._set(bucket, State.FAILED)

    def _set(self, bucket: int, state: State) -> None:
        with self._lock:
            self._states[bucket] = state

    def _build(self, bucket: int, sample: Batch, want: torch.Tensor) -> None:
        if self._runtime is None and self._broken is None:
            started = time.perf_counter()
            try:
                self._runtime = self._load()
            except Exception as e:  # a family the runtime cannot take
                self._broken = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                log.warning("%s unavailable for this model, every step stays eager: %s", self.title, self._broken)
            self.build_seconds = time.perf_counter() - started
            if self._runtime is not None:
                log.info("%s built in %.1fs", self.title, self.build_seconds)
        if self._runtime is None:
            self._set(bucket, State.FAILED)
            return
        with torch.inference_mode():  # the host's threads have it on for good; this one has not
            got = self._execute(sample)
        cos = min_cosine(got.float().numpy(), want.float().numpy())
        self.gates[bucket] = cos
        bar = self.fidelity()
        if cos >= bar:
            self._set(bucket, State.READY)
            log.info("%s: bucket %d tokens ready (min cosine %.6f against eager)", self.title, bucket, cos)
        else:
            self._set(bucket, State.FAILED)
            log.warning("%s: bucket %d tokens fails the fidelity gate (min cosine %.6f < %s); it stays float32",
                        self.title, bucket, cos, bar)

    def fidelity(self) -> float:
        """The cosine a bucket's rows must reach: ``FIDELITY`` unless the
        settings name another (``fidelity``, an internal knob: tests raise
        it to 1.0 to see a real output refused)."""
        bar = getattr(self.settings, "fidelity", None)
        return FIDELITY if bar is None else bar


@functools.lru_cache(maxsize=8192)
def _info(mode: str, tokens: int) -> StepInfo:
    return StepInfo(mode, tokens, tokens)
