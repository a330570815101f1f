"""``Engine`` over the simulated device: a model directory's description
(config, tokenizer, output kinds and sizes) without its weights, ROSE's
real runner, and a modelled device (``device.py``)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..adapters import MAX_ADAPTERS, MAX_RANK, Bank
from ..attention import select_backend
from ..build import assemble
from ..config import ModelSpec
from ..engine import Engine
from ..interface import OutputKind
from ..models import attn_shape, build_model, check_supported
from ..step.graphs import Dispatcher, GraphSettings
from .cost import CostModel, VisionWork
from .device import SimDevice
from .faults import parse as parse_faults
from .outputs import OutputSynth
from .stream import SimStream

log = logging.getLogger("rose.sim")

DEVICE_NAME = SimDevice.name


@dataclass(frozen=True)
class SimSettings:
    """The simulated device's parameters (``--sim-*`` flags)."""

    cost: CostModel = CostModel.parse("")
    launch_us: float = 0.0  # host time of one launch (see docs/simulated-device.md)
    faults: str = ""
    log_path: str = ""

    @classmethod
    def from_flags(cls, cost: str = "", launch_us: float = 0.0, faults: str = "", log_path: str = "") -> SimSettings:
        s = cls(CostModel.parse(cost), float(launch_us), faults, log_path)
        parse_faults(faults)  # fail at start-up, not at the Nth step
        if not s.launch_us >= 0:
            raise ValueError(f"--sim-launch-us must be >= 0, got {launch_us}")
        return s


class SimEngine(Engine):
    """An ``Engine`` whose device is modelled: ``info.device == "sim"``."""

    simulated = True
    settings: SimSettings
    stream: SimStream

    @classmethod
    def from_dir(cls, path: str | Path, *, settings: SimSettings | None = None,
                 model_id: str | None = None, graphs: bool = True, graph_settings: GraphSettings | None = None,
                 max_adapters: int = MAX_ADAPTERS, max_adapter_rank: int = MAX_RANK, **_ignored) -> SimEngine:
        """A model directory (config.json; weights are not read), served on
        the simulated device. Adapters load as on a real device (read,
        checked and placed, their matrices on the host) and their steps
        cost their share of the linear work (``cost.py``)."""
        started = time.perf_counter()
        spec = ModelSpec.from_dir(path, model_id)
        check_supported(spec)
        backend = select_backend(attn_shape(spec), torch.device("cpu"), torch.float32, "auto")
        # On the meta device: the model's output kinds and sizes without
        # allocating (or reading) a single weight.
        with torch.device("meta"):
            model = build_model(spec, backend)
        settings = settings or SimSettings()
        stream = SimStream(settings.cost, settings.launch_us, parse_faults(settings.faults), settings.log_path)
        synth = OutputSynth(model.dimension, model.multi_vector_dimension, spec.hidden_size, spec.vocab_size,
                            len(spec.labels) if OutputKind.CLASSIFY in model.kinds else 0)
        vision = spec.vision_config
        work = VisionWork.of(vision, class_token=spec.model_type == "clip") if vision is not None else None
        device = SimDevice(stream, synth, work)
        bank = Bank(model, spec.model_type, torch.device("cpu"), torch.float32, max_adapters, max_adapter_rank)
        runner = assemble(device, model.dimension, spec.normalize, (),
                          Dispatcher(graph_settings or GraphSettings(), enabled=graphs), bank, model.image_input)
        engine = cls(spec, model, torch.bfloat16, backend, runner)
        engine.settings = settings
        engine.stream = stream
        log.info("simulated device for %s (%s): %s, launch %.1f us%s%s, in %.1fs", spec.model_id, spec.model_type,
                 settings.cost.describe(), settings.launch_us,
                 f", faults {settings.faults}" if settings.faults else "",
                 f", log {settings.log_path}" if settings.log_path else "", time.perf_counter() - started)
        return engine
