"""Runs steps: eagerly, or through a configuration's static buffers and its
lazily captured CUDA graph, and returns the output as a LazyTensor.

The host never waits here. On CUDA a step's inputs are packed into one pinned
buffer and copied to the device with one asynchronous copy; the output is
copied back asynchronously into another pinned buffer, and one event is
recorded after that copy. Both buffers return to the pool only after the
event has completed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from dataclasses import dataclass, field

import torch

from .attention import AttentionBackend
from .cpubf16 import Bf16Twin
from .cpufast import CpuFastPath
from .errors import DeviceError, is_sticky_cuda_error
from .gated import GatedRuntime
from .graphs import Action, Dispatcher, GraphKey, GraphSettings
from .interface import Batch, Layout, OutputKind
from .layout import repack, resolve_defaults, rows_for, step_inputs
from .lazy import LazyTensor, StepInfo
from .models import EmbeddingModel
from .pinned import PinnedPool
from .threads import ThreadBudget

log = logging.getLogger("rose.graphs")

# A step's mode when the bfloat16 twin ran it (rose/cpubf16.py).
BF16 = "bf16"


@dataclass
class _Entry:
    """One configuration's static input arena, output and graph."""

    layout: Layout
    arena: torch.Tensor
    graph: torch.cuda.CUDAGraph | None = None
    out: torch.Tensor | None = None


@dataclass
class RunnerStats:
    steps: dict[str, int] = field(default_factory=lambda: {**{a.value: 0 for a in Action}, BF16: 0})
    capture_seconds: float = 0.0
    padded_tokens: int = 0


class Runner:
    """Executes steps for one model on one device."""

    def __init__(self, model: EmbeddingModel, device: torch.device, backend: AttentionBackend,
                 dimension: int, normalize_default: bool, settings: GraphSettings | None = None,
                 graphs: bool = True, static_on_cpu: bool = False, fast: CpuFastPath | None = None,
                 twin: Bf16Twin | None = None):
        self.model = model
        self.device = device
        self.backend = backend
        self.dimension = dimension
        self.normalize_default = normalize_default
        self.cuda = device.type == "cuda"
        if self.cuda and device.index is not None:
            # Kernels, the pinned copies and the event go to the current
            # device: with cuda:N, N > 0, that has to be N (see ``run``).
            # Plain "cuda" means the current device, already right.
            torch.cuda.set_device(device)
        # Static buffers on the CPU run the same bookkeeping without graphs,
        # so the path can be tested where there is no GPU. A backend that pads
        # every sequence to the longest would, at a bucket's fixed max length,
        # pad every sequence to the whole bucket: it stays eager.
        graph_ok = backend.capture_safe and not backend.pads_to_longest
        use_static = (self.cuda and graphs and graph_ok) or (not self.cuda and static_on_cpu)
        self.dispatcher = Dispatcher(settings or GraphSettings(), enabled=use_static)
        self.pool = PinnedPool(pin=self.cuda)
        self.stats = RunnerStats()
        self._entries: dict[GraphKey, _Entry] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if self.cuda else None
        self.threads = None if self.cuda else ThreadBudget()
        # Small CPU steps on ONNX Runtime (rose/cpufast.py), the others on
        # the bfloat16 twin (rose/cpubf16.py), once their bucket is gated.
        self.fast = None if self.cuda else fast
        self.twin = None if self.cuda else twin
        self._host_thread = threading.local()
        if self.cuda and graphs and not graph_ok:
            log.warning("attention backend %s is not capture-safe or pads to the longest sequence: CUDA graphs "
                        "are off", backend.name)

    def run(self, batch: Batch) -> LazyTensor:
        # The current device is per thread, and the host may call from
        # another thread than the one that built the engine.
        with torch.inference_mode(), _on(self.device):
            return self._run(batch)

    def run_on_host_thread(self, batch: Batch) -> LazyTensor:
        """``run`` for a host's own threads, which only ever run steps: they
        enter inference mode and select the device once, for good."""
        if not getattr(self._host_thread, "ready", False):
            # Never exited: the guard lives as long as the thread.
            self._host_thread.inference = torch._C._InferenceMode(True)
            self._host_thread.inference.__enter__()
            # Plain "cuda" means the current device (as in ``__init__``).
            if self.cuda and self.device.index is not None:
                torch.cuda.set_device(self.device)
            self._host_thread.ready = True
        return self._run(batch)

    def _run(self, batch: Batch) -> LazyTensor:
        resolve_defaults(batch, self.dimension, self.normalize_default)
        if self.threads is not None:
            self.threads.apply(batch.layout.real_tokens)
        if self.fast is not None or self.twin is not None:
            lazy = self._gated(batch)
            if lazy is not None:
                return lazy
        key = self.dispatcher.key(batch.kind, batch.num_sequences, batch.num_tokens)
        action = self.dispatcher.hit(key)
        try:
            if action is Action.EAGER:
                return self._eager(batch)
            return self._static(batch, key, action)
        except RuntimeError as e:
            if is_sticky_cuda_error(e):
                raise DeviceError(f"the CUDA context is unusable after: {e}") from e
            raise

    def capture(self, key: GraphKey) -> None:
        """Warms up and captures one configuration now (for operators who
        prefer paying capture at start-up)."""
        if not self.dispatcher.enabled:
            raise ValueError("CUDA graphs are not enabled on this engine")
        n, t = key.sequences, key.tokens - 1
        if n > t:
            raise ValueError(f"{key}: more sequences than tokens")
        lengths = [t // n + (1 if i < t % n else 0) for i in range(n)]
        batch = Batch.from_lists([[1] * k for k in lengths], key.kind)
        for _ in range(2):
            out = self.run(batch)
            out.synchronize()
            out.release()

    # The CPU's gated runtimes: ONNX Runtime, then the bfloat16 twin, for a
    # step whose bucket is ready; else eager, and a cold bucket's eager step
    # is handed to its builds.

    def _gated(self, batch: Batch) -> LazyTensor | None:
        """The step on a ready runtime, or eager (and offered to the
        runtimes that take it); None when no runtime takes it at all."""
        takers: list[tuple[GatedRuntime, int]] = []
        for runtime, mode in ((self.fast, Action.REPLAY.value), (self.twin, BF16)):
            bucket = runtime.key(batch) if runtime is not None else None
            if bucket is None:
                continue
            out = runtime.run(bucket, batch)
            if out is not None:
                # A fast-path step is reported as a replay: a prebuilt
                # whole-model runtime, as a CUDA graph is on a GPU.
                self._count_mode(mode, batch.layout)
                return LazyTensor.ready(out, _gated_info(mode, batch.layout.tokens))
            takers.append((runtime, bucket))
        if not takers:
            return None
        lazy = self._eager(batch)
        for runtime, bucket in takers:
            runtime.offer(bucket, batch, lazy.tensor())  # only a cold bucket keeps it
        return lazy

    # Eager: exact shapes, no padding.

    def _eager(self, batch: Batch) -> LazyTensor:
        layout = batch.layout
        info = _eager_info(layout.real_tokens, layout.tokens)
        self._count(Action.EAGER, layout)
        lengths = batch.lengths
        if not self.cuda:
            out = self._forward(batch.kind, batch.arena, layout, lengths, max(lengths))
            return LazyTensor.ready(out, info)
        staging = self.pool.acquire(layout.size * 4)
        host = staging.view(torch.int32)[: layout.size]
        host.copy_(batch.arena[: layout.size])
        arena = torch.empty(layout.size, dtype=torch.int32, device=self.device)
        arena.copy_(host, non_blocking=True)
        out = self._forward(batch.kind, arena, layout, lengths, max(lengths))
        return LazyTensor.copy_from_device(_f32(out), self.pool, (staging,), info)

    # Static buffers: warm-up, capture, replay.

    def _static(self, batch: Batch, key: GraphKey, action: Action) -> LazyTensor:
        entry = self._entries.get(key)
        if entry is None:
            layout = Layout.of(key.sequences, key.tokens - 1, key.tokens)
            arena = torch.zeros(layout.size, dtype=torch.int32, device=self.device)
            entry = self._entries[key] = _Entry(layout, arena)
        layout = Layout.of(batch.num_sequences, batch.num_tokens, key.tokens)
        lengths = [*batch.lengths, layout.tokens - layout.real_tokens]
        staging = None
        if self.cuda:
            staging = self.pool.acquire(layout.size * 4)
            host = staging.view(torch.int32)[: layout.size]
            repack(batch, layout, host, self.dimension)
            entry.arena.copy_(host, non_blocking=True)
        else:
            repack(batch, layout, entry.arena, self.dimension)

        capture_s = self._capture(entry, key, lengths) if action is Action.CAPTURE else 0.0
        if entry.graph is not None and action in (Action.CAPTURE, Action.REPLAY):
            entry.graph.replay()
            out = entry.out
        else:  # warm-up, a failed capture, or the CPU (same buffers, no graph)
            out = self._forward(key.kind, entry.arena, layout, lengths, layout.tokens)
        self._count(action, layout, capture_s)
        info = StepInfo(action.value, layout.real_tokens, layout.tokens, capture_s)
        rows = out[: rows_for(key.kind, layout)]
        if not self.cuda:
            return LazyTensor.ready(rows, info)
        return LazyTensor.copy_from_device(_f32(rows), self.pool, (staging,), info)

    def _capture(self, entry: _Entry, key: GraphKey, lengths: list[int]) -> float:
        started = time.perf_counter()
        if not self.cuda:
            self.dispatcher.captured(key)
            return 0.0
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the completion thread may query events while this
            # thread captures; in the default (global) mode that query would
            # invalidate the capture. The float32 cast is captured too, so a
            # replay leaves nothing to run eagerly.
            with torch.cuda.graph(graph, pool=self._graph_pool, capture_error_mode="thread_local"):
                out = _f32(self._forward(key.kind, entry.arena, entry.layout, lengths, entry.layout.tokens))
        except Exception as e:  # a kernel that cannot be captured: stay eager
            if is_sticky_cuda_error(e):
                raise
            log.exception("capture of %s failed; it will run eagerly on static buffers", key)
            self.dispatcher.failed(key)
            return time.perf_counter() - started
        entry.graph, entry.out = graph, out
        self.dispatcher.captured(key)
        elapsed = time.perf_counter() - started
        log.info("captured %s in %.0f ms", key, elapsed * 1e3)
        return elapsed

    def _forward(self, kind: OutputKind, arena: torch.Tensor, layout: Layout, lengths: list[int],
                 max_seqlen: int) -> torch.Tensor:
        x = step_inputs(arena, layout, self.backend, self.model.causal, lengths, max_seqlen)
        return self.model(kind, x)

    def _count(self, action: Action, layout: Layout, capture_s: float = 0.0) -> None:
        self._count_mode(action.value, layout, capture_s)

    def _count_mode(self, mode: str, layout: Layout, capture_s: float = 0.0) -> None:
        self.stats.steps[mode] += 1
        self.stats.padded_tokens += layout.tokens - layout.real_tokens
        self.stats.capture_seconds += capture_s


@functools.lru_cache(maxsize=8192)
def _eager_info(tokens: int, padded_tokens: int) -> StepInfo:
    """One shared (frozen) StepInfo per size: building one is a slow
    dataclass ``__init__`` on every step."""
    return StepInfo("eager", tokens, padded_tokens)


@functools.lru_cache(maxsize=8192)
def _gated_info(mode: str, tokens: int) -> StepInfo:
    return StepInfo(mode, tokens, tokens)


def _on(device: torch.device):
    """The device guard for a step (nothing to do on the CPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.float()
