"""ROSE: the Python/PyTorch engine. Model definitions, ragged attention,
weight loading, and ``Engine.step(batch) -> LazyTensor``. Knows nothing of
gRPC or HTTP."""

from .engine import Engine, ModelInfo
from .errors import DeviceError, InvalidBatchError, ModelLoadError, RoseError
from .interface import Batch, OutputKind
from .lazy import LazyTensor

__all__ = [
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
