"""Where the machine's CPU went during a measured block: per process and
per thread (``profiling.thread_times``), the load generator and other
children this process waited for (``RUSAGE_CHILDREN``), and the whole
machine (``/proc/stat``), so what no named process used is visible too."""

from __future__ import annotations

import os
import resource
from collections import Counter

from bench.harness.profiling import thread_times

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> Counter:
    """CPU seconds so far of each thread of ``pid``, summed by thread name."""
    out: Counter = Counter()
    for name, seconds, _ in thread_times(pid).values():
        out[name] += seconds
    return out


def machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the machine since boot, every core."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / _TICK, sum(values) / _TICK


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class CpuMeter:
    """Snapshot before and after a block: ``result()`` gives CPU seconds per
    process (and per thread name), the waited-for children's, the
    machine's busy seconds and the cores' wall seconds."""

    def __init__(self, processes: dict[str, int]):
        self.processes = processes

    def _snap(self) -> dict:
        return {"threads": {k: thread_cpu(pid) for k, pid in self.processes.items()},
                "children": children_cpu(), "machine": machine_cpu(), "wall": os.times().elapsed}

    def __enter__(self):
        self.before = self._snap()
        return self

    def __exit__(self, *exc):
        self.after = self._snap()

    def result(self) -> dict:
        a, b = self.before, self.after
        procs = {}
        for k in self.processes:
            threads = {t: round(b["threads"][k][t] - a["threads"][k].get(t, 0.0), 3) for t in b["threads"][k]}
            procs[k] = {"cpu_s": round(sum(threads.values()), 3),
                        "threads": {t: v for t, v in sorted(threads.items()) if v > 0}}
        busy = b["machine"][0] - a["machine"][0]
        wall = b["wall"] - a["wall"]
        named = sum(p["cpu_s"] for p in procs.values()) + (b["children"] - a["children"])
        return {"processes": procs, "clients_cpu_s": round(b["children"] - a["children"], 3),
                "machine_busy_cpu_s": round(busy, 3), "unattributed_cpu_s": round(busy - named, 3),
                "wall_s": round(wall, 3), "cores": os.cpu_count(),
                "machine_busy_fraction": round(busy / (wall * (os.cpu_count() or 1)), 3) if wall else None}
