"""A batch's layout tensors packed into one int32 "arena".

Everything a forward pass reads besides weights (token ids, positions,
sequence index per token, ``cu_seqlens``, 1/length, per-sequence options)
lives in one flat int32 buffer, so moving a step's inputs to the device is a
single copy from one pinned buffer, and a CUDA graph's static inputs are
views into one static arena.

When a batch is padded up to a bucket, the filler tokens form one extra
segment at the end: they attend only to each other, and every output row
they produce comes after all real rows, where it is discarded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .attention import AttentionBackend
from .interface import Batch, OutputKind
from .models import StepInputs


@dataclass(frozen=True)
class Layout:
    """Sizes of one step: ``tokens`` computed (filler included) over
    ``segments`` segments, of which the first ``sequences`` are real."""

    sequences: int
    segments: int
    tokens: int
    real_tokens: int

    @classmethod
    def of(cls, sequences: int, real_tokens: int, padded_tokens: int | None = None) -> "Layout":
        tokens = real_tokens if padded_tokens is None else padded_tokens
        if tokens < real_tokens:
            raise ValueError(f"cannot pad {real_tokens} tokens down to {tokens}")
        segments = sequences + (1 if tokens > real_tokens else 0)
        return cls(sequences, segments, tokens, real_tokens)

    @property
    def size(self) -> int:
        """int32 words in the arena."""
        return 3 * self.tokens + (self.segments + 1) + 3 * self.segments

    def _slices(self):
        t, s = self.tokens, self.segments
        o = 0
        for name, n in (("ids", t), ("positions", t), ("seg_ids", t), ("cu", s + 1),
                        ("inv_len", s), ("dims", s), ("norm", s)):
            yield name, o, n
            o += n

    def views(self, arena: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {name: arena[o:o + n] for name, o, n in self._slices()}
        out["inv_len"] = out["inv_len"].view(torch.float32)
        return out


def pack(batch: Batch, layout: Layout, arena: torch.Tensor, dimension: int, normalize_default: bool) -> None:
    """Writes ``batch`` (plus the filler segment, if any) into a host int32
    ``arena`` of at least ``layout.size`` words. NumPy, not torch: this runs
    on the request path for every step, and NumPy's per-call cost on tiny
    arrays is a fraction of torch's."""
    a = arena.numpy()
    n, t_real, t, s = layout.sequences, layout.real_tokens, layout.tokens, layout.segments
    cu_in = batch.cu_seqlens.numpy()
    o_pos, o_seg, o_cu = t, 2 * t, 3 * t
    o_inv = o_cu + s + 1
    o_dims, o_norm = o_inv + s, o_inv + 2 * s
    a[:t_real] = batch.token_ids.numpy()
    a[t_real:t] = 0
    cu = a[o_cu:o_cu + s + 1]
    cu[: n + 1] = cu_in
    if s > n:
        cu[s] = t
    lens = np.diff(cu)
    seg = np.repeat(np.arange(s, dtype=np.int32), lens)
    a[o_seg:o_seg + t] = seg
    np.subtract(np.arange(t, dtype=np.int32), cu[seg], out=a[o_pos:o_pos + t])
    a[o_inv:o_inv + s].view(np.float32)[:] = 1.0 / lens
    dims = a[o_dims:o_dims + s]
    dims[:] = dimension
    if batch.dimensions is not None:
        d = batch.dimensions.numpy()
        dims[:n] = np.where(d > 0, d, dimension)
    norm = a[o_norm:o_norm + s]
    norm[:] = int(normalize_default)
    if batch.normalize is not None:
        norm[:n] = batch.normalize.numpy()


def step_inputs(arena: torch.Tensor, layout: Layout, backend: AttentionBackend, causal: bool,
                lengths: list[int], max_seqlen: int) -> StepInputs:
    """The model's inputs as views of a (device) arena. ``lengths`` are the
    host-side segment lengths, for backends that loop over sequences;
    capture-safe backends read only device tensors and ``max_seqlen``."""
    v = layout.views(arena)
    plan = backend.plan(v["cu"], lengths, max_seqlen, causal)
    return StepInputs(
        token_ids=v["ids"],
        positions=v["positions"],
        seg_ids=v["seg_ids"],
        cu_seqlens=v["cu"],
        inv_lengths=v["inv_len"],
        dimensions=v["dims"],
        normalize=v["norm"] != 0,
        plan=plan,
    )


def rows_for(kind: OutputKind, layout: Layout) -> int:
    """How many leading output rows belong to real sequences (the row
    layout of each kind is described in ``interface.OutputKind``)."""
    if kind in (OutputKind.DENSE, OutputKind.SCORE):
        return layout.sequences
    if kind is OutputKind.SPARSE:
        return layout.real_tokens
    return layout.real_tokens - layout.sequences
