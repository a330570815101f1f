"""The engine: a model, its device, and ``step(batch) -> LazyTensor``."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .attention import select_backend
from .config import ModelSpec
from .errors import InvalidBatchError
from .interface import Batch, OutputKind
from .lazy import LazyTensor
from .loader import WeightReader, read_safetensors, strip_prefix
from .models import EmbeddingModel, StepInputs, attn_shape, build_model

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

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(_DTYPES)}") from None


class Engine:
    """Runs one model. Not thread-safe: one host thread calls ``step``."""

    def __init__(self, spec: ModelSpec, model: EmbeddingModel, device: torch.device, dtype: torch.dtype):
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
        )
        self._backend = model_backend(model)

    @classmethod
    def from_dir(
        cls,
        path: str | Path,
        *,
        device: str = "auto",
        dtype: str = "auto",
        attention: str = "auto",
        model_id: str | None = None,
    ) -> "Engine":
        started = time.perf_counter()
        spec = ModelSpec.from_dir(path, model_id)
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        backend = select_backend(attn_shape(spec), dev, dt, attention)
        model = build_model(spec, backend)
        weights = WeightReader(strip_prefix(read_safetensors(spec.path)), str(spec.path))
        model.load(weights)
        leftover = weights.unused(ignore=("pooler.", "position_ids", "lm_head."))
        if leftover:
            log.warning("unused weights in %s: %s", spec.path, ", ".join(leftover[:8]))
        model = model.to(device=dev, dtype=dt).eval()
        log.info(
            "loaded %s (%s, %s, %s, attention=%s) in %.1fs",
            spec.model_id, spec.model_type, dev, dt, backend.name, time.perf_counter() - started,
        )
        return cls(spec, model, dev, dt)

    def step(self, batch: Batch) -> LazyTensor:
        """Runs one batch. Returns at once; the result is on the host when
        the LazyTensor's event completes (immediately on the CPU)."""
        self.validate(batch)
        x = self._inputs(batch)
        with torch.inference_mode():
            out = self.model(batch.kind, x)
        return LazyTensor.ready(out)

    def validate(self, batch: Batch) -> None:
        """Checks a batch against the model. Hosts validate requests earlier;
        this is the last line before a kernel sees an id."""
        if batch.kind.value not in self.info.kinds:
            raise InvalidBatchError(
                f"this model produces {', '.join(self.info.kinds)} outputs, not {batch.kind.value}"
            )
        lengths = batch.lengths or (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).tolist()
        if not lengths or min(lengths) < 1:
            raise InvalidBatchError("every sequence needs at least one token")
        if max(lengths) > self.info.max_input_length:
            raise InvalidBatchError(
                f"a sequence of {max(lengths)} tokens exceeds the maximum of {self.info.max_input_length}"
            )
        ids = batch.token_ids
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.info.vocab_size):
            raise InvalidBatchError(f"token ids must be in [0, {self.info.vocab_size})")

    def _inputs(self, batch: Batch) -> StepInputs:
        """Host-side layout tensors for a batch, moved to the device."""
        n = batch.num_sequences
        lengths = batch.lengths or (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).tolist()
        lens = torch.tensor(lengths, dtype=torch.int64)
        seg_ids = torch.repeat_interleave(torch.arange(n), lens)
        starts = batch.cu_seqlens[:-1].to(torch.int64)
        positions = (torch.arange(batch.num_tokens) - starts[seg_ids]).to(torch.int32)
        dims = batch.dimensions if batch.dimensions is not None else torch.zeros(n, dtype=torch.int32)
        dims = torch.where(dims > 0, dims, torch.full_like(dims, self.info.dimension))
        norm = batch.normalize
        if norm is None:
            norm = torch.full((n,), self.info.normalize_default, dtype=torch.bool)
        dev = self.device
        cu = batch.cu_seqlens.to(dev, non_blocking=True)
        return StepInputs(
            token_ids=batch.token_ids.to(dev, non_blocking=True),
            positions=positions.to(dev, non_blocking=True),
            seg_ids=seg_ids.to(dev, non_blocking=True),
            cu_seqlens=cu,
            inv_lengths=(1.0 / lens.to(torch.float32)).to(dev, non_blocking=True),
            dimensions=dims.to(dev, non_blocking=True),
            normalize=norm.to(dev, non_blocking=True),
            plan=self._backend.plan(cu, lengths, max(lengths), self.model.causal),
        )

    def embed(self, sequences: list[list[int]], kind: OutputKind | str = OutputKind.DENSE, **options) -> torch.Tensor:
        """Convenience for Python callers: runs one batch and returns a copy
        of the output on the host."""
        lazy = self.step(Batch.from_lists(sequences, kind, **options))
        try:
            return lazy.tensor().clone()
        finally:
            lazy.release()


def model_backend(model: EmbeddingModel):
    """The attention backend the model's layers were built with."""
    for m in model.modules():
        backend = getattr(m, "backend", None)
        if backend is not None:
            return backend
    raise ValueError("model has no attention layers")
