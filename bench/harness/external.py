"""Benchmarks other parts of the project keep as their own scripts in
``bench/scripts/``; ``python -m bench <name>`` runs one when it is there, with
the thread count and results folder of this harness, and says so when it is
not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.harness.results import REPO

# name → (module, what it measures, extra arguments; {threads} and {out} filled in)
SCRIPTS = {
    "ragged": ("bench.scripts.ragged_vs_padded", "ROSE's ragged forward vs the transformers padded forward",
               ["--threads", "{threads}", "--out", "{out}"]),
    "balance": ("bench.scripts.gateway_balance", "Ivy's least-loaded balancing across Tulip replicas",
                ["--out", "{out}"]),
}


def run(name: str, out_dir: Path, threads: int, timeout: float = 3600) -> dict:
    module, what, args = SCRIPTS[name]
    if not (REPO / (module.replace(".", "/") + ".py")).is_file():
        return {"status": "not available", "reason": f"{module} ({what}) is not in this checkout yet"}
    cmd = [sys.executable, "-m", module, *(a.format(threads=threads, out=out_dir) for a in args)]
    res = subprocess.run(cmd, cwd=REPO, timeout=timeout)
    return {"status": "ran" if res.returncode == 0 else f"failed (exit {res.returncode})", "command": " ".join(cmd)}
