"""Deterministic outputs for the simulated device.

Every value is a function of one sequence's token ids (and the options it
asked for), never of the batch around it, so batched = alone and a client
that got another client's rows are both checkable. Each output kind has the
row layout ``rose.interface.OutputKind`` documents: dense rows are unit
vectors (when normalised) with zeros past the requested dimensions, sparse
weights are in [0, 1) with 0 on the first and last token (where the special
tokens sit), multi-vector rows are unit vectors, scores are (logit,
sigmoid), classifier logits one per label, SPLADE rows weight only the
sequence's own ids.

The values come from splitmix64 over NumPy arrays, a few dozen operations a
step whatever its size; they are written on the host while the modelled
step runs (``runner.py``), as a GPU would compute them while the host goes
on.
"""

from __future__ import annotations

import numpy as np

from ..interface import Batch, OutputKind

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_POS = np.uint64(0xD6E8FEB86659FD93)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))


def _mix(x: np.ndarray) -> np.ndarray:
    z = x + _GOLDEN
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def _unit(z: np.ndarray) -> np.ndarray:
    """[0, 1) from 64 random bits."""
    return (z >> _S11).astype(np.float64) * (1.0 / (1 << 53))


def _table(seeds: np.ndarray, width: int) -> np.ndarray:
    """``len(seeds) x width`` values in [-1, 1), row i from seeds[i]."""
    cols = np.arange(width, dtype=np.uint64) * _GOLDEN
    return _unit(_mix(seeds[:, None] + cols[None, :])) * 2.0 - 1.0


class OutputSynth:
    """Writes one step's output rows, as the model's forward would."""

    def __init__(self, dimension: int, multi_vector_dimension: int, hidden: int, vocab: int, labels: int):
        self.cols = {
            OutputKind.DENSE: dimension,
            OutputKind.SPARSE: 1,
            OutputKind.MULTI_VECTOR: multi_vector_dimension,
            OutputKind.SCORE: 2,
            OutputKind.CLASSIFY: max(labels, 1),
            OutputKind.SPARSE_VOCAB: vocab,
            OutputKind.TOKEN_STATES: hidden,
        }

    def shape(self, batch: Batch) -> tuple[int, int]:
        layout, kind = batch.layout, batch.kind
        if kind in (OutputKind.SPARSE, OutputKind.TOKEN_STATES):
            rows = layout.real_tokens
        elif kind is OutputKind.MULTI_VECTOR:
            rows = layout.real_tokens - layout.sequences
        else:
            rows = layout.sequences
        return rows, self.cols[kind]

    def fill(self, batch: Batch, out: np.ndarray) -> None:
        """Writes ``shape(batch)`` rows into the float32 array ``out``
        (flat, at least rows * cols long). ``batch`` is unpadded, options
        resolved."""
        rows, cols = self.shape(batch)
        if rows == 0:
            return
        dst = out[: rows * cols].reshape(rows, cols)
        ids = batch.numpy_field("ids").astype(np.uint64)
        pos = batch.numpy_field("positions").astype(np.uint64)
        cu = batch.numpy_field("cu")
        starts = cu[:-1]
        per_token = _mix(ids + pos * _POS)
        per_seq = _mix(np.add.reduceat(per_token, starts))  # order-sensitive: positions are mixed in
        kind = batch.kind
        if kind is OutputKind.DENSE:
            v = _table(per_seq, cols)
            dims = batch.numpy_field("dims")
            v[np.arange(cols)[None, :] >= dims[:, None]] = 0.0
            norm = batch.numpy_field("norm") > 0
            if norm.any():
                v[norm] /= np.linalg.norm(v[norm], axis=1, keepdims=True)
            dst[:] = v
        elif kind is OutputKind.SCORE:
            logit = (_unit(per_seq) - 0.5) * 8.0
            dst[:, 0] = logit
            dst[:, 1] = 1.0 / (1.0 + np.exp(-logit))
        elif kind is OutputKind.CLASSIFY:
            dst[:] = _table(per_seq, cols) * 4.0
        elif kind in (OutputKind.SPARSE, OutputKind.TOKEN_STATES, OutputKind.MULTI_VECTOR):
            lengths = np.diff(cu)
            token_seed = per_token + np.repeat(per_seq, lengths)
            if kind is OutputKind.SPARSE:
                w = _unit(_mix(token_seed))
                ends = cu[1:] - 1
                w[starts] = 0.0
                w[ends] = 0.0
                dst[:, 0] = w
            elif kind is OutputKind.TOKEN_STATES:
                dst[:] = _table(token_seed, cols)
            else:  # every token after the first, unit vectors
                v = _table(token_seed[pos > 0], cols)
                dst[:] = v / np.linalg.norm(v, axis=1, keepdims=True)
        elif kind is OutputKind.SPARSE_VOCAB:
            dst[:] = 0.0
            seg = batch.numpy_field("seg_ids")
            dst[seg, batch.numpy_field("ids")] = _unit(_mix(ids + per_seq[seg]))
        else:  # pragma: no cover - every kind is listed above
            raise ValueError(f"no simulated output for {kind}")
