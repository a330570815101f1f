"""The test side of the launcher: Tulip and Ivy processes as the tests start
them, from ``tulip_rose_cli/launch.py`` and ``processes.py`` (the one
launcher ``tulip-rose serve`` and the benchmarks use too), and ``REPO``,
the repository the tests run in."""

from __future__ import annotations

from pathlib import Path

from tulip_rose_cli.launch import IVY_BIN, TARGET_DIR, Ivy, Tulip, default_model_dir, start_tulips
from tulip_rose_cli.processes import Process, free_port, kill_all, wait_for

REPO = Path(__file__).resolve().parents[2]

__all__ = ["IVY_BIN", "REPO", "TARGET_DIR", "Ivy", "Process", "Tulip", "default_model_dir", "free_port", "kill_all",
           "start_tulips", "wait_for"]
