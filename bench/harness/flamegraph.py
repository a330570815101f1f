"""Stacks sampled from running processes, folded and drawn as flame graphs:
``perf record`` for native code (Ivy, Tulip's Rust and the interpreter
underneath ROSE), ``py-spy record --native`` for ROSE's Python frames. The
SVG is drawn here (no FlameGraph scripts to install): each frame a box as
wide as its share of the samples, callers below callees, a title per box
with its count."""

from __future__ import annotations

import html
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

# "root;caller;callee" -> samples.
Folded = Counter


def perf_folded(perf_data: Path) -> dict[str, Folded]:
    """Per thread name, the folded stacks of a ``perf record -g`` file
    (innermost frame last; offsets and argument lists dropped)."""
    res = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "comm,ip,sym"],
                         capture_output=True, text=True, timeout=900)
    out: dict[str, Folded] = {}
    comm, frames = None, []
    for line in [*res.stdout.splitlines(), ""]:
        if not line.strip():
            if comm is not None:
                out.setdefault(comm, Counter())[";".join(reversed(frames)) or "[unknown]"] += 1
            comm, frames = None, []
        elif not line[0].isspace():
            comm = line.split()[0]
        else:
            m = re.match(r"\s*[0-9a-f]+\s+(.+)$", line)
            if m:
                frames.append(short_symbol(m.group(1)))
    return out


def pyspy_folded(raw: Path) -> Folded:
    """py-spy's ``--format raw`` output (already folded, outermost first)."""
    out: Folded = Counter()
    for line in Path(raw).read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            out[";".join(short_symbol(f) for f in stack.split(";"))] += int(n)
    return out


def short_symbol(sym: str) -> str:
    """A frame as a reader needs it: no offsets, no generic arguments, no
    closure numbering, no library paths."""
    sym = re.sub(r"\+0x[0-9a-f]+", "", sym)
    sym = re.sub(r"\s*\((?:/|inlined)[^)]*\)\s*$", "", sym)
    prev = None
    while prev != sym:  # innermost generic argument lists first
        prev, sym = sym, re.sub(r"<[^<>]*>", "", sym)
    return sym.replace(";", ",").strip()[:120] or "[unknown]"


class Sampler:
    """``perf record`` (cpu-clock, DWARF unwinding) on some processes and
    ``py-spy record --native`` on others, for the duration of a ``with``
    block; either is skipped, with the reason kept, when unavailable."""

    def __init__(self, out_dir: Path, perf_pids: dict[str, int], pyspy_pids: dict[str, int], seconds: float,
                 rate: int = 1999):
        self.out_dir, self.seconds, self.rate = Path(out_dir), seconds, rate
        self.perf_pids, self.pyspy_pids = perf_pids, pyspy_pids
        self.procs: list[subprocess.Popen] = []
        self.notes: list[str] = []
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def __enter__(self):
        if shutil.which("perf"):
            for name, pid in self.perf_pids.items():
                self.procs.append(subprocess.Popen(
                    ["perf", "record", "-e", "cpu-clock", "-F", str(self.rate), "--call-graph", "dwarf,16384",
                     "-p", str(pid), "-o", str(self.out_dir / f"{name}.perf"), "--", "sleep", str(self.seconds)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        else:
            self.notes.append("perf is not installed: no native profiles")
        # The virtualenv's own py-spy (the bench extra), else one on PATH.
        beside = Path(sys.executable).parent / "py-spy"
        pyspy = str(beside) if beside.is_file() else shutil.which("py-spy")
        if pyspy:
            for name, pid in self.pyspy_pids.items():
                self.procs.append(subprocess.Popen(
                    [pyspy, "record", "--native", "--nonblocking", "-r", str(self.rate), "-p", str(pid), "-f", "raw",
                     "-o", str(self.out_dir / f"{name}.pyspy"), "-d", str(int(self.seconds))],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        else:
            self.notes.append("py-spy is not installed (pip install -e '.[bench]'): no Python profile")
        time.sleep(1.0)  # attached before the load starts
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            try:
                p.wait(self.seconds + 60)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGINT)
                p.wait(30)

    def perf(self, name: str) -> dict[str, Folded]:
        path = self.out_dir / f"{name}.perf"
        return perf_folded(path) if path.is_file() else {}

    def pyspy(self, name: str) -> Folded:
        path = self.out_dir / f"{name}.pyspy"
        return pyspy_folded(path) if path.is_file() else Counter()


def write_svg(folded: Folded, path: Path, title: str, width: int = 1200, row: int = 16) -> None:
    """A flame graph of ``folded`` (roots at the bottom)."""
    total = sum(folded.values())
    tree: dict = {}
    for stack, n in folded.items():
        node = tree
        for frame in stack.split(";"):
            entry = node.setdefault(frame, [0, {}])
            entry[0] += n
            node = entry[1]
    boxes: list[tuple[float, int, float, str, int]] = []

    def place(node: dict, x: float, depth: int) -> int:
        deepest = depth
        for frame, (n, children) in sorted(node.items()):
            w = n / total * width if total else 0
            if w >= 0.3:
                boxes.append((x, depth, w, frame, n))
                deepest = max(deepest, place(children, x, depth + 1))
            x += w
        return deepest

    depth = place(tree, 0.0, 0) + 1
    height = (depth + 2) * row
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" '
             f'font-size="11"><text x="4" y="{row - 3}">{html.escape(title)} ({total} samples)</text>']
    for x, d, w, frame, n in boxes:
        y = height - (d + 1) * row
        hue = 20 + zlib.crc32(frame.encode()) % 40  # stable across runs
        label = html.escape(frame)
        tip = f"{label}: {n} samples, {100 * n / total:.1f}%"
        text = html.escape(frame[: max(int(w / 7) - 1, 0)]) if w > 20 else ""
        parts.append(f'<g><title>{tip}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" '
                     f'fill="hsl({hue},85%,60%)"/><text x="{x + 2:.1f}" y="{y + row - 4}">{text}</text></g>')
    parts.append("</svg>")
    Path(path).write_text("\n".join(parts))


def merged(by_thread: dict[str, Folded]) -> Folded:
    """One process's stacks, each rooted at its thread's name."""
    out: Folded = Counter()
    for thread, folded in by_thread.items():
        for stack, n in folded.items():
            out[f"{thread};{stack}"] += n
    return out
