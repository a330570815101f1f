"""Where results go and what they carry: one JSON and one markdown file per
benchmark in ``bench/results/<date>-<machine>/``, each with the exact command,
the machine, the package versions and the gate records."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
PACKAGES = ("torch", "transformers", "sentence-transformers", "tokenizers", "numpy", "grpcio",
            "fastapi", "uvicorn", "matplotlib")


def _cpuinfo() -> dict:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor()}
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.M)  # x86, ARM
    have = set(flags.group(1).split()) if flags else set()
    return {
        "model": model.group(1).strip() if model else platform.processor(),
        "logical_cpus": text.count("processor\t:"),
        # What the CPU runtimes choose by: bfloat16 (AMX), int8 dot products.
        "simd": [f for f in ("sse4_2", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8",
                             "avx512_vnni", "avx_vnni", "asimd", "asimddp", "bf16", "i8mm") if f in have],
    }


def _memory_gib() -> float | None:
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        return round(kb / 2**20, 1)
    except (OSError, AttributeError):
        return None


def gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict:
    """What the numbers were measured on."""
    return {
        "cpu": _cpuinfo(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "gpu": gpu_name(),
        "loadavg": list(os.getloadavg()),
    }


def machine_tag() -> str:
    gpu = gpu_name()
    if gpu:
        return re.sub(r"[^a-z0-9]+", "-", gpu.lower().replace("nvidia", "")).strip("-")
    return f"cpu-{len(os.sched_getaffinity(0))}core"


def default_dir() -> Path:
    return RESULTS / f"{dt.date.today().isoformat()}-{machine_tag()}"


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except OSError:
        return "unknown"


def versions(extra: dict[str, str] | None = None) -> dict:
    out = {"git": git_commit()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    out.update(extra or {})
    return out


def table(headers: list[str], rows: list[list]) -> str:
    """A markdown table; floats get 3 significant decimals."""
    def cell(v):
        if v is None:
            return "–"
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


class Writer:
    """Writes one benchmark's ``<name>.json`` and ``<name>.md``."""

    def __init__(self, out_dir: Path, command: list[str]):
        self.out_dir = Path(out_dir)
        self.command = command
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, title: str, data: dict, markdown: str, gates: list[dict],
              started: str, extra_versions: dict | None = None) -> Path:
        record = {
            "benchmark": name,
            "command": self.command,
            "started": started,
            "finished": now(),
            "machine": machine(),
            "versions": versions(extra_versions),
            "gates": gates,
            "results": data,
        }
        (self.out_dir / f"{name}.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
        m = record["machine"]
        head = (f"# {title}\n\nCommand: `{' '.join(self.command)}`  \n"
                f"Machine: {m['cpu'].get('model')}, {m['cores_usable']} cores usable, "
                f"{m['memory_gib']} GiB{', GPU ' + m['gpu'] if m['gpu'] else ''}; "
                f"load average at the end {m['loadavg'][0]:.2f}  \n"
                f"Started {started}, git {record['versions']['git']}\n\n")
        gate_md = ""
        if gates:
            gate_md = "\n\nCorrectness gate (run before any timing):\n\n" + table(
                ["side", "reference", "rows", "min cosine / check", "passed"],
                [[g["side"], g["reference"], g["rows"], g.get("min_cosine", g.get("check", g.get("shape"))), g["passed"]]
                 for g in gates])
        path = self.out_dir / f"{name}.md"
        path.write_text(head + markdown.strip() + gate_md + "\n")
        return path


def now() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")
