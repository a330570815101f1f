"""How an engine is put together: the device and dtype resolved, the model
loaded onto them, and the runner with the runtimes this model gets on this
device (the steps with LoRA adapters, the CPU's gated runtimes that
``rose/cpu`` selects, a configuration's static buffers and graph, the
eager forward)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from .adapters import MAX_ADAPTERS, MAX_RANK, Bank
from .attention import AttentionBackend
from .config import ModelSpec
from .cpu import Context, select
from .cpu.device import CpuDevice
from .cpu.threads import SMALL_STEP_TOKENS, ThreadBudget
from .models import EmbeddingModel, ImageInput
from .models import packed as packing
from .models.load import load_model
from .step.device import CudaDevice, Device
from .step.eager import EagerRuntime
from .step.graphs import Dispatcher, GraphSettings
from .step.images import ImageRuntime
from .step.lora import LoraRuntime
from .step.runner import Runner
from .step.static import StaticRuntime

log = logging.getLogger("rose")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(_DTYPES)}") from None


def load(spec: ModelSpec, backend: AttentionBackend, device: torch.device, dtype: torch.dtype,
         packed_linear: bool) -> tuple[EmbeddingModel, int]:
    """The model on its device and dtype, and how many of its linear layers
    were packed for oneDNN (float32 on the CPU only)."""
    model = load_model(spec, backend).to(device=device, dtype=dtype)
    packed = 0
    if packed_linear and device.type == "cpu" and dtype == torch.float32:
        if packing.available():
            packed = packing.pack_linears(model)
        else:
            log.warning("this PyTorch has no oneDNN packed linear: plain CPU matmuls")
    return model, packed


def runner_for(spec: ModelSpec, model: EmbeddingModel, device: torch.device, dtype: torch.dtype,
               backend: AttentionBackend, packed: int, *, graphs: bool = True,
               graph_settings: GraphSettings | None = None, static_on_cpu: bool = False,
               cpu_runtimes: Sequence[object] = (), small_step_tokens: int = SMALL_STEP_TOKENS,
               max_adapters: int = MAX_ADAPTERS, max_adapter_rank: int = MAX_RANK) -> Runner:
    """The runner of a loaded model: its device and its runtimes in step order."""
    dev: Device
    gated: list = []
    if device.type == "cuda":
        dev = CudaDevice(model, backend, device)
        # A backend that pads every sequence to the longest would, at a
        # bucket's fixed max length, pad every sequence to the whole bucket.
        graph_ok = backend.capture_safe and not backend.pads_to_longest
        if graphs and not graph_ok:
            log.warning("attention backend %s is not capture-safe or pads to the longest sequence: CUDA graphs "
                        "are off", backend.name)
        static = graphs and graph_ok
    else:
        dev = CpuDevice(model, backend, ThreadBudget(small_step_tokens))
        static = static_on_cpu
        ctx = Context(spec, model.kinds[0], model.dimension, device, dtype, backend, packed)
        gated = select(ctx, cpu_runtimes).runtimes
    bank = Bank(model, spec.model_type, device, dtype, max_adapters, max_adapter_rank)
    return assemble(dev, model.dimension, spec.normalize, gated, Dispatcher(graph_settings or GraphSettings(), static),
                    bank, model.image_input)


def assemble(device: Device, dimension: int, normalize_default: bool, gated: Sequence, dispatcher: Dispatcher,
             adapters: Bank | None = None, images: ImageInput | None = None) -> Runner:
    """A runner over ``device``: the steps with adapters (given a bank),
    then the gated runtimes given, then the static buffers (when the
    dispatcher is enabled), then the eager forward; and image steps for a
    model that takes ``images``, bucketed as the text steps are when the
    dispatcher is enabled (their configurations under one of their own)."""
    first = [LoraRuntime(device, dimension, adapters)] if adapters is not None else []
    runtimes = [*first, *gated, StaticRuntime(device, dispatcher, dimension), EagerRuntime(device, dimension)]
    image_steps = None
    if images is not None:
        image_steps = ImageRuntime(device, images, Dispatcher(dispatcher.settings, dispatcher.enabled), dimension)
    return Runner(device, runtimes, dispatcher, dimension, normalize_default, image_steps)
