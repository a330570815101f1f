"""The ONNX export of a model for ``onnx.py``: ROSE's own definition traced
with dynamic token and sequence counts, as a function of the arena's
fields. Runs in a child process (``python -m rose.cpu.onnx_export``), so
the exporter's memory and its seconds of Python holding the GIL stay out
of the server; the child ends when its server does, on every path
(``die_with_parent``), and takes its unfinished output with it."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.base import AttentionBackend, AttnPlan
from ..config import ModelSpec
from ..interface import Batch, OutputKind
from ..models import EmbeddingModel, StepInputs
from ..models.load import load_model

# The arena's fields, in the order the exported graph takes them.
INPUTS = ("ids", "positions", "seg_ids", "cu", "inv_len", "dims", "norm")
TOKENS_DEFAULT = 256
SEQUENCES_DEFAULT = 64


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
    fields (``INPUTS``), with dynamic token and sequence counts."""
    model = load_model(ModelSpec.from_dir(model_dir), export_backend())
    kind = model.kinds[0]
    flat = _Flat(model, kind).eval()
    sample = trace_sample(kind, model.dimension)
    views = sample.layout.views(sample.arena)
    args = tuple(views[k] for k in INPUTS)
    tokens = torch.export.Dim("tokens", min=2, max=max(max_tokens, 2))
    seqs = torch.export.Dim("sequences", min=1, max=max_sequences)
    per_seq = {0: seqs}
    dynamic = {"ids": {0: tokens}, "positions": {0: tokens}, "seg_ids": {0: tokens}, "cu": {0: seqs + 1},
               "inv_len": per_seq, "dims": per_seq, "norm": per_seq}
    with torch.no_grad(), quiet_exporter():
        torch.onnx.export(flat, args, out, dynamo=True, dynamic_shapes=dynamic, input_names=list(INPUTS),
                          output_names=["out"], optimize=True, verbose=False)


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


# How often the child looks for its parent where the death signal is not
# available (not Linux), and after it was asked for (a parent that died
# before the child could ask is seen at once).
PARENT_POLL_S = 0.5


def die_with_parent(parent: int, leftovers: Path) -> None:
    """Ends this process, removing ``leftovers`` (its unfinished output),
    when ``parent`` is gone: SIGTERM from the kernel when the parent dies
    (Linux's PR_SET_PDEATHSIG, asked here rather than in a ``preexec_fn``,
    which is unsafe in a threaded server), and a thread that watches the
    parent's pid elsewhere and for a parent that died before the ask."""

    def leave(*_):
        shutil.rmtree(leftovers, ignore_errors=True)
        os._exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, leave)
    try:
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        leave()

    if os.getppid() != parent:
        leave()
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m rose.cpu.onnx_export",
                                description="Export a model for the CPU's ONNX Runtime path.")
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--max-tokens", type=int, default=TOKENS_DEFAULT)
    p.add_argument("--max-sequences", type=int, default=SEQUENCES_DEFAULT)
    p.add_argument("--parent", type=int, default=0,
                   help="end (removing OUT's folder) when this process is gone; 0 = not watched")
    args = p.parse_args(argv)
    if args.parent:
        die_with_parent(args.parent, Path(args.out).parent)
    os.nice(10)  # behind the server's own steps
    torch.set_num_threads(1)
    export(args.model_dir, args.out, args.max_tokens, args.max_sequences)
    return 0


if __name__ == "__main__":
    sys.exit(main())
