"""The fast path for small CPU steps: the model exported once to ONNX from
ROSE's own definition and run by ONNX Runtime, the CPU analogue of the
CUDA graphs of ``rose/graphs.py``.

Why: a query's step is ~100 small operators; eager PyTorch pays dispatch
and allocation per operator and fuses nothing. On the 2-core AMD EPYC
development VM (loaded, interleaved, one thread, a 28-token MiniLM query)
ONNX Runtime on ROSE's export took 8.6 ms of CPU where the eager step took
12.5 ms, while TorchScript (trace + freeze) and Inductor (static shapes,
freezing; 11-50 s to compile a bucket, and a C++ compiler at run time)
were no faster than eager. ONNX Runtime needs no compiler, and one session
with dynamic shapes serves every bucket at its exact size (no padding).

How, mirroring the CUDA graphs: steps of at most ``max_tokens`` real tokens
(and ``max_sequences`` sequences) of the model's primary output kind fall
into token-count buckets (powers of two from 16). A bucket's first step
runs eagerly and its input and output are kept; a background thread builds
the runtime (once per model: a child process exports a fresh float32 copy
of the model, so the exporter's memory and its seconds of Python holding
the GIL stay out of the server; then the ONNX Runtime session loads and the
temporary files go) and then gates the bucket: the runtime's output on
that same step must have a cosine of at least 0.999 with the eager output,
row by row. A bucket that passes runs on ONNX Runtime from then on; one
that fails, or every bucket of a model whose export fails (a family the
exporter cannot trace), stays eager. Nothing on
the request path waits for a build, and with the fast path off nothing of
it is imported or started.

Bounds: one extra copy of the weights in memory (the session's), the ONNX
files on disk only while the session loads, and ONNX Runtime's working
memory for steps of at most ``max_tokens`` tokens.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import importlib.util
import logging
import re
import shutil
import tempfile
import warnings
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .attention.base import AttentionBackend, AttnPlan
from .gated import GatedRuntime, power_of_two_bucket, power_of_two_buckets
from .interface import Batch, OutputKind
from .models import EmbeddingModel, StepInputs

log = logging.getLogger("rose.cpufast")

# Longest an export may take (seconds): on a busy 2-core machine ~10-200.
EXPORT_TIMEOUT_S = 1800
_INPUTS = ("ids", "positions", "seg_ids", "cu", "inv_len", "dims", "norm")


def missing() -> str | None:
    """Why the fast path cannot run here (a package is missing), or None."""
    # Looked up, not imported: the exporter is imported by the first build.
    for module in ("onnxruntime", "onnxscript", "onnx"):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{module} is not installed (pip install 'tulip-rose[cpu-fast]')"
    return None


TOKENS_DEFAULT = 256


@dataclass(frozen=True)
class FastPathSettings:
    """Which steps the fast path takes and how ONNX Runtime runs them."""

    # Largest step (real tokens); larger ones go to the bfloat16 twin or the
    # ragged eager path. None: 256, and no fast path at all where the twin
    # runs (the engine decides: ``Engine.from_dir``).
    max_tokens: int | None = None
    max_sequences: int = 64
    min_bucket: int = 16
    threads: int = 0  # ONNX Runtime intra-op threads; 0 = torch's thread budget
    # Sleeping threads pay a wake-up per operator; spinning ones (stopped
    # as each run returns: force_spinning_stop) pay none but take the cores
    # Ivy's and Tulip's own threads need. Served on a 2-core VM with both
    # sides spinning, the query ratio against ONNX Runtime did not improve.
    spin: bool = False

    def __post_init__(self):
        if (self.max_tokens is not None and self.max_tokens < 1) or self.max_sequences < 1 or self.min_bucket < 1:
            raise ValueError("CPU fast path limits must be positive")

    def resolved(self) -> "FastPathSettings":
        """``max_tokens`` decided: 256 unless set."""
        return self if self.max_tokens is not None else dataclasses.replace(self, max_tokens=TOKENS_DEFAULT)

    def bucket(self, tokens: int) -> int | None:
        """The bucket (a power of two) of a step of ``tokens`` real tokens,
        or None when the step is too large for the fast path."""
        if tokens > self.max_tokens:
            return None
        return power_of_two_bucket(tokens, self.min_bucket)

    def buckets(self) -> list[int]:
        return power_of_two_buckets(self.min_bucket, self.max_tokens)

    def warm_steps(self) -> list[int]:
        """Step sizes (tokens) that reach every bucket: the last one's is
        ``max_tokens`` when that is not a power of two."""
        return [min(b, self.max_tokens) for b in self.buckets()]


class _ExportAttention(AttentionBackend):
    """One SDPA call over the flat axis with the block-diagonal mask the
    export wrapper puts in ``plan.extra`` (built from ``seg_ids``, which
    traces to plain tensor ops, unlike ``searchsorted``)."""

    name = "export"
    capture_safe = True

    def attend(self, q, k, v, plan: AttnPlan, scale: float) -> torch.Tensor:
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
            attn_mask=plan.extra, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
        return o.squeeze(0).transpose(0, 1)


class _Flat(nn.Module):
    """The model's step as a function of the arena's fields (what is exported)."""

    def __init__(self, model: EmbeddingModel, kind: OutputKind):
        super().__init__()
        self.model = model
        self.kind = kind

    def forward(self, ids, positions, seg_ids, cu, inv_len, dims, norm):
        seg = seg_ids.long()
        mask = seg.unsqueeze(1) == seg.unsqueeze(0)
        if self.model.causal:
            idx = torch.arange(ids.shape[0])
            mask = mask & (idx.unsqueeze(1) >= idx.unsqueeze(0))
        plan = AttnPlan(cu, [], 0, self.model.causal, extra=mask)
        return self.model(self.kind, StepInputs(ids, positions, seg, cu, inv_len, dims, norm != 0, plan))


def export_backend() -> AttentionBackend:
    return _ExportAttention()


def trace_sample(kind: OutputKind, dimension: int) -> Batch:
    """What the export traces with: two sequences, so that neither the token
    nor the sequence count is specialised to 1 (ids from 5 up: clear of
    special ids and XLM-R's padding id)."""
    batch = Batch.from_lists([list(range(5, 10)), list(range(10, 17))], kind,
                             dimensions=[dimension] * 2, normalize=[True, False])
    batch.resolved = True
    return batch


def export(model_dir: str, out: str, max_tokens: int, max_sequences: int) -> None:
    """Writes the model's primary output as an ONNX graph over the arena's
    fields (``_INPUTS``), with dynamic token and sequence counts. Runs in a
    child process (``python -m rose.cpufast``): the exporter's memory and
    its seconds of Python holding the GIL stay out of the server."""
    from .config import ModelSpec
    from .engine import load_model

    model = load_model(ModelSpec.from_dir(model_dir), export_backend())
    kind = model.kinds[0]
    flat = _Flat(model, kind).eval()
    sample = trace_sample(kind, model.dimension)
    views = sample.layout.views(sample.arena)
    args = tuple(views[k] for k in _INPUTS)
    tokens = torch.export.Dim("tokens", min=2, max=max(max_tokens, 2))
    seqs = torch.export.Dim("sequences", min=1, max=max_sequences)
    per_seq = {0: seqs}
    dynamic = {"ids": {0: tokens}, "positions": {0: tokens}, "seg_ids": {0: tokens}, "cu": {0: seqs + 1},
               "inv_len": per_seq, "dims": per_seq, "norm": per_seq}
    with torch.no_grad(), quiet_exporter():
        torch.onnx.export(flat, args, out, dynamo=True, dynamic_shapes=dynamic, input_names=list(_INPUTS),
                          output_names=["out"], optimize=True, verbose=False)


def _session(model_dir: Path, settings: FastPathSettings):
    """Exports the model in a child process into a temporary directory and
    loads it into an ONNX Runtime session; the files go once it is loaded."""
    import onnxruntime as ort

    tmp = Path(tempfile.mkdtemp(prefix="rose-cpufast-"))
    try:
        path = tmp / "model.onnx"
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        res = subprocess.run([sys.executable, "-m", "rose.cpufast", str(model_dir), str(path),
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


@contextlib.contextmanager
def quiet_exporter():
    """The exporter's progress lines and warnings, at INFO and below, would
    flood a server's log for one build."""
    loggers = [logging.getLogger(n) for n in ("onnx_ir", "onnxscript", "torch.onnx", "torch.export")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _feed(batch: Batch) -> dict[str, np.ndarray]:
    feed = {k: batch.numpy_field(k) for k in _INPUTS}
    feed["inv_len"] = feed["inv_len"].view(np.float32)
    return feed


class CpuFastPath(GatedRuntime):
    """The ONNX Runtime session of one model and its buckets' states."""

    label = "CPU fast path"

    def __init__(self, model_dir: Path, kind: OutputKind, dimension: int, settings: FastPathSettings | None = None):
        super().__init__(kind)
        self.model_dir = Path(model_dir)
        self.dimension = dimension
        self.settings = (settings or FastPathSettings()).resolved()

    def key(self, batch: Batch) -> int | None:
        """The bucket of a step the fast path may take, or None."""
        if batch.kind is not self.kind or batch.layout.sequences > self.settings.max_sequences:
            return None
        return self.settings.bucket(batch.layout.tokens)

    def _load(self):
        # The serving model's layers are packed for oneDNN and bound to the
        # serving attention backend: a fresh copy is exported.
        return _session(self.model_dir, self.settings)

    def _execute(self, batch: Batch) -> torch.Tensor:
        return torch.from_numpy(self._runtime.run(None, _feed(batch))[0])


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m rose.cpufast", description="Export a model for the CPU fast path.")
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--max-tokens", type=int, default=TOKENS_DEFAULT)
    p.add_argument("--max-sequences", type=int, default=FastPathSettings.max_sequences)
    args = p.parse_args(argv)
    os.nice(10)  # behind the server's own steps
    torch.set_num_threads(1)
    export(args.model_dir, args.out, args.max_tokens, args.max_sequences)
    return 0


if __name__ == "__main__":
    sys.exit(main())
