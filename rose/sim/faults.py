"""Device errors injected by the simulated device (``--sim-faults``).

``KIND@N[,KIND@N...]``: after ``N`` steps have been launched, the next one
fails as a real device would:

- ``sticky``: its event reports ``CUDA_ERROR_ILLEGAL_ADDRESS`` (700), and
  every later launch raises torch's "CUDA error: an illegal memory access"
  (the context is lost for good, as after a real out-of-bounds kernel);
- ``oom``: its launch raises ``torch.OutOfMemoryError`` (not sticky: the
  step fails, the next one runs);
- a number: its event reports that CUDA error code (sticky or not as
  Tulip's table in ``tulip/src/cuda.rs`` says, e.g. 700 sticky, 400 not).
"""

from __future__ import annotations

from dataclasses import dataclass

from .events import CODE_BITS

STICKY_CODE = 700


@dataclass(frozen=True)
class Fault:
    after: int  # steps launched before the failing one
    kind: str  # "sticky", "oom", or "code"
    code: int = 0


def parse(text: str) -> tuple[Fault, ...]:
    out = []
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        kind, sep, n = part.partition("@")
        if not sep or not n.strip().isdigit():
            raise ValueError(f"--sim-faults: {part!r} is not KIND@N (sticky@5, oom@3, 400@7)")
        after = int(n)
        kind = kind.strip()
        if kind in ("sticky", "oom"):
            out.append(Fault(after, kind, STICKY_CODE if kind == "sticky" else 0))
        elif kind.isdigit() and 0 < int(kind) < (1 << CODE_BITS):
            out.append(Fault(after, "code", int(kind)))
        else:
            raise ValueError(f"--sim-faults: unknown fault {kind!r} (sticky, oom, or a CUDA error code)")
    return tuple(out)
