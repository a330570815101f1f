"""The engine: a model, its device, and ``step(batch) -> LazyTensor``."""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .attention import AttentionBackend, select_backend
from .config import ModelSpec
from .errors import InvalidBatchError
from .interface import Batch, OutputKind
from .lazy import LazyTensor
from .loader import WeightReader, read_weights, strip_prefix
from .cpubf16 import TWIN_KINDS, Bf16Settings, Bf16Twin
from .cpubf16 import missing as cpu_bf16_missing
from .cpufast import CpuFastPath, FastPathSettings
from .cpufast import missing as cpu_fast_path_missing
from .gated import GatedRuntime, State
from .graphs import GraphKey, GraphSettings
from .models import EmbeddingModel, attn_shape, build_model
from .models import packed as packing
from .runner import Runner

log = logging.getLogger("rose")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelInfo:
    """What a host needs to know to validate requests and describe the model."""

    model_id: str
    architecture: str
    dimension: int
    max_input_length: int
    vocab_size: int
    pooling: str
    normalize_default: bool
    kinds: tuple[str, ...]
    multi_vector_dimension: int
    dtype: str
    device: str
    # sentence-transformers' prompts (name → text prepended to the input)
    # and the one to apply when a request names none: the host's default
    # templates.
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    # A classifier's label names, one per ``classify`` output value.
    labels: tuple[str, ...] = ()
    # Width of ``token_states`` rows (the hidden size); 0 when the model does
    # not produce them (only embedding models do, SPLADE excepted).
    token_states_dimension: int = 0
    # The model's tokenizer.json and the sha256 of its bytes ("" when the
    # directory has none): what a gateway must tokenize with, and how it
    # can tell that two replicas agree.
    tokenizer_file: str = ""
    tokenizer_sha256: str = ""
    # Causal-LM rerankers: the text a (query, document) pair becomes, with
    # {query} and {document} to fill, tokenized without special tokens
    # ("" = an ordinary pair encoding).
    pair_template: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _tokenizer_identity(path: Path) -> dict[str, str]:
    tok = Path(path) / "tokenizer.json"
    if not tok.is_file():
        return {}
    return {"tokenizer_file": str(tok), "tokenizer_sha256": hashlib.sha256(tok.read_bytes()).hexdigest()}


def resolve_device(device: str) -> torch.device:
    """``device`` as a torch device; one that cannot be used here is a
    ``ValueError`` with one line to say why (torch's own would surface deep
    in the model load, as a traceback)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device {device!r} is not one of auto, cpu, cuda, cuda:N, sim") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            why = "this PyTorch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise ValueError(f"device {device!r}: {why}; pass --device cpu (or auto)")
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device {device!r}: only {count} GPU(s) are visible (cuda:0 to cuda:{count - 1})")
    return dev


def load_model(spec: ModelSpec, backend: AttentionBackend) -> EmbeddingModel:
    """A model built with ``backend`` and its weights read from the
    directory: float32, on the CPU, in eval mode."""
    model = build_model(spec, backend)
    tensors = {} if spec.model_type == "null" else read_weights(spec.path)
    weights = WeightReader(strip_prefix(tensors), str(spec.path))
    model.load(weights)
    leftover = weights.unused(ignore=("pooler.", "position_ids", "lm_head."))
    if leftover:
        log.warning("unused weights in %s: %s", spec.path, ", ".join(leftover[:8]))
    return model.eval()


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(_DTYPES)}") from None


def _cpu_float32_refusal(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why a gated CPU runtime (fast path, bfloat16 twin) cannot stand in
    for this engine's steps, or None."""
    if device.type != "cpu" or dtype != torch.float32:
        return f"it takes float32 CPU steps only (this engine: {dtype} on {device})"
    if spec.model_type == "null":
        return "the null model computes nothing"
    return None


def _fast_path_refusal(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the CPU fast path does not apply to this engine, or None."""
    return _cpu_float32_refusal(spec, device, dtype) or cpu_fast_path_missing()


def _twin_refusal(spec: ModelSpec, device: torch.device, dtype: torch.dtype, packed: int, kind: OutputKind,
                  require_amx: bool) -> str | None:
    """Why the bfloat16 twin does not apply to this engine, or None."""
    why = _cpu_float32_refusal(spec, device, dtype)
    if why is not None:
        return why
    if not packed:
        return "it needs the packed linear layers (--cpu-packed-linear)"
    if kind not in TWIN_KINDS:
        return (f"its gate judges vectors by cosine, and this model's {kind.value} output is not one (a "
                "cross-encoder's logits stay float32)")
    return cpu_bf16_missing(require_amx)


class Engine:
    """Runs one model. Not thread-safe: one host thread calls ``step``."""

    def __init__(self, spec: ModelSpec, model: EmbeddingModel, device: torch.device, dtype: torch.dtype,
                 backend: AttentionBackend, graphs: bool = True, graph_settings: GraphSettings | None = None, static_on_cpu: bool = False,
                 cpu_fast_path: CpuFastPath | None = None, cpu_bf16: Bf16Twin | None = None):
        self.spec = spec
        self.model = model
        self.device = device
        self.dtype = dtype
        self.info = ModelInfo(
            model_id=spec.model_id,
            architecture=spec.model_type,
            dimension=model.dimension,
            max_input_length=spec.max_length,
            vocab_size=spec.vocab_size,
            pooling=spec.pooling,
            normalize_default=spec.normalize,
            kinds=tuple(k.value for k in model.kinds),
            multi_vector_dimension=model.multi_vector_dimension,
            dtype=str(dtype).removeprefix("torch."),
            device=str(device),
            prompts=dict(spec.pipeline.prompts) if spec.pipeline else {},
            default_prompt_name=spec.pipeline.default_prompt_name if spec.pipeline else None,
            labels=spec.labels if OutputKind.CLASSIFY in model.kinds else (),
            pair_template=getattr(model, "pair_template", ""),
            token_states_dimension=spec.hidden_size if OutputKind.DENSE in model.kinds else 0,
            **_tokenizer_identity(spec.path),
        )
        self.runner = Runner(model, device, backend, model.dimension, spec.normalize,
                             graph_settings, graphs, static_on_cpu, cpu_fast_path, cpu_bf16)

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
        cpu_fast_path: bool = False,
        cpu_fast_path_settings: FastPathSettings | None = None,
        cpu_bf16: bool | None = False,
        cpu_bf16_settings: Bf16Settings | None = None,
    ) -> "Engine":
        """Loads a Hugging Face model directory. ``graphs`` enables lazily
        captured CUDA graphs (on CUDA, with a capture-safe attention backend);
        ``static_on_cpu`` runs the same static-buffer path on the CPU;
        ``packed_linear`` packs float32 linear weights for oneDNN on the CPU
        (``rose/models/packed.py``); ``cpu_fast_path`` runs small float32
        CPU steps on ONNX Runtime once their bucket is built and gated
        (``rose/cpufast.py``; eager where it cannot); ``cpu_bf16`` runs the
        other steps of a float32 CPU model on its bfloat16 twin once their
        bucket is gated (``rose/cpubf16.py``; None = where the CPU has AMX)."""
        started = time.perf_counter()
        spec = ModelSpec.from_dir(path, model_id)
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        backend = select_backend(attn_shape(spec), dev, dt, attention)
        model = load_model(spec, backend).to(device=dev, dtype=dt)
        packed = 0
        if packed_linear and dev.type == "cpu" and dt == torch.float32:
            if packing.available():
                packed = packing.pack_linears(model)
            else:
                log.warning("this PyTorch has no oneDNN packed linear: plain CPU matmuls")
        log.info(
            "loaded %s (%s, %s, %s, attention=%s, %d packed linear layers) in %.1fs",
            spec.model_id, spec.model_type, dev, dt, backend.name, packed, time.perf_counter() - started,
        )
        twin = None
        if cpu_bf16 is not False:
            why = _twin_refusal(spec, dev, dt, packed, model.kinds[0], require_amx=cpu_bf16 is None)
            if why is None:
                twin = Bf16Twin(spec, model.kinds[0], backend, cpu_bf16_settings)
            else:
                log.info("bfloat16 steps off: %s", why)
        fast = None
        if cpu_fast_path:
            settings = cpu_fast_path_settings or FastPathSettings()
            why = _fast_path_refusal(spec, dev, dt)
            if why is None and twin is not None and settings.max_tokens is None:
                # Served on the 2-core Intel VM, queries on the twin alone (one
                # thread below 32 tokens) answered 1 ms sooner after an idle
                # spell than on ONNX Runtime's two, 0.25 ms later back to back.
                why = ("the bfloat16 twin takes small steps too (fewer threads to wake per query; "
                       "--cpu-fast-path-max-tokens N gives steps of up to N tokens to ONNX Runtime)")
            if why is None:
                fast = CpuFastPath(spec.path, model.kinds[0], model.dimension, settings)
            else:
                log.info("CPU fast path off: %s", why)
        return cls(spec, model, dev, dt, backend, graphs, graph_settings, static_on_cpu, fast, twin)

    def warm_cpu_fast_path(self, timeout: float = 900.0) -> dict[int, str]:
        """Builds the CPU fast path and gates every bucket now, on synthetic
        steps (for operators who prefer paying the build at start-up, and
        benchmarks); returns each bucket's state."""
        return self._warm(self.runner.fast, timeout) if self.runner.fast is not None else {}

    def warm_cpu_bf16(self, timeout: float = 900.0) -> dict[int, str]:
        """The same for the bfloat16 twin, up to its ``warm_tokens`` bucket."""
        return self._warm(self.runner.twin, timeout) if self.runner.twin is not None else {}

    def _warm(self, runtime: GatedRuntime, timeout: float) -> dict[int, str]:
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
        return {b: runtime.state(b).value for b in runtime.settings.buckets()}

    def step(self, batch: Batch) -> LazyTensor:
        """Runs one batch. Returns at once; the result is on the host when
        the LazyTensor's event completes (immediately on the CPU)."""
        self.validate(batch)
        return self.runner.run(batch)

    def step_arena(self, arena: bytearray, sequences: int, tokens: int, kind: str) -> tuple:
        """The host's path (Tulip's): one call from an arena the host built,
        options resolved, to everything the host reads:
        ``(lazy, host_ptr, rows, cols, event_handle, mode, padded_tokens,
        capture_seconds)``.

        The host has checked what ``validate`` checks (Tulip does, in Rust,
        before it queues a request), so this does not check again. The
        calling thread is set up once for steps (inference mode and the
        device stay on for it), rather than on every step: on a small step
        these per-call costs were most of the Python a step runs, and that
        Python runs with cold caches after every wait for a request."""
        lazy = self.runner.run_on_host_thread(Batch.from_arena(arena, sequences, tokens, kind))
        return (lazy, *lazy.describe())

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

    def embed(self, sequences: list[list[int]], kind: OutputKind | str = OutputKind.DENSE, **options) -> torch.Tensor:
        """Convenience for Python callers: runs one batch and returns a copy
        of the output on the host."""
        lazy = self.step(Batch.from_lists(sequences, kind, **options))
        try:
            return lazy.tensor().clone()
        finally:
            lazy.release()

