"""The engine: a model, its runner, and ``step(batch) -> LazyTensor``."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np
import torch

from .adapters import MAX_ADAPTERS, MAX_RANK, AdapterInfo, Bank
from .attention import AttentionBackend, select_backend
from .build import load, resolve_device, resolve_dtype, runner_for
from .config import ModelSpec
from .cpu import GatedRuntime, State
from .cpu.threads import SMALL_STEP_TOKENS
from .errors import AdapterError, InvalidBatchError
from .info import ModelInfo
from .interface import Batch, Images, OutputKind
from .lazy import LazyTensor
from .models import EmbeddingModel, attn_shape, check_supported
from .step.graphs import GraphKey, GraphSettings
from .step.image_inputs import check_images
from .step.lora import LoraRuntime
from .step.runner import Runner

__all__ = ["Engine", "ModelInfo"]

log = logging.getLogger("rose")


class Engine:
    """Runs one model. Not thread-safe: one host thread calls ``step``."""

    def __init__(self, spec: ModelSpec, model: EmbeddingModel, dtype: torch.dtype, backend: AttentionBackend,
                 runner: Runner):
        self.spec = spec
        self.model = model
        self.dtype = dtype
        self.backend = backend
        self.runner = runner
        self.device = runner.device.torch_device
        lora = runner.runtime("lora")
        self._adapters: Bank | None = cast(LoraRuntime, lora).bank if lora is not None else None
        bank = self._adapters
        limits = (bank.max_adapters, bank.max_rank if bank.max_adapters else 0) if bank is not None else (0, 0)
        image_modes = runner.images.labels if runner.images is not None else ()
        self.info = ModelInfo.of(spec, model, runner.device.name, dtype, runner.labels, *limits,
                                 image_step_modes=image_modes)

    @classmethod
    def from_dir(
        cls,
        path: str | Path,
        *,
        device: str = "auto",
        dtype: str = "auto",
        attention: str = "auto",
        model_id: str | None = None,
        graphs: bool = True,
        graph_settings: GraphSettings | None = None,
        static_on_cpu: bool = False,
        packed_linear: bool = True,
        cpu_runtimes: Sequence[object] = (),
        small_step_tokens: int = SMALL_STEP_TOKENS,
        max_adapters: int = MAX_ADAPTERS,
        max_adapter_rank: int = MAX_RANK,
    ) -> Engine:
        """Loads a Hugging Face model directory. ``graphs`` enables lazily
        captured CUDA graphs (on CUDA, with a capture-safe attention backend);
        ``static_on_cpu`` runs the same static-buffer path on the CPU;
        ``packed_linear`` packs float32 linear weights for oneDNN on the CPU
        (``rose/models/packed.py``); ``cpu_runtimes``: settings of the CPU
        runtimes to try (``rose/cpu``: ``OnnxSettings`` runs small float32
        steps on ONNX Runtime, ``Bf16Settings`` the others on a bfloat16
        twin), each once its token bucket is built and gated, eager where it
        cannot; ``small_step_tokens``: CPU steps below this many tokens run
        on one thread; ``max_adapters``: LoRA adapters resident at once (0:
        none), ``max_adapter_rank``: the largest rank of an adapter's
        module (``load_adapter``)."""
        started = time.perf_counter()
        spec = ModelSpec.from_dir(path, model_id)
        check_supported(spec)  # before anything reads a field a family needs
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        backend = select_backend(attn_shape(spec), dev, dt, attention)
        model, packed = load(spec, backend, dev, dt, packed_linear)
        log.info(
            "loaded %s (%s, %s, %s, attention=%s, %d packed linear layers) in %.1fs",
            spec.model_id, spec.model_type, dev, dt, backend.name, packed, time.perf_counter() - started,
        )
        runner = runner_for(spec, model, dev, dt, backend, packed, graphs=graphs, graph_settings=graph_settings,
                            static_on_cpu=static_on_cpu, cpu_runtimes=cpu_runtimes,
                            small_step_tokens=small_step_tokens, max_adapters=max_adapters,
                            max_adapter_rank=max_adapter_rank)
        return cls(spec, model, dt, backend, runner)

    def gated(self) -> list[GatedRuntime]:
        """The runtimes that take token buckets over once built and gated."""
        return [r for r in self.runner.runtimes if isinstance(r, GatedRuntime)]

    def warm(self, timeout: float = 900.0, cached_only: bool = False) -> dict[str, dict[int, str]]:
        """Builds every gated runtime and gates each of its buckets now, on
        synthetic steps (for operators who prefer paying the builds at
        start-up, and benchmarks); each runtime's buckets' states by name.
        ``cached_only``: only the runtimes built from the cache alone
        (``GatedRuntime.cached``: opening a stored export and gating its
        buckets, a fraction of a second for a small model), so that a
        restart serves its first query on them; the others stay lazy."""
        out = {}
        for runtime in self.gated():
            if cached_only and not runtime.cached():
                continue
            self._warm(runtime, timeout)
            out[runtime.name] = {b: runtime.state(b).value for b in runtime.settings.buckets()}
        return out

    def cpu_readiness(self) -> dict[str, dict[str, int]]:
        """Each gated runtime's buckets by state (cold, pending: building
        or gating, ready, failed: refused by the gate or not buildable),
        by the runtime's step label; {} without one. Read by a host at any
        time (Tulip's metrics and Info)."""
        return {runtime.name: runtime.counts() for runtime in self.gated()}

    def _warm(self, runtime: GatedRuntime, timeout: float) -> None:
        span = max(min(1000, self.info.vocab_size - 5), 1)
        for tokens in runtime.settings.warm_steps():
            ids = [5 + (i * 7919) % span for i in range(tokens)]  # clear of special and padding ids
            # A bucket counts the step's tokens: a model whose inputs are
            # shorter than the bucket (128-token multilingual MiniLM, 256
            # bucket) warms it with several sequences.
            longest = max(self.info.max_input_length, 1)
            batch = Batch.from_lists([ids[i:i + longest] for i in range(0, tokens, longest)], runtime.kind)
            bucket = runtime.key(batch)  # None: more sequences than the runtime takes
            if bucket is not None and runtime.state(bucket) is State.COLD:
                self.step(batch).release()
        runtime.wait(timeout)

    def step(self, batch: Batch) -> LazyTensor:
        """Runs one batch. Returns at once; the result is on the host when
        the LazyTensor's event completes (immediately on the CPU)."""
        self.validate(batch)
        return self.runner.run(batch)

    def step_images(self, images: Images) -> LazyTensor:
        """Runs one image step (a model with ``ModelInfo.image_size``):
        ``images.pixels`` float32 ``[N, C, H, W]`` as the host prepared
        them, one dense row per image, in the space of the text rows.
        Returns at once, as ``step`` does; ``InvalidBatchError`` says what
        is wrong with the input (or that this model takes no images)."""
        image = self.model.image_input
        if image is None or self.runner.images is None:
            raise InvalidBatchError(f"this model ({self.info.architecture}) takes no images, only token ids")
        host = check_images(images, image, self.info.dimension, self.info.normalize_default)
        return self.runner.run_images(host)

    def step_images_arena(self, pixels: bytearray, images: int, dimensions: Sequence[int],
                          normalize: Sequence[bool]) -> tuple:
        """The host's path for image steps (Tulip's): ``pixels`` float32
        little-endian ``[images, C, H, W]`` at ``info.image_size`` back to
        back, per image its dimensions (0: full) and normalisation; returns
        what ``step_arena`` returns. The pixels are read in place (no copy
        before the step's own copy to its arena)."""
        image = self.model.image_input
        if image is None:
            raise InvalidBatchError(f"this model ({self.info.architecture}) takes no images, only token ids")
        flat = np.frombuffer(pixels, dtype="<f4")
        if flat.size != images * image.values:
            raise InvalidBatchError(f"{flat.size} pixel values for {images} images of {image.values} each")
        batch = Images(flat.reshape(images, image.channels, image.height, image.width),
                       dimensions=list(dimensions), normalize=list(normalize))
        lazy = self.step_images(batch)
        return (lazy, *lazy.describe())

    def step_arena(self, arena: bytearray, sequences: int, tokens: int, kind: str,
                   adapters: Sequence[str | None] | None = None) -> tuple:
        """The host's path (Tulip's): one call from an arena the host built,
        options resolved, to everything the host reads:
        ``(lazy, host_ptr, rows, cols, event_handle, mode, padded_tokens,
        capture_seconds)``. ``adapters``: as ``Batch.adapters`` (None, or
        per sequence an adapter's name or None); a name not loaded is an
        ``InvalidBatchError``, the one check this path makes.

        The host has checked what ``validate`` checks (Tulip does, in Rust,
        before it queues a request), so this does not check again. The
        calling thread is set up once for steps (inference mode and the
        device stay on for it), rather than on every step: on a small step
        these per-call costs were most of the Python a step runs, and that
        Python runs with cold caches after every wait for a request."""
        if adapters is not None and self._adapters is None:
            raise InvalidBatchError("this engine takes no adapters")
        lazy = self.runner.run_on_host_thread(Batch.from_arena(arena, sequences, tokens, kind, adapters))
        return (lazy, *lazy.describe())

    def load_adapter(self, name: str, path: str | Path) -> None:
        """Loads the LoRA adapter in directory ``path`` (PEFT's format:
        ``adapter_config.json``, ``adapter_model.safetensors``) under
        ``name``, for batches to choose per sequence (``Batch.adapters``).
        Steps may run meanwhile, from another thread too (wrapping its
        projections waits for a step with adapters in progress); the
        adapter is usable once this returns. ``AdapterError`` says why one
        is refused (not LoRA, an option ROSE does not apply, another base
        model, a rank or a count over the engine's bounds, a name in use)
        and leaves the engine as it was."""
        self._bank().load(name, path)
        log.info("adapter %s loaded from %s", name, path)

    def unload_adapter(self, name: str) -> None:
        """Forgets adapter ``name`` (``AdapterError`` if none is loaded by
        that name). A step running with it on another thread finishes with
        it first (this waits for its forward pass); a step naming it after
        this returns is an ``InvalidBatchError``. With no adapter left, the
        model is the one loaded at start-up, module for module."""
        self._bank().unload(name)
        log.info("adapter %s unloaded", name)

    def adapters(self) -> tuple[AdapterInfo, ...]:
        """The loaded adapters, in load order (name, path, rank, alpha,
        targets, parameters...)."""
        return self._adapters.list() if self._adapters is not None else ()

    def _bank(self) -> Bank:
        if self._adapters is None:
            raise AdapterError("this engine takes no adapters")
        return self._adapters

    def capture(self, configurations: list[str]) -> None:
        """Captures CUDA graphs now for ``"[kind:]SEQxTOKENS"`` configurations
        (the token count is rounded up to its bucket)."""
        for text in configurations:
            key = GraphKey.parse(text)
            padded = self.runner.dispatcher.key(key.kind, key.sequences, key.tokens - 1)
            if padded is None:
                raise ValueError(f"{text}: outside the graph grid (graphs off, or too many sequences/tokens)")
            self.runner.capture(padded)

    def validate(self, batch: Batch) -> None:
        """Checks a batch against the model. Hosts validate requests earlier;
        this is the last line before a kernel sees an id."""
        states = batch.kind is OutputKind.TOKEN_STATES and self.info.token_states_dimension > 0
        if batch.kind.value not in self.info.kinds and not states:
            raise InvalidBatchError(
                f"this model produces {', '.join(self.info.kinds)} outputs, not {batch.kind.value}"
            )
        if batch.num_sequences < 1:
            raise InvalidBatchError("a batch needs at least one sequence")
        cu = batch.numpy_field("cu")
        lengths = batch.checked_lengths()  # a list, kept for the runner
        if cu[0] != 0 or sum(lengths) != batch.num_tokens or min(lengths) < 1:
            raise InvalidBatchError("every sequence needs at least one token, and cu_seqlens must cover the batch")
        if max(lengths) > self.info.max_input_length:
            raise InvalidBatchError(
                f"a sequence of {max(lengths)} tokens exceeds the maximum of {self.info.max_input_length}"
            )
        # As unsigned, a negative id is huge: one reduction checks both ends.
        if batch.numpy_field("ids").view(np.uint32).max() >= self.info.vocab_size:
            raise InvalidBatchError(f"token ids must be in [0, {self.info.vocab_size})")
        if batch.adapters is not None:
            if len(batch.adapters) != batch.num_sequences:
                raise InvalidBatchError(f"{len(batch.adapters)} adapter choices for {batch.num_sequences} sequences")
            for name in set(batch.adapters) - {None}:
                if self._adapters is None or not self._adapters.known(str(name)):
                    raise InvalidBatchError(f"adapter {name!r} is not loaded")

    def embed(self, sequences: list[list[int]], kind: OutputKind | str = OutputKind.DENSE, **options) -> torch.Tensor:
        """Convenience for Python callers: runs one batch and returns a copy
        of the output on the host (``options``: ``Batch.from_lists``'s
        ``dimensions``, ``normalize``, ``adapters``)."""
        lazy = self.step(Batch.from_lists(sequences, kind, **options))
        try:
            return lazy.tensor().clone()
        finally:
            lazy.release()
