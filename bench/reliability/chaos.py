"""Chaos during a bulk job: documents embedded through Ivy in batches while
a Tulip replica is killed (SIGKILL) and restarted every few seconds, and
each replica once stopped with SIGTERM (drained) and restarted. The job's
output must equal a calm run's, and no client request may fail."""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.harness import inputs
from bench.harness.results import REPO
from tulip_rose_cli.launch import Tulip


@dataclass
class BulkRun:
    """What a bulk job produced and what it met on the way."""

    vectors: np.ndarray
    requests: int = 0
    failed_attempts: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def documents(n: int) -> list[str]:
    """``n`` real English documents, each different (lines of the corpus
    joined in a rotating window)."""
    lines = inputs.english_lines()
    return [" ".join(lines[(i + k) % len(lines)] for k in range(1 + i % 3)) for i in range(n)]


def bulk_embed(port: int, texts: list[str], batch: int = 100) -> BulkRun:
    """The bulk job: the ``tulip-rose embed`` command (a subprocess, its
    default concurrency and retries) over a file of ``texts``, one per line,
    in batches of ``batch``. Every retry it prints is a client request that
    failed; the command itself fails only when retrying could not help."""
    with tempfile.TemporaryDirectory(prefix="rel-bulk-") as tmp:
        src, out = Path(tmp) / "docs.txt", Path(tmp) / "vectors.npy"
        src.write_text("".join(t.replace("\n", " ") + "\n" for t in texts), encoding="utf-8")
        cmd = [sys.executable, "-m", "tulip_rose_cli", "embed", str(src), "--out", str(out),
               "--url", f"http://127.0.0.1:{port}", "--batch-size", str(batch), "--strict"]
        started = time.monotonic()
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=7200)
        seconds = round(time.monotonic() - started, 1)
        retries = [line for line in res.stderr.splitlines() if line.startswith("retrying in")]
        if res.returncode != 0:
            raise RuntimeError(f"tulip-rose embed exited {res.returncode}: {res.stderr[-2000:]}")
        vectors = np.load(out)
    return BulkRun(vectors, requests=-(-len(texts) // batch) + len(retries),
                   failed_attempts=[{"message": line[:300]} for line in retries], seconds=seconds)


class Chaos:
    """Kills and restarts replicas (in place in ``replicas``, same ports)
    on a thread: the schedule starts with a SIGKILL, then a SIGTERM restart
    of replica 0, a SIGKILL, a SIGTERM restart of replica 1, and SIGKILLs
    from then on, one event every ``every`` seconds after the previous
    replica is serving again."""

    def __init__(self, replicas: list[Tulip], every: float, seed: int = 0, **tulip_args):
        self.replicas = replicas
        self.every = every
        self.rng = random.Random(seed)
        self.tulip_args = tulip_args
        self.events: list[dict] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def _schedule(self, k: int) -> tuple[str, int]:
        if k in (1, 3) and k // 2 < len(self.replicas):
            return "SIGTERM", k // 2
        return "SIGKILL", self.rng.randrange(len(self.replicas))

    def _run(self) -> None:
        try:
            self._events()
        except Exception as e:  # reported with the results; the job goes on
            self.error = f"{type(e).__name__}: {e}"

    def _events(self) -> None:
        k = 0
        while not self._stop.wait(self.every):
            how, i = self._schedule(k)
            old = self.replicas[i]
            t = time.monotonic()
            if how == "SIGKILL":
                old.kill()
            else:
                old.stop(timeout=60)
            down = time.monotonic()
            self.replicas[i] = Tulip(old.model_dir, port=old.port, **self.tulip_args)
            self.events.append({"t": round(t - self.t0, 1), "signal": how, "replica": i,
                                "stop_s": round(down - t, 2), "restart_s": round(time.monotonic() - down, 2)})
            k += 1

    def __enter__(self):
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def compare(calm: np.ndarray, chaos: np.ndarray) -> dict:
    """Per-vector cosine of the chaos run's output to the calm run's."""
    if calm.shape != chaos.shape:
        return {"same_shape": False, "calm_shape": list(calm.shape), "chaos_shape": list(chaos.shape)}
    cos = np.sum(calm * chaos, axis=1) / (np.linalg.norm(calm, axis=1) * np.linalg.norm(chaos, axis=1))
    return {"same_shape": True, "rows": len(cos), "min_cosine": float(cos.min()),
            "below_0.99999": int((cos < 0.99999).sum())}


def run(ivy, replicas: list[Tulip], *, docs: int, every: float, batch: int = 100, **tulip_args) -> dict:
    texts = documents(docs)
    calm = bulk_embed(ivy.port, texts, batch)
    with Chaos(replicas, every, **tulip_args) as chaos:
        wild = bulk_embed(ivy.port, texts, batch)
    return {
        "params": {"documents": docs, "batch": batch, "event_every_s": every},
        "calm": {"seconds": calm.seconds, "requests": calm.requests, "failed_attempts": calm.failed_attempts},
        "chaos": {"seconds": wild.seconds, "requests": wild.requests, "failed_attempts": wild.failed_attempts,
                  "events": chaos.events, "chaos_error": chaos.error},
        "failed_client_requests": len(wild.failed_attempts),
        "output": compare(calm.vectors, wild.vectors),
    }
