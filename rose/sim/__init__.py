"""A simulated device: ROSE's real host path with the GPU modelled.

``--device sim`` (Tulip's launcher) serves a model directory with the
forward pass replaced by a cost model of a GPU step (``cost.py``), steps
queued in launch order on one modelled stream (``device.py``), events that
complete at the modelled end (``events.py``, waited on by Tulip's
completion thread like CUDA events) and deterministic outputs
(``outputs.py``). See ``docs/simulated-device.md``.
"""

from .cost import DEFAULT as DEFAULT_COST
from .cost import CostModel, fit
from .device import SimDevice, busy_fraction, overlapping, read_log
from .engine import DEVICE_NAME, SimEngine, SimSettings
from .events import SimEvent

__all__ = ["DEFAULT_COST", "DEVICE_NAME", "CostModel", "SimDevice", "SimEngine", "SimEvent", "SimSettings",
           "busy_fraction", "fit", "overlapping", "read_log"]
