"""A simulated device: ROSE's real runner with the GPU modelled.

``--device sim`` (Tulip's launcher) serves a model directory on a
``Device`` (``device.py``) whose forward pass is a step queued on one
modelled stream (``stream.py``) for as long as a cost model of a GPU step
says (``cost.py``), with events that complete at the modelled end
(``events.py``, waited on by Tulip's completion thread like CUDA events)
and deterministic outputs (``outputs.py``). See
``docs/simulated-device.md``.
"""

from .cost import DEFAULT as DEFAULT_COST
from .cost import CostModel, fit
from .device import SimDevice
from .engine import DEVICE_NAME, SimEngine, SimSettings
from .events import SimEvent
from .stream import SimStream, busy_fraction, overlapping, read_log

__all__ = ["DEFAULT_COST", "DEVICE_NAME", "CostModel", "SimDevice", "SimEngine", "SimEvent", "SimSettings",
           "SimStream", "busy_fraction", "fit", "overlapping", "read_log"]
