"""Runs ``bench/crates/loadgen`` (the compiled load generator) from the GPU
charts: the prepared requests go to a JSON file, the latencies come back as
JSON, in the same shape as ``bench.harness.Stats`` (ms)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

STATS = ("count", "p50", "p90", "p99", "mean")


def grpc_input(sequences_per_request: list[list[list[int]]]) -> dict:
    return {"requests": [{"token_ids": [t for s in seqs for t in s], "lengths": [len(s) for s in seqs]}
                         for seqs in sequences_per_request]}


def http_input(bodies: list[dict], path: str = "/v1/embeddings") -> dict:
    return {"path": path, "bodies": bodies}


class Loadgen:
    """The binary; ``run`` returns {level: stats} (+ "floor" when asked)."""

    def __init__(self, binary: Path):
        self.binary = Path(binary)

    def available(self) -> bool:
        return self.binary.is_file()

    def run(self, mode: str, target: str | None, payload: dict, concurrency: list[int], requests: int,
            warmup: int = 3, floor: bool = False, timeout: float = 300) -> dict:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(payload, f)
        try:
            cmd = [str(self.binary), "--mode", mode, "--input", f.name, "--requests", str(requests),
                   "--warmup", str(warmup), "--concurrency", ",".join(map(str, concurrency))]
            if target is not None:
                cmd += ["--target", target]
            if floor:
                cmd.append("--floor")
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        finally:
            Path(f.name).unlink(missing_ok=True)
        if res.returncode != 0:
            raise RuntimeError(f"loadgen failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
        report = json.loads(res.stdout)
        out = {level: _stats(v) for level, v in report["levels"].items()}
        if "floor" in report:
            out["floor"] = _stats(report["floor"])
        return out


def _stats(level: dict) -> dict:
    if level["errors"]:
        raise RuntimeError(f"{level['errors']} requests failed, first: {level['first_error']}")
    return {**{k: level[k] for k in STATS}, "requests_per_s": round(level["requests_per_s"], 2)}
