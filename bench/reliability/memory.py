"""Resident memory of the stack's processes, sampled on a thread."""

from __future__ import annotations

import threading
import time
from typing import Callable


def rss_bytes(pid: int) -> int | None:
    """VmRSS of ``pid`` from /proc (None once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class RssSampler:
    """Every ``every`` seconds, the RSS of each process ``pids()`` names
    (a callable, so restarted processes are followed by name)."""

    def __init__(self, pids: Callable[[], dict[str, int]], every: float = 10.0):
        self.pids = pids
        self.every = every
        self.samples: list[dict] = []  # {"t": seconds since start, name: MiB}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def sample(self) -> dict:
        row = {"t": round(time.monotonic() - self.t0, 1)}
        for name, pid in self.pids().items():
            rss = rss_bytes(pid)
            if rss is not None:
                row[name] = round(rss / 2**20, 1)
        self.samples.append(row)
        return row

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self):
        self.t0 = time.monotonic()
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


def growth(samples: list[dict], after: float) -> dict[str, dict]:
    """Per process: RSS at the first sample at or after ``after`` seconds,
    at the end, the peak, and growth = end / base - 1."""
    out = {}
    later = [s for s in samples if s["t"] >= after] or samples[-1:]
    names = {k for s in later for k in s if k != "t"}
    for name in sorted(names):
        series = [s[name] for s in later if name in s]
        base, end = series[0], series[-1]
        out[name] = {"base_mib": base, "end_mib": end, "peak_mib": max(series),
                     "growth": round(end / base - 1, 4) if base else None}
    return out
