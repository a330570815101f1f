"""The CPU's runtimes: each takes over the steps of a token bucket once it
is built and gated against the float32 eager step (``gated.py``).

Adding one is a file here (a ``GatedRuntime`` subclass with its settings)
and one line in ``RUNTIMES``. The engine asks ``select`` which of the
runtimes it was given settings for can serve its model, and gets the
reason for every refusal.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from .bf16 import Bf16Settings, Bf16Twin
from .gated import Context, GatedRuntime, State
from .int8 import Int8Settings, OnnxInt8Runtime
from .onnx import OnnxRuntime, OnnxSettings

__all__ = ["Bf16Settings", "Context", "GatedRuntime", "Int8Settings", "OnnxSettings", "RUNTIMES", "Selection", "State",
           "select"]

log = logging.getLogger("rose.cpu")

# In the order a step is offered to them: ONNX Runtime takes the small
# steps it is given (in int8 where its bucket passed that gate, else in
# float32), the twin any other.
RUNTIMES: tuple[type[GatedRuntime], ...] = (OnnxInt8Runtime, OnnxRuntime, Bf16Twin)


@dataclass
class Selection:
    """The runtimes an engine gets, in step order, and why the others it
    was given settings for were refused (by name)."""

    runtimes: list[GatedRuntime] = field(default_factory=list)
    refusals: dict[str, str] = field(default_factory=dict)


def select(ctx: Context, wanted: Sequence[object]) -> Selection:
    """``wanted``: settings objects, one per runtime to try (an
    ``OnnxSettings``, an ``Int8Settings``, a ``Bf16Settings``...). Logs one line per refusal."""
    given = {}
    for settings in wanted:
        # The exact class: an Int8Settings is also an OnnxSettings.
        cls = next((c for c in RUNTIMES if type(settings) is c.Settings), None)
        if cls is None:
            raise ValueError(f"no CPU runtime takes {type(settings).__name__}")
        given[cls] = settings
    alone = {cls: cls.refusal(ctx, s, ()) for cls, s in given.items()}
    able = tuple(cls.name for cls, why in alone.items() if why is None)
    out = Selection()
    for cls in RUNTIMES:
        if cls not in given:
            continue
        beside = tuple(n for n in able if n != cls.name)
        why = alone[cls] or cls.refusal(ctx, given[cls], beside)
        if why is None:
            out.runtimes.append(cls(ctx, given[cls]))
        else:
            out.refusals[cls.name] = why
            log.info("%s off: %s", cls.title, why)
    return out
