"""Benchmarks other parts of the project keep as their own scripts in
``bench/``; ``python -m bench <name>`` runs one when it is there, with the
thread count and results folder of this harness, and says so when it is not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.results import REPO

# name → (script, what it measures, extra arguments; {threads} and {out} filled in)
SCRIPTS = {
    "ragged": ("bench/ragged_vs_padded.py", "ROSE's ragged forward vs the transformers padded forward",
               ["--threads", "{threads}", "--out", "{out}"]),
    "balance": ("bench/gateway_balance.py", "Ivy's least-loaded balancing across Tulip replicas",
                ["--out", "{out}"]),
}


def run(name: str, out_dir: Path, threads: int, timeout: float = 3600) -> dict:
    script, what, args = SCRIPTS[name]
    path = REPO / script
    if not path.is_file():
        return {"status": "not available", "reason": f"{script} ({what}) is not in this checkout yet"}
    cmd = [sys.executable, str(path), *(a.format(threads=threads, out=out_dir) for a in args)]
    res = subprocess.run(cmd, cwd=REPO, timeout=timeout)
    return {"status": "ran" if res.returncode == 0 else f"failed (exit {res.returncode})", "command": " ".join(cmd)}
