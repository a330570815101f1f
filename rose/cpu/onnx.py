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
session once (a child process exports a fresh float32 copy of the model,
then the session loads it and the temporary files go) and gates the
bucket against that eager step. A family the exporter cannot trace stays
eager. With the runtime off nothing of it is imported or started.

Bounds: one extra copy of the weights in memory (the session's), the ONNX
files on disk only while the session loads, and ONNX Runtime's working
memory for steps of at most ``max_tokens`` tokens.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..interface import Batch
from .gated import Context, GatedRuntime, float32_cpu_refusal, power_of_two_bucket, power_of_two_buckets
from .onnx_export import INPUTS, SEQUENCES_DEFAULT, TOKENS_DEFAULT

# Longest an export may take (seconds): generous, for a large model on a
# small, busy machine; a stuck export fails its build instead of hanging it.
EXPORT_TIMEOUT_S = 1800


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

    def __post_init__(self):
        if (self.max_tokens is not None and self.max_tokens < 1) or self.max_sequences < 1 or self.min_bucket < 1:
            raise ValueError("CPU fast path limits must be positive")

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


class OnnxRuntime(GatedRuntime[Any]):  # an onnxruntime.InferenceSession (untyped)
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
        return why

    def __init__(self, ctx: Context, settings: OnnxSettings | None = None):
        super().__init__(ctx, (settings or OnnxSettings()).resolved())
        self.model_dir = Path(ctx.spec.path)

    def key(self, batch: Batch) -> int | None:
        """The bucket of a step this runtime may take, or None."""
        if batch.kind is not self.kind or batch.layout.sequences > self.settings.max_sequences:
            return None
        return self.settings.bucket(batch.layout.tokens)

    def _load(self):
        # The serving model's layers are packed for oneDNN and bound to the
        # serving attention backend: a fresh copy is exported.
        return _session(self.model_dir, self.settings)

    def _execute(self, batch: Batch) -> torch.Tensor:
        session = self._runtime
        assert session is not None  # _build loads it before any step runs here
        return torch.from_numpy(session.run(None, _feed(batch))[0])


def _session(model_dir: Path, settings: OnnxSettings):
    """Exports the model in a child process into a temporary directory and
    loads it into an ONNX Runtime session; the files go once it is loaded."""
    import onnxruntime as ort

    tmp = Path(tempfile.mkdtemp(prefix="rose-cpufast-"))
    try:
        path = tmp / "model.onnx"
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        res = subprocess.run([sys.executable, "-m", "rose.cpu.onnx_export", str(model_dir), str(path),
                              "--max-tokens", str(settings.max_tokens), "--max-sequences", str(settings.max_sequences)],
                             capture_output=True, text=True, env=env, timeout=EXPORT_TIMEOUT_S)
        if res.returncode != 0 or not path.is_file():
            lines = [x.strip() for x in (res.stderr or res.stdout).splitlines() if x.strip()]
            # The exception's own line, not the exporter's closing advice.
            errors = [x for x in lines if re.match(r"^[\w.]*(Error|Exception)\b", x)]
            why = (errors or lines or ["no output"])[-1]
            raise RuntimeError(f"export failed (exit {res.returncode}): {why}")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = settings.threads or torch.get_num_threads()
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.spin else "0")
        if settings.spin:
            opts.add_session_config_entry("session.force_spinning_stop", "1")
        opts.log_severity_level = 3
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        fixed = [i.name for i in session.get_inputs() if isinstance(i.shape[0], int)]
        if fixed:  # the model loops in Python over a size: the trace fixed it
            raise RuntimeError(f"the export fixed the size of {', '.join(fixed)}: this family's step depends on "
                               "Python control flow over its sizes")
        return session
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _feed(batch: Batch) -> dict[str, np.ndarray]:
    feed = {k: batch.numpy_field(k) for k in INPUTS}
    feed["inv_len"] = feed["inv_len"].view(np.float32)
    return feed
