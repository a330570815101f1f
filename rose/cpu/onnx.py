"""Small CPU steps on ONNX Runtime (Tulip's "CPU fast path"): the model
exported once to ONNX from ROSE's own definition (``onnx_export.py``) and
run by ONNX Runtime, the CPU analogue of a CUDA graph.

Why: a query's step is ~100 small operators; eager PyTorch pays dispatch
and allocation per operator and fuses nothing, where ONNX Runtime runs a
prebuilt graph. It needs no compiler, and one session with dynamic shapes
serves every bucket at its exact size (no padding). What it measured
against the eager step and against TorchScript and Inductor is in
``docs/latency.md``.

How, as every gated runtime (``gated.py``): steps of at most
``max_tokens`` real tokens (and ``max_sequences`` sequences) of the
model's primary output kind fall into power-of-two token buckets from 16.
A bucket's first step runs eagerly; a background thread builds the
session once (from the export cache, ``cache.py``, or else a child process
exports a fresh float32 copy of the model into it) and gates the bucket
against that eager step. A family the exporter cannot trace stays eager.
With the runtime off nothing of it is imported or started. The export
child ends with its server (``onnx_export.py``: the parent's death
signal), and what it writes stays inside the cache folder.

Bounds: one extra copy of the weights in memory (the session's), the
cache's bound on disk (``cache_max_bytes``), and ONNX Runtime's working
memory for steps of at most ``max_tokens`` tokens.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..interface import Batch
from . import pinning
from .cache import DEFAULT_MAX_BYTES, ExportCache, export_key, python_env_for_child
from .gated import Context, GatedRuntime, float32_cpu_refusal, power_of_two_bucket, power_of_two_buckets
from .onnx_export import INPUTS, SEQUENCES_DEFAULT, TOKENS_DEFAULT

# Longest an export may take (seconds): generous, for a large model on a
# small, busy machine; a stuck export fails its build instead of hanging it.
EXPORT_TIMEOUT_S = 1800

log = logging.getLogger("rose.cpu")


def missing() -> str | None:
    """Why the runtime cannot run here (a package is missing), or None."""
    # Looked up, not imported: the exporter is imported by the first build.
    for module in ("onnxruntime", "onnxscript", "onnx"):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{module} is not installed (pip install 'tulip-rose[cpu-fast]')"
    return None


@dataclass(frozen=True)
class OnnxSettings:
    """Which steps ONNX Runtime takes and how it runs them."""

    # Largest step (real tokens); larger ones go to the next runtime. None:
    # 256, and no ONNX Runtime at all beside the bfloat16 twin (``refusal``).
    max_tokens: int | None = None
    max_sequences: int = SEQUENCES_DEFAULT
    min_bucket: int = 16
    threads: int = 0  # ONNX Runtime intra-op threads; 0 = torch's thread budget
    # Sleeping threads pay a wake-up per operator; spinning ones (stopped
    # as each run returns: force_spinning_stop) pay none but take the cores
    # Ivy's and Tulip's own threads need (docs/latency.md: what it measured).
    spin: bool = False
    # The step's threads on fixed CPUs (pinning.py); None: where the process
    # has exactly as many CPUs as the session has threads.
    pin: bool | None = None
    cache_dir: str | None = None  # the exports' folder (cache.py); None: the user's cache
    cache_max_bytes: int = DEFAULT_MAX_BYTES  # the most the folder holds; 0 keeps no export

    def __post_init__(self):
        if (self.max_tokens is not None and self.max_tokens < 1) or self.max_sequences < 1 or self.min_bucket < 1:
            raise ValueError("CPU fast path limits must be positive")
        if self.cache_max_bytes < 0:
            raise ValueError("the export cache's bound must be 0 or more bytes")

    def cache(self) -> ExportCache:
        return ExportCache(self.cache_dir, self.cache_max_bytes)

    def session_threads(self) -> int:
        """ONNX Runtime's intra-op threads: ``threads``, else torch's budget."""
        return self.threads or torch.get_num_threads()

    def plan(self) -> dict[str, int]:
        """What the export's shapes depend on (part of its cache key)."""
        return {"max_tokens": self.max_tokens or TOKENS_DEFAULT, "max_sequences": self.max_sequences}

    def resolved(self) -> OnnxSettings:
        """``max_tokens`` decided: 256 unless set."""
        return self if self.max_tokens is not None else dataclasses.replace(self, max_tokens=TOKENS_DEFAULT)

    def bucket(self, tokens: int) -> int | None:
        """The bucket (a power of two) of a step of ``tokens`` real tokens,
        or None when the step is too large for this runtime."""
        if self.max_tokens is None or tokens > self.max_tokens:
            return None
        return power_of_two_bucket(tokens, self.min_bucket)

    def buckets(self) -> list[int]:
        return power_of_two_buckets(self.min_bucket, self.max_tokens or TOKENS_DEFAULT)

    def warm_steps(self) -> list[int]:
        """Step sizes (tokens) that reach every bucket: the last one's is
        ``max_tokens`` when that is not a power of two."""
        top = self.max_tokens or TOKENS_DEFAULT
        return [min(b, top) for b in self.buckets()]


class OnnxRuntime(GatedRuntime[Any]):  # a Session (defined below)
    """The ONNX Runtime session of one model and its buckets' states."""

    name = "onnx"
    title = "CPU fast path"
    Settings = OnnxSettings

    @classmethod
    def refusal(cls, ctx: Context, settings: OnnxSettings, beside: tuple[str, ...]) -> str | None:
        why = float32_cpu_refusal(ctx) or missing()
        if why is None and "bf16" in beside and settings.max_tokens is None:
            # Served on the 2-core Intel VM (bench/results/2026-12-05-cpu-2core,
            # queries-ab), queries on the twin alone answered sooner after an
            # idle spell than on ONNX Runtime's threads.
            why = ("the bfloat16 twin takes small steps too (fewer threads to wake per query; "
                   "--cpu-fast-path-max-tokens N gives steps of up to N tokens to ONNX Runtime)")
        # A read-only or missing disk: off, one line, and the start goes on.
        return why or settings.cache().problem()

    def __init__(self, ctx: Context, settings: OnnxSettings | None = None):
        super().__init__(ctx, (settings or OnnxSettings()).resolved())
        self.model_dir = Path(ctx.spec.path)
        _import_onnxruntime()

    def key(self, batch: Batch) -> int | None:
        """The bucket of a step this runtime may take, or None."""
        if batch.kind is not self.kind or batch.layout.sequences > self.settings.max_sequences:
            return None
        return self.settings.bucket(batch.layout.tokens)

    def cached(self) -> bool:
        return self.settings.cache().has(self.cache_key())

    def cache_key(self) -> str:
        """The key of the cache entry this runtime's session is opened from."""
        return export_key(self.model_dir, self.settings.plan())[0]

    def _load(self):
        # The serving model's layers are packed for oneDNN and bound to the
        # serving attention backend: a fresh copy is exported.
        return _session(self.model_dir, self.settings)

    def _execute(self, batch: Batch) -> torch.Tensor:
        session = self._runtime
        assert session is not None  # _build loads it before any step runs here
        return torch.from_numpy(session.run(_feed(batch), single=batch.layout.sequences == 1))


@dataclass
class Session:
    """An ONNX Runtime session and, where its threads are pinned, its
    workers (kept off the calling thread's CPU around a run that follows
    an idle spell: pinning.py)."""

    ort: Any  # an onnxruntime.InferenceSession (untyped)
    workers: pinning.Workers | None = None

    def run(self, feed: dict[str, np.ndarray], single: bool = True) -> np.ndarray:
        """The first output; ``single``: the step has one sequence (only
        such steps are pinned: pinning.py)."""
        if self.workers is None:
            return self.ort.run(None, feed)[0]
        with self.workers.placed(single):
            return self.ort.run(None, feed)[0]


def _session(model_dir: Path, settings: OnnxSettings):
    """An ONNX Runtime session of the model's export: the cached one, else
    one exported now (in a child process) into the cache."""
    key, meta = export_key(model_dir, settings.plan())
    return cached_session(settings, key, meta, lambda staging: _export(model_dir, staging, settings),
                          "CPU fast path", "export", "exported")


# One build at a time in a process: the runtimes that read the same export
# (the float32 session and its int8 copy, int8.py) build side by side, and
# the second finds the first's export in the cache instead of making it
# again; eviction happens under it too.
_BUILDS = threading.RLock()


def cached_session(settings: OnnxSettings, key: str, meta: dict, make: Callable[[Path], None], title: str,
                   what: str, made: str):
    """A ``Session`` of the cache's entry ``key``: the cached
    one, else one ``make(staging)`` writes now (``staging/model.onnx``).
    ``title``, ``what`` and ``made`` word its log lines ("CPU fast path:
    export reused from the cache", "...: exported into the cache")."""
    cache = settings.cache()
    with _BUILDS:
        entry = cache.lookup(key)
        if entry is not None:
            try:
                session = _open(entry / "model.onnx", settings)
                log.info("%s: %s reused from the cache (%s)", title, what, entry)
                return session
            except Exception as e:  # unreadable, or evicted by another process meanwhile
                log.warning("%s: the cached %s %s does not load (%s); making it again", title, what, entry, e)
                shutil.rmtree(entry, ignore_errors=True)
        entry = _make(cache, key, meta, make)
        try:
            session = _open(entry / "model.onnx", settings)
        except Exception:  # an export no session takes is not kept
            shutil.rmtree(entry, ignore_errors=True)
            raise
        size = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
        evicted = cache.evict(keep=entry)
    log.info("%s: %s into the cache (%s, %d MB)%s", title, made, entry, size >> 20,
             f"; evicted {len(evicted)} older export(s) to stay within {cache.max_bytes} bytes" if evicted else "")
    return session


def export_entry(model_dir: Path, settings: OnnxSettings) -> Path:
    """The cache's folder of the model's float32 export (what ``int8.py``
    quantizes): the cached one, else one exported now."""
    key, meta = export_key(model_dir, settings.plan())
    with _BUILDS:
        entry = settings.cache().lookup(key)
        return entry if entry is not None else _make(settings.cache(), key, meta,
                                                     lambda staging: _export(model_dir, staging, settings))


def _make(cache: ExportCache, key: str, meta: dict, make: Callable[[Path], None]) -> Path:
    staging = cache.staging()
    try:
        make(staging)
        return cache.commit(staging, key, meta)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _export(model_dir: Path, staging: Path, settings: OnnxSettings) -> None:
    """Runs the export child, which writes ``staging/model.onnx``."""
    run_child("rose.cpu.onnx_export", [str(model_dir), str(staging / "model.onnx"), "--max-tokens",
                                       str(settings.max_tokens), "--max-sequences", str(settings.max_sequences)],
              staging, "export")


def run_child(module: str, args: list[str], staging: Path, what: str) -> None:
    """Runs ``python -m module args``, which writes ``staging/model.onnx``
    and its temporary files under ``staging`` alone, and ends if this
    process does (``--parent``)."""
    path, tmp = staging / "model.onnx", staging / "tmp"
    tmp.mkdir()
    env = python_env_for_child()
    env["TMPDIR"] = str(tmp)
    res = subprocess.run([sys.executable, "-m", module, *args, "--parent", str(os.getpid())],
                         capture_output=True, text=True, env=env, timeout=EXPORT_TIMEOUT_S)
    shutil.rmtree(tmp, ignore_errors=True)
    if res.returncode != 0 or not path.is_file():
        lines = [x.strip() for x in (res.stderr or res.stdout).splitlines() if x.strip()]
        # The exception's own line, not the exporter's closing advice.
        errors = [x for x in lines if re.match(r"^[\w.]*(Error|Exception)\b", x)]
        why = (errors or lines or ["no output"])[-1]
        raise RuntimeError(f"{what} failed (exit {res.returncode}): {why}")


def _import_onnxruntime():
    """onnxruntime, imported with its telemetry off unless the environment
    says otherwise (``ORT_DISABLE_TELEMETRY``): on, its import writes a
    session file into TMPDIR and a device id and event database under
    ``$XDG_CACHE_HOME/Microsoft``, and events leave the machine. Imported
    here, at the engine's construction on the host's main thread, before a
    server's threads start: changing the environment is not thread-safe.
    The export child inherits the setting."""
    if "onnxruntime" not in sys.modules:
        os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import onnxruntime

    return onnxruntime


def _open(path: Path, settings: OnnxSettings) -> Session:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    threads = settings.session_threads()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.spin else "0")
    if settings.spin:
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    cpus = pinning.plan(threads, settings.pin)
    if cpus is not None:
        opts.add_session_config_entry("session.intra_op_thread_affinities", pinning.worker_affinities(cpus))
        before = pinning.threads()
    opts.log_severity_level = 3
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    fixed = [i.name for i in session.get_inputs() if isinstance(i.shape[0], int)]
    if fixed:  # the model loops in Python over a size: the trace fixed it
        raise RuntimeError(f"the export fixed the size of {', '.join(fixed)}: this family's step depends on "
                           "Python control flow over its sizes")
    return Session(session, pinning.Workers.find(before, cpus) if cpus is not None else None)


def _feed(batch: Batch) -> dict[str, np.ndarray]:
    feed = {k: batch.numpy_field(k) for k in INPUTS}
    feed["inv_len"] = feed["inv_len"].view(np.float32)
    return feed
