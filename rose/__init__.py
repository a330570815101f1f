"""ROSE: the Python/PyTorch engine. Model definitions, ragged attention,
weight loading, and ``Engine.step(batch) -> LazyTensor``. Knows nothing of
gRPC or HTTP.

Where things live: ``interface.py`` (the batch a host hands in),
``lazy.py`` (the output it gets back), ``engine.py`` and ``build.py`` (an
engine and how it is put together), ``step/`` (one step's path and the
device seam), ``cpu/`` (the CPU's gated runtimes), ``sim/`` (the simulated
device), ``models/`` (one file per model family, loading in
``models/load.py``), ``attention/`` (the attention backends),
``adapters/`` (LoRA adapters chosen per sequence),
``config.py``, ``st_modules.py``, ``loader.py`` and ``hub.py`` (a model
directory's description, sentence-transformers modules, weights, Hub ids).
"""

from .engine import Engine, ModelInfo
from .errors import AdapterError, DeviceError, InvalidBatchError, ModelLoadError, RoseError
from .interface import Batch, OutputKind
from .lazy import LazyTensor

__all__ = [
    "AdapterError",
    "DeviceError",
    "Batch",
    "Engine",
    "InvalidBatchError",
    "LazyTensor",
    "ModelInfo",
    "ModelLoadError",
    "OutputKind",
    "RoseError",
]
