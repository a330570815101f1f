"""Child processes, the one way this repository starts, watches and stops
them: ``tulip-rose serve`` (its Tulip replicas and Ivy), the tests and the
benchmarks (``launch.py`` builds Tulip's and Ivy's command lines on top).

A child's output goes either to a log file (read back when it fails) or,
line by line, to a callback that forwards it (``serve`` prefixes each line
with the child's name), keeping the last lines to explain an exit."""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable

# Log lines of a forwarded child kept to explain its exit.
TAIL_LINES = 40


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free on 127.0.0.1 now and not handed out before in this
    process: the kernel may give a just-closed port again, and a process's
    two ports (gRPC and metrics) must differ."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_for(predicate, what: str, timeout: float = 60.0, every: float = 0.1):
    """Polls ``predicate`` until it returns something true (returned) or
    fails after ``timeout`` seconds, naming ``what`` it waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn``: SIGTERM to the child when its parent dies (Linux's
    PR_SET_PDEATHSIG), so a SIGKILLed ``serve`` leaves no replica behind.
    Loaded before any fork. The signal comes when the *thread* that forked
    the child exits, so only a long-lived thread may start such a child
    (``serve`` starts them all from its main thread)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    PR_SET_PDEATHSIG = 1

    def preexec():
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    return preexec


def group_members(pgid: int) -> set[int]:
    """Live processes (zombies aside) of process group ``pgid``: on Linux
    from /proc, elsewhere whether the group answers a signal at all."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").is_file():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return set()
        except PermissionError:
            pass
        return {pgid}
    out = set()
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state ppid pgrp ...
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.add(int(stat.parent.name))
    return out


def end_group(pgid: int, timeout: float = 10.0) -> set[int]:
    """Waits until process group ``pgid`` (a child started with
    ``own_group`` and what it started) is empty, then SIGKILLs what is
    left after ``timeout`` seconds: a child's own children end with it
    (their parent's death signal) and are given that long. What had to be
    killed."""
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = group_members(pgid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


# Every child not yet stopped, so an emergency exit (a watchdog) can end
# them even while one is still starting.
_LIVE: set["Process"] = set()


def kill_all() -> None:
    """Kills every child process this module started and did not stop."""
    for p in list(_LIVE):
        p.kill()


class Process:
    """A child process. Its output goes to ``log_dir/<name>-....log``, or,
    with ``on_line``, is read line by line and handed to ``on_line(line)``
    once ``forward()`` is called (after every sibling is forked, so that no
    child is forked while a reader thread holds a lock).

    ``env`` adds to this process's environment and ``unset`` removes names
    from it. ``own_group`` starts the child in its own process group (a
    terminal's Ctrl-C then reaches the parent alone); ``preexec`` runs in
    the child before it starts (``die_with_parent()``)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str] | None = None, log_dir: Path | None = None,
                 *, on_line: Callable[[str], None] | None = None, unset: tuple[str, ...] = (),
                 own_group: bool = False, preexec: Callable[[], None] | None = None):
        if (log_dir is None) == (on_line is None):
            raise ValueError("a Process needs exactly one of log_dir (a log file) or on_line (forwarded lines)")
        self.name = name
        self.cmd = cmd
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.reader: threading.Thread | None = None
        self._on_line = on_line
        full_env = {k: v for k, v in os.environ.items() if k not in unset}
        full_env.update(env or {})
        self.log_path: Path | None = None
        self._log: IO[bytes] | None = None
        out: int | IO[bytes]
        stdin: int | None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            self.log_path = log_dir / f"{name}-{os.getpid()}-{time.monotonic_ns()}.log"
            self._log = open(self.log_path, "wb")
            out, stdin = self._log, None
        else:
            out, stdin = subprocess.PIPE, subprocess.DEVNULL
        # process_group is Python 3.11's: asked only by serve, as before.
        group: dict[str, Any] = {"process_group": 0} if own_group else {}
        self.proc = subprocess.Popen(cmd, stdin=stdin, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                     preexec_fn=preexec, **group)
        _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def forward(self) -> None:
        """Starts handing the child's output lines to ``on_line``."""
        def run():
            for raw in self.proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.tail.append(line)
                self._on_line(line)

        self.reader = threading.Thread(target=run, name=f"log-{self.name}", daemon=True)
        self.reader.start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exited(self) -> bool:
        return not self.alive()

    def log(self) -> str:
        """What the child printed: its log file, or the last lines kept."""
        if self._log is not None:
            if not self._log.closed:  # closed once stopped; the file stays
                self._log.flush()
            assert self.log_path is not None  # set with _log
            return self.log_path.read_text(errors="replace")
        if self.reader is not None:
            self.reader.join(timeout=2)  # the pipe's last lines
        return "\n".join(self.tail) or "(no output)"

    def why(self) -> str:
        """How it ended, e.g. 'exited with status 2' or 'was killed by SIGKILL'."""
        rc = self.proc.returncode
        if rc is not None and rc < 0:
            try:
                return f"was killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"was killed by signal {-rc}"
        return f"exited with status {rc}"

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0, signalled: bool = False) -> int | None:
        """SIGTERM (unless ``signalled`` already: a second one could cut
        Tulip's drain short), then SIGKILL if it does not exit in
        ``timeout`` seconds. Returns its exit status."""
        if not signalled:
            self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._closed()
        return self.proc.returncode

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._closed()

    def _closed(self) -> None:
        if self._log is not None:
            self._log.close()
        _LIVE.discard(self)

    def wait_until(self, ready, timeout: float, what: str) -> None:
        """Polls ``ready`` until true; the process is stopped when it exits
        early, when ``ready`` raises (a broken client never becomes ready),
        or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise RuntimeError(
                        f"{self.name} exited ({self.proc.returncode}) before {what}:\n{self.log()[-4000:]}")
                if ready():
                    return
                time.sleep(0.1)
            raise RuntimeError(f"{self.name} not {what} after {timeout}s:\n{self.log()[-4000:]}")
        except BaseException:
            self.stop(timeout=5)
            raise
