"""Timing primitives: percentiles, warm-up, and interleaved runs of several
sides, so that noise on a shared machine hits every side alike."""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Callable


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile (0–100) of already sorted values, interpolated
    linearly between ranks (numpy's default method)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Stats:
    """Latency summary in milliseconds."""

    count: int
    p50: float
    p90: float
    p99: float
    mean: float
    min: float
    max: float

    @classmethod
    def of(cls, seconds: list[float]) -> "Stats":
        ms = sorted(s * 1e3 for s in seconds)
        return cls(len(ms), percentile(ms, 50), percentile(ms, 90), percentile(ms, 99),
                   sum(ms) / len(ms), ms[0], ms[-1])

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleave(sides: dict[str, Callable[[int], object]], rounds: int, warmup: int,
               seed: int = 0, block: int = 1, settle: int = 0, idle: float = 0.0,
               before: Callable[[int], object] | None = None) -> dict[str, list[float]]:
    """Calls every side ``block`` times in a row per round, the sides in a
    fresh random order each round; ``fn(i)`` gets the call number (to pick
    its input). The first ``warmup`` rounds are run and discarded. Returns
    seconds per call, per side (``rounds * block`` each).

    ``block`` 1 disturbs each side's caches with the others' work before
    every call; a larger block measures each side as a server answering a
    stream of requests, while drift in the machine still hits every side;
    the first ``settle`` calls of each block are run and not timed;
    ``idle`` seconds are slept (untimed) before every timed call, as
    sporadic traffic leaves a server idle between requests, and
    ``before(k)`` is called (untimed) there too: other work between two
    requests."""
    rng = random.Random(seed)
    names = list(sides)
    for i in range(warmup):
        for name in names:
            for j in range(block):
                sides[name](i * block + j)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        rng.shuffle(names)
        for name in names:
            fn = sides[name]
            for j in range(settle):
                fn(i * block + j)
            for j in range(block):
                if idle:
                    time.sleep(idle)
                if before is not None:
                    before(i * block + j)
                out[name].append(timed(lambda fn=fn, k=i * block + j: fn(k)))
    return out


def stream_stats(sides: dict[str, Callable[[int], object]], calls: int, block: int, settle: int,
             seed: int = 0) -> dict[str, Stats]:
    """About ``calls`` timed calls per side as a server answering a stream
    of requests sees them: runs of ``block`` consecutive calls per side (the
    first ``settle`` of each run untimed), sides alternating run by run."""
    runs = max(calls // block, 2)
    lat = interleave(sides, runs, 0, seed=seed, block=block, settle=settle)
    return {k: Stats.of(v) for k, v in lat.items()}


def ratio(a: float, b: float) -> float | None:
    """a / b, or None when b is zero."""
    return round(a / b, 4) if b else None


def scaled(n: int, scale: float, minimum: int = 1) -> int:
    """A request count multiplied by the run's ``--scale``."""
    return max(minimum, round(n * scale))
