"""CPU row 1, the tokenizer: delegated to the tokenizer's own benchmark
program (a Rust binary or example whose name contains "bench", in a
workspace package whose name contains "tokenizer", e.g. ``tokenizer-bench``
of ``bench/crates/tokenizer/``), which times the in-house tokenizer against the Hugging Face
``tokenizers`` crate on the same ``tokenizer.json`` in one run and writes
``tokenizer.json`` and ``tokenizer.md`` into the folder given by ``--out``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench.harness.results import REPO

TITLE = "Tokenizer: in-house vs Hugging Face tokenizers (Rust), single thread"


def find_program() -> list[str] | None:
    """The cargo command that runs the tokenizer benchmark, if it exists."""
    try:
        meta = subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if meta.returncode != 0:
        return None
    for pkg in json.loads(meta.stdout)["packages"]:
        if "tokenizer" not in pkg["name"]:
            continue
        for target in pkg["targets"]:
            kind = target["kind"][0]
            if kind in ("bin", "example") and "bench" in target["name"]:
                return ["cargo", "run", "--release", "-p", pkg["name"], f"--{kind}", target["name"], "--"]
    return None


def run_program(out_dir: Path, timeout: float = 600) -> dict:
    """Runs the program into ``out_dir``; returns what happened."""
    cmd = find_program()
    if cmd is None:
        return {"status": "not available",
                "reason": "no tokenizer package with a bin/example named like 'bench' in the workspace yet"}
    cmd = [*cmd, "--out", str(out_dir)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    status = {"status": "ran" if res.returncode == 0 else f"failed (exit {res.returncode})",
              "command": " ".join(cmd), "output_tail": (res.stdout + res.stderr)[-2000:]}
    written = out_dir / "tokenizer.json"
    if res.returncode == 0 and not written.is_file():
        status["status"] = "ran but wrote no tokenizer.json"
    return status


def speedups(out_dir: Path) -> dict[str, float]:
    """p50 speed-up over the Hugging Face crate per workload, from the
    program's ``tokenizer.json`` (``results[*].workload`` and
    ``results[*].p50_speedup``)."""
    path = out_dir / "tokenizer.json"
    if not path.is_file():
        return {}
    rows = json.loads(path.read_text()).get("results", [])
    return {r["workload"]: float(r["p50_speedup"]) for r in rows
            if isinstance(r, dict) and "workload" in r and "p50_speedup" in r}
