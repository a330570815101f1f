"""One modelled CUDA stream (``SimStream``).

Steps run on it one after another in launch order: a step launched while
another is still running starts when that one ends, as kernels queued on
one stream do. Each step's duration comes from the cost model; its end time
is what its event reports (``events.py``). Nothing is computed here: the
host path that leads to the launch is ROSE's real one (``device.py`` is
where it meets this stream).

With ``log_path`` every launch appends one JSON line ``{"step", "launch",
"start", "end", "tokens", "sequences", "fault", "over_ns"}`` (times in ns
of ``CLOCK_MONOTONIC``; ``over_ns``: how far the simulator's own host work
ran past the modelled launch time), so a test or a benchmark can see steps
overlap and how busy the device was.
"""

from __future__ import annotations

import json
import threading
import time

import torch

from .cost import CostModel
from .events import CUDA_MESSAGES, SimEvent
from .faults import Fault


class SimStream:
    def __init__(self, cost: CostModel, launch_us: float = 0.0, faults: tuple[Fault, ...] = (),
                 log_path: str = ""):
        if not launch_us >= 0:
            raise ValueError(f"--sim-launch-us must be >= 0, got {launch_us}")
        self.cost = cost
        self.launch_ns = int(launch_us * 1000)
        self.faults = {f.after: f for f in faults}
        self.busy_until = 0  # ns: when the last queued step ends
        self.launched = 0
        self.busy_ns = 0  # modelled device time of every step so far
        self.lost = False  # a sticky error happened: every launch fails
        self._lock = threading.Lock()  # steps may come from several host threads
        self._log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115 (process lifetime)

    def launch(self, lengths: list[int], sequences: int, copy_bytes: int = 0, adapted: float = 0.0,
               seconds: float | None = None) -> Launch:
        """Queues one step over segments of ``lengths`` (the filler segment
        of a padded step included), whose input and output copies move
        ``copy_bytes`` in all, with ``adapted`` tokens' worth of LoRA work
        (``CostModel.seconds``); ``seconds``: the step's compute when the
        caller costed it (an image step, ``CostModel.image_seconds``). The step reaches the device once the host's
        launch is over (``launch_us`` from now); ``landed`` ends that launch
        on the host. Its event completes at its modelled end, once its rows
        are written too (``SimEvent.written``)."""
        with self._lock:
            if self.lost:
                raise RuntimeError(f"CUDA error: {CUDA_MESSAGES[700]} (simulated device, lost after an earlier "
                                   "sticky error)")
            fault = self.faults.get(self.launched)
            self.launched += 1
            if fault is not None and fault.kind == "oom":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated device)")
            now = time.monotonic_ns()
            start = max(now + self.launch_ns, self.busy_until)
            compute = self.cost.seconds(lengths, adapted) if seconds is None else seconds
            duration = round((compute + copy_seconds(copy_bytes)) * 1e9)
            end = self.busy_until = start + duration
            self.busy_ns += duration
            code = fault.code if fault is not None else 0
            if fault is not None and fault.kind == "sticky":
                self.lost = True
            step = self.launched
        line = (f'{{"step": {step}, "launch": {now}, "start": {start}, "end": {end}, "tokens": {sum(lengths)}, '
                f'"sequences": {sequences}, "fault": {code}') if self._log is not None else ""
        return Launch(SimEvent(end, code), now, line)

    def landed(self, launch: Launch) -> None:
        """Ends a launch on the host: its log line is written, and the thread
        stays busy (GIL held, as a real launch holds it) until ``launch_us``
        after the launch began. The simulator's own work on the host (the
        rows, the log line) counts toward that time; what exceeds it is
        recorded as ``over_ns``."""
        over = time.monotonic_ns() - launch.began - self.launch_ns
        if self._log is not None:
            self._log.write(f'{launch.line}, "over_ns": {max(over, 0)}}}\n')
        if over < 0:
            _spin_until(launch.began + self.launch_ns)


class Launch:
    """A step on its way to the modelled device: its event, when the host
    began launching it (ns of CLOCK_MONOTONIC) and its log line so far."""

    __slots__ = ("event", "began", "line")

    def __init__(self, event: SimEvent, began: int, line: str):
        self.event = event
        self.began = began
        self.line = line


# The host<->device copies of a step (its arena in, its rows out): one
# PCIe Gen5 x16 link, 64 GB/s per direction, of which pinned copies reach
# about 50 GB/s, plus a few microseconds to start each of the two copies.
# Assumed, not measured here; a GPU run can fit them (docs/simulated-device.md).
COPY_BYTES_PER_S = 50e9
COPY_START_S = 2 * 2e-6


def copy_seconds(nbytes: int) -> float:
    """Device time of a step's two copies moving ``nbytes`` in all."""
    return COPY_START_S + nbytes / COPY_BYTES_PER_S if nbytes else 0.0


def _spin_until(ns: int) -> None:
    """Busy until ``CLOCK_MONOTONIC`` reads ``ns`` (a launch keeps its
    thread, and the GIL, busy)."""
    while time.monotonic_ns() < ns:
        pass


def read_log(path) -> list[dict]:
    """The steps a ``--sim-log`` file recorded, in launch order (lines are
    written when each launch lands, outside the stream's lock, so two host
    threads may write them out of order)."""
    with open(path) as f:
        return sorted((json.loads(line) for line in f if line.strip()), key=lambda s: (s["launch"], s["step"]))


def busy_fraction(steps: list[dict], since_ns: int | None = None, until_ns: int | None = None) -> float:
    """Modelled busy time / wall time over ``[since, until]`` (default: the
    first step's start to the last step's end)."""
    if not steps:
        return 0.0
    lo = steps[0]["start"] if since_ns is None else since_ns
    hi = steps[-1]["end"] if until_ns is None else until_ns
    if hi <= lo:
        return 0.0
    busy = sum(max(0, min(s["end"], hi) - max(s["start"], lo)) for s in steps)
    return busy / (hi - lo)


def overlapping(steps: list[dict]) -> int:
    """How many steps were launched while the one before was still on the
    device (two steps in flight at once)."""
    return sum(1 for a, b in zip(steps, steps[1:]) if b["launch"] < a["end"])
