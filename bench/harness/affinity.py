"""Pinning whole processes (every thread, and their children) to one CPU, so
a benchmark can run a client and its servers on a single core and see how
much of a latency is wake-ups between cores."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def threads(pid: int) -> list[int]:
    """Thread ids of ``pid`` and of its descendants (uvicorn workers, say)."""
    out, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except FileNotFoundError:
            continue
        out += tids
        for t in tids:
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                pass
    return out


def _set(tid: int, cpus: set[int]) -> None:
    try:
        os.sched_setaffinity(tid, cpus)
    except (ProcessLookupError, PermissionError):
        pass  # exited meanwhile; a thread that cannot move keeps its CPUs


@contextmanager
def one_core(pids: list[int]) -> Iterator[int]:
    """Pins this process and every thread of ``pids`` to the lowest CPU this
    process may use; restores each thread's CPUs afterwards. Threads
    started meanwhile inherit the pin and keep it."""
    cpu = min(os.sched_getaffinity(0))
    # The servers may be this process's children: each thread once, so
    # its saved CPUs are the ones it had before.
    tids = dict.fromkeys(threads(os.getpid()) + [t for p in pids for t in threads(p)])
    saved = {}
    for t in tids:
        try:
            saved[t] = os.sched_getaffinity(t)
        except ProcessLookupError:
            continue
        _set(t, {cpu})
    try:
        yield cpu
    finally:
        for t, cpus in saved.items():
            _set(t, cpus)
