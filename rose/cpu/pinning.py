"""Which CPUs a fast-path step's threads run on.

Why: on a 2-core VM, a step after an idle spell ran ~25% slower with ONNX
Runtime's worker left to the scheduler than with it pinned to the core the
calling thread is not on, and no slower otherwise (docs/latency.md,
"Threads"). The calling thread (one of Tulip's) stays where the scheduler
put it; before each step the workers move off its CPU when it changed
(a system call per worker then, none otherwise). Only steps of one
sequence that follow an idle spell (``IDLE_S`` since the last step): back
to back steps and steps of several sequences mean concurrent requests,
where a worker is better free to move to whichever core is free (pinning
every step was slower at two query clients on most rounds; with this rule
``bench cpu-pin`` measured load within its A/A noise). Pinned only where the
process owns exactly as many CPUs as the step has threads (``auto``), so
that replicas sharing a larger machine never pile onto the same cores.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("rose.cpu")


def allowed() -> tuple[int, ...]:
    """The CPUs this process may run on, in order (none off Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return ()
    return tuple(sorted(os.sched_getaffinity(0)))


def plan(threads: int, pin: bool | None) -> tuple[int, ...] | None:
    """The CPUs a step of ``threads`` threads runs on (its workers start on
    all but the first), or None to leave them to the scheduler. ``pin``
    None (auto): only where the process's CPUs are exactly that many; True:
    the first ``threads`` of them (None when there are fewer); False:
    never. One thread is never pinned: nothing waits for another."""
    cpus = allowed()
    if pin is False or threads < 2 or len(cpus) < threads:
        return None
    if pin is None and len(cpus) != threads:
        return None
    return cpus[:threads]


def worker_affinities(cpus: tuple[int, ...]) -> str:
    """ONNX Runtime's ``session.intra_op_thread_affinities`` for a plan:
    one entry per worker (1-based ids), the first CPU left to the caller."""
    return ";".join(str(c + 1) for c in cpus[1:])


def threads() -> set[int]:
    """The ids of this process's threads now."""
    return {int(t) for t in os.listdir("/proc/self/task")}


def _getcpu():
    try:
        return ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):  # not glibc or musl
        return None


_GETCPU = _getcpu()

# A step this long after the last one (seconds) is pinned: the gain was
# measured after 20 ms idle; back-to-back steps (concurrent clients) leave
# the scheduler free.
IDLE_S = 0.005


class Workers:
    """One session's intra-op workers, kept off the calling thread's CPU
    around a run that follows an idle spell, free otherwise."""

    def __init__(self, tids: list[int], cpus: tuple[int, ...]):
        self.tids = tids
        self.cpus = cpus
        self._off: int | None = cpus[0]  # the CPU they keep off (worker_affinities'); None: free
        self._last_end = 0.0  # perf_counter when the last run ended

    @classmethod
    def find(cls, before: set[int], cpus: tuple[int, ...]) -> Workers | None:
        """The threads a session made since ``before``, told apart from any
        other new thread by the single CPU its affinities gave each; None
        when they are not all there (the workers then stay where they
        started)."""
        wanted = set(cpus[1:])
        tids = []
        for tid in sorted(threads() - before):
            try:
                mask = os.sched_getaffinity(tid)
            except OSError:  # ended meanwhile
                continue
            if len(mask) == 1 and mask <= wanted:
                tids.append(tid)
        if len(tids) != len(cpus) - 1 or _GETCPU is None:
            log.info("CPU fast path: workers stay on CPUs %s (found %d of %d, sched_getcpu %s)",
                     cpus[1:], len(tids), len(cpus) - 1, "missing" if _GETCPU is None else "present")
            return None
        return cls(tids, cpus)

    @contextmanager
    def placed(self, single: bool) -> Iterator[None]:
        """Around a run: the workers off the calling thread's CPU when the
        step has one sequence (``single``) and ``IDLE_S`` have passed since
        the last run, else free to go where the scheduler puts them."""
        pin = single and time.perf_counter() - self._last_end >= IDLE_S
        cpu = _GETCPU() if pin and _GETCPU is not None else -1
        self._keep_off(cpu if cpu >= 0 else None)
        try:
            yield
        finally:
            self._last_end = time.perf_counter()

    def _keep_off(self, cpu: int | None) -> None:
        """Each worker on one of the plan's CPUs other than ``cpu``; on all
        of them when None. Nothing to do when that is where they are."""
        if cpu == self._off:
            return
        n = len(self.tids)
        masks = [self.cpus] * n if cpu is None else [(c,) for c in self.cpus if c != cpu][:n]
        for tid, mask in zip(self.tids, masks):
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:  # the session is closing
                return
        self._off = cpu
