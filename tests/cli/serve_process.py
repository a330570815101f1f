"""``tulip-rose serve`` as a subprocess, and what the tests check of the
processes it leaves: shared by test_serve.py (the command from the clone)
and test_wheels.py (the command installed from the wheels)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import numpy as np

from tests.support.servers import IVY_BIN, REPO, free_port, wait_for


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children_of(pid: int) -> set[int]:
    """``pid``'s child processes, from /proc."""
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {int(p) for p in (task / "children").read_text().split()}
        except FileNotFoundError:
            pass
    return out


def in_groups(pgids: set[int]) -> dict[int, str]:
    """Live processes (pid: command) whose process group is one of
    ``pgids``: what a child left behind, grandchildren included (serve
    starts each child in its own group)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        comm, rest = text.split("(", 1)[1].rsplit(")", 1)
        fields = rest.split()  # state ppid pgrp ...
        if fields[0] != "Z" and int(fields[2]) in pgids:
            out[int(stat.parent.name)] = comm
    return out


class Serve:
    """``tulip-rose serve ...`` on free ports; stdout is collected by a
    thread, stderr goes to a log file. By default the command of this
    checkout (``python -m tulip_rose_cli`` with the built Ivy); ``command``,
    ``cwd`` and ``base_env`` run another installation of it."""

    def __init__(self, *args: str, log_dir: Path, env: dict[str, str] | None = None,
                 command: list[str] | None = None, cwd: Path = REPO, base_env: dict[str, str] | None = None):
        self.port, self.grpc_port = free_port(), free_port()
        self.log_path = log_dir / f"serve-{self.port}.log"
        self.stdout: list[str] = []
        cmd = [*(command or [sys.executable, "-m", "tulip_rose_cli"]), "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--grpc-port", str(self.grpc_port), *args]
        if base_env is None:
            base_env = {**os.environ, "IVY_BIN": str(IVY_BIN)}
        with open(self.log_path, "wb") as log:
            # The Batch API's default store goes under the user's data
            # directory: here, one of the test's own.
            self.data_dir = log_dir / f"data-{self.port}"
            self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=log, text=True,
                                         env={**base_env, "XDG_DATA_HOME": str(self.data_dir), **(env or {})})
        self.reader = threading.Thread(target=lambda: self.stdout.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180.0) -> None:
        def ready():
            assert self.proc.poll() is None, f"serve exited ({self.proc.returncode}):\n{self.log()[-4000:]}"
            return "Try:\n" in "".join(self.stdout)

        wait_for(ready, "serve to print its banner", timeout=timeout)

    def child_pids(self) -> dict[str, int]:
        """The pids the command logged for its children, by name."""
        return {m[1]: int(m[2]) for m in re.finditer(r"started (\S+) \(pid (\d+)\)", self.log())}

    def left_behind(self) -> dict[int, str]:
        """Live processes of the children's process groups."""
        return in_groups(set(self.child_pids().values()))

    def embed(self, texts: list[str], timeout: float = 60.0) -> np.ndarray:
        req = urllib.request.Request(self.url + "/v1/embeddings", data=json.dumps({"input": texts}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = json.loads(r.read())
        return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)

    def wait(self, timeout: float = 90.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise AssertionError(f"serve did not exit in {timeout}s:\n{self.log()[-4000:]}") from None

    def kill_all(self) -> None:
        """Test cleanup: whatever is left, gone."""
        for pid in [*self.left_behind(), *self.child_pids().values(), self.proc.pid]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()
