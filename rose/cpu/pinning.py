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
    """One session's intra-op workers, kept off the calling thread's CPU."""

    def __init__(self, tids: list[int], cpus: tuple[int, ...]):
        self.tids = tids
        self.cpus = cpus
        self._caller = cpus[0]  # where worker_affinities left room
        self.last_end = 0.0  # perf_counter when the last run ended

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

    def follow(self, pin: bool = True) -> None:
        """Before a step: the workers onto the plan's CPUs other than the
        one the calling thread is on, if that one changed; ``pin`` False:
        onto all of the plan's CPUs, for the scheduler to place."""
        cpu = (_GETCPU() if _GETCPU is not None else -1) if pin else -1
        if cpu == self._caller or (pin and cpu < 0):
            return
        others = [(c,) for c in self.cpus if c != cpu][:len(self.tids)] if pin else [self.cpus] * len(self.tids)
        for tid, cpus in zip(self.tids, others):
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:  # the session is closing
                return
        self._caller = cpu
