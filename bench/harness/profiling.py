"""Where the time goes, measured rather than guessed: ``perf record`` on
running server processes (Rust symbols come from the release profile's debug
info), and pyinstrument on ROSE's step in-process (Python-level frames)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path


class PerfRecord:
    """``perf record`` attached to ``pids`` for the duration of a ``with``
    block. ``available`` is False (and the block runs unprofiled) without a
    usable perf."""

    def __init__(self, pids: list[int], out: Path, freq: int = 1999):
        self.pids, self.out, self.freq = pids, Path(out), freq
        self.available = shutil.which("perf") is not None
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None if self.available else "perf is not installed"

    def __enter__(self):
        if self.available:
            self.proc = subprocess.Popen(
                ["perf", "record", "-F", str(self.freq), "-g", "-o", str(self.out),
                 "-p", ",".join(map(str, self.pids))],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(0.5)  # attached before the block starts
            if self.proc.poll() is not None:
                self.error = self.proc.stderr.read().decode(errors="replace")[-500:]
                self.available = False
        return self

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def top(self, limit: int = 25, min_percent: float = 0.7) -> list[dict]:
        """The hottest (process, library, symbol) triples, self time."""
        if not self.available or not self.out.is_file():
            return []
        res = subprocess.run(
            ["perf", "report", "-i", str(self.out), "--stdio", "--no-children", "-g", "none",
             "--sort", "comm,dso,symbol", "--percent-limit", str(min_percent)],
            capture_output=True, text=True, timeout=300)
        rows = []
        for line in res.stdout.splitlines():
            m = re.match(r"^\s+([\d.]+)%\s+(\S+)\s+(\S+)\s+\[[.k]\]\s+(.+)$", line)
            if m:
                rows.append({"percent": float(m.group(1)), "thread": m.group(2), "dso": m.group(3),
                             "symbol": _symbol(m.group(4))})
        return rows[:limit]


def _symbol(raw: str) -> str:
    """One line, without the empty trailing columns perf pads with."""
    return re.sub(r"(\s+-)+\s*$", "", re.sub(r"\s+", " ", raw)).strip()[:110]


def perf_table(rows: list[dict], error: str | None) -> str:
    """Markdown for the hottest symbols, or why there are none."""
    from bench.harness.results import table

    if not rows:
        return f"(no perf profile: {error})"
    return ("perf, self time (share of all samples in these processes):\n\n"
            + table(["%", "thread", "library", "symbol"],
                    [[r["percent"], r["thread"], r["dso"], r["symbol"]] for r in rows]))


def by_thread(rows: list[dict]) -> dict[str, float]:
    """Total sampled percent per thread name."""
    out: dict[str, float] = {}
    for r in rows:
        out[r["thread"]] = round(out.get(r["thread"], 0.0) + r["percent"], 2)
    return out


def profile_step(model_dir: str, sequences: list[list[int]], steps: int = 2000) -> dict:
    """ROSE's step as Tulip calls it (``step_arena`` → ``release``), timed
    and profiled with pyinstrument."""
    import torch

    from rose import Batch, Engine

    torch.set_num_threads(1)
    engine = Engine.from_dir(model_dir, device="cpu")
    # The arena Tulip builds outside the GIL: options already resolved.
    n = len(sequences)
    arena = Batch.from_lists(sequences, dimensions=[engine.info.dimension] * n,
                             normalize=[engine.info.normalize_default] * n).arena.numpy().tobytes()
    tokens = sum(len(s) for s in sequences)

    def one():
        engine.step_arena(bytearray(arena), n, tokens, "dense")[0].release()

    for _ in range(100):
        one()
    start = time.perf_counter()
    for _ in range(steps):
        one()
    per_step_ms = (time.perf_counter() - start) / steps * 1e3
    out = {"steps": steps, "mean_ms_per_step": round(per_step_ms, 4)}
    try:
        from pyinstrument import Profiler
    except ImportError:
        out["profile"] = "pyinstrument is not installed (pip install -e '.[bench]')"
        return out
    prof = Profiler(interval=0.0001)
    prof.start()
    for _ in range(steps):
        one()
    prof.stop()
    out["profile"] = prof.output_text(unicode=False, color=False, show_all=False)
    return out


def thread_times(pid: int) -> dict[int, tuple[str, float, int]]:
    """Per thread of a running process: (name, seconds it has run on a CPU
    (schedstat: nanoseconds, not clock ticks), voluntary context switches:
    each a sleep that needed a wake-up)."""
    import os

    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            ran_ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        # The name may hold spaces and parentheses: fields follow the last ')'.
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        out[int(tid)] = (name, ran_ns / 1e9, switches)
    return out


def thread_use(before: dict, after: dict, calls: int) -> list[dict]:
    """What each thread spent between two ``thread_times`` snapshots, per
    call: CPU milliseconds and voluntary context switches (busiest first)."""
    rows = []
    for tid, (name, cpu, switches) in after.items():
        cpu0, sw0 = before.get(tid, (name, 0.0, 0))[1:]
        if cpu > cpu0 or switches > sw0:
            rows.append({"thread": name, "tid": tid, "cpu_ms": round((cpu - cpu0) * 1e3 / calls, 4),
                         "switches": round((switches - sw0) / calls, 2)})
    return sorted(rows, key=lambda r: -r["cpu_ms"])
