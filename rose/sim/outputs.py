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

The values come from splitmix64 over NumPy arrays. A dense row (the hot
path: every query) is the sum of two rows of a fixed random table picked by
the top bits of its sequence's 64-bit hash, a handful of operations whatever
the width, so that the rows fit within a launch's modelled host time
(``device.py``); two different sequences share a dense row with
probability 2^-20 per pair. Token states and multi-vector rows are made the
same way per token, from the token's own hash.
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


_TABLE_BITS = 10
_HIGH = np.uint64(64 - _TABLE_BITS)  # a dense row's two table rows: the top bits,
_NEXT = np.uint64(64 - 2 * _TABLE_BITS)  # then the ten below them
_MASK = np.uint64((1 << _TABLE_BITS) - 1)


class OutputSynth:
    """Writes one step's output rows, as the model's forward would."""

    def __init__(self, dimension: int, multi_vector_dimension: int, hidden: int, vocab: int, labels: int):
        # Dense rows: two rows of this table, by two 10-bit slices of the hash.
        self._dense = _table(np.arange(1 << _TABLE_BITS, dtype=np.uint64), dimension).astype(np.float32)
        # Per-token rows likewise, by their token's hash: a real device's
        # token states cost nothing beyond the forward, so rows made per
        # value (megabytes a long document) must not bill the host path.
        self._tokens = {width: _table(np.arange(1 << _TABLE_BITS, dtype=np.uint64) + np.uint64(width << 20),
                                      width).astype(np.float32)
                        for width in {hidden, multi_vector_dimension} if width > 0}
        self._w = np.zeros(0, dtype=np.uint64)
        self.cols = {
            OutputKind.DENSE: dimension,
            OutputKind.SPARSE: 1,
            OutputKind.MULTI_VECTOR: multi_vector_dimension,
            OutputKind.SCORE: 2,
            OutputKind.CLASSIFY: max(labels, 1),
            OutputKind.SPARSE_VOCAB: vocab,
            OutputKind.TOKEN_STATES: hidden,
        }

    def _token_rows(self, seeds: np.ndarray, width: int) -> np.ndarray:
        """One row per token: two table rows picked by its mixed seed."""
        table = self._tokens[width]
        v = table[seeds >> _HIGH]
        v += table[(seeds >> _NEXT) & _MASK]
        return v

    def _weights(self, positions: int) -> np.ndarray:
        """One random odd uint64 per position, ``positions`` at least."""
        if self._w.size < positions:
            self._w = _mix(np.arange(max(positions, 2 * self._w.size), dtype=np.uint64) * _POS) | np.uint64(1)
        return self._w

    def _dense_rows(self, per_seq: np.ndarray, dims: np.ndarray, norm: np.ndarray, dst: np.ndarray) -> None:
        """Dense rows from one 64-bit hash per row, cut to ``dims`` and
        normalised where ``norm`` > 0."""
        cols = dst.shape[1]
        v = self._dense[per_seq >> _HIGH]
        v += self._dense[(per_seq >> _NEXT) & _MASK]
        if (dims < cols).any():
            v[np.arange(cols)[None, :] >= dims[:, None]] = 0.0
        keep = norm > 0
        if keep.all():
            v /= np.sqrt(np.einsum("ij,ij->i", v, v))[:, None]
        elif keep.any():
            v[keep] /= np.sqrt(np.einsum("ij,ij->i", v[keep], v[keep]))[:, None]
        dst[:] = v

    def fill_images(self, pixels: np.ndarray, dims: np.ndarray, norm: np.ndarray, out: np.ndarray) -> None:
        """Dense rows of images (``pixels`` float32 ``[N, ...]``; options
        resolved) into the flat float32 ``out``: each a function of its own
        image, hashed over a fixed sample of its values (the whole image
        would cost the host a pass over megabytes a step)."""
        n, cols = pixels.shape[0], self.cols[OutputKind.DENSE]
        words = pixels.reshape(n, -1).view(np.uint32)
        sample = _sample(words.shape[1])
        per_image = np.add.reduce(words[:, sample].astype(np.uint64) * self._weights(sample.size)[: sample.size],
                                  axis=1)
        self._dense_rows(per_image, dims, norm, out[: n * cols].reshape(n, cols))

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
        layout = batch.layout
        dst = out[: rows * cols].reshape(rows, cols)
        ids = batch.numpy_field("ids").astype(np.uint64)
        pos = batch.numpy_field("positions")
        cu = batch.numpy_field("cu")
        starts = cu[:-1]
        # Each id times a random odd weight of its position, summed per
        # sequence: order-sensitive, a few operations a step. The products'
        # high bits are well mixed; ``_mix`` mixes the rest where needed.
        weighted = ids * self._weights(layout.tokens if layout.segments == 1 else int(pos.max()) + 1)[pos]
        per_seq = np.add.reduceat(weighted, starts)
        kind = batch.kind
        if kind is OutputKind.DENSE:
            self._dense_rows(per_seq, batch.numpy_field("dims"), batch.numpy_field("norm"), dst)
            return
        per_seq = _mix(per_seq)
        if kind is OutputKind.SCORE:
            logit = (_unit(per_seq) - 0.5) * 8.0
            dst[:, 0] = logit
            dst[:, 1] = 1.0 / (1.0 + np.exp(-logit))
        elif kind is OutputKind.CLASSIFY:
            dst[:] = _table(per_seq, cols) * 4.0
        elif kind in (OutputKind.SPARSE, OutputKind.TOKEN_STATES, OutputKind.MULTI_VECTOR):
            lengths = np.diff(cu)
            token_seed = _mix(weighted) + np.repeat(per_seq, lengths)
            if kind is OutputKind.SPARSE:
                w = _unit(_mix(token_seed))
                ends = cu[1:] - 1
                w[starts] = 0.0
                w[ends] = 0.0
                dst[:, 0] = w
            elif kind is OutputKind.TOKEN_STATES:
                dst[:] = self._token_rows(token_seed, cols)
            else:  # every token after the first, unit vectors
                v = self._token_rows(token_seed[pos > 0], cols)
                dst[:] = v / np.linalg.norm(v, axis=1, keepdims=True)
        elif kind is OutputKind.SPARSE_VOCAB:
            dst[:] = 0.0
            seg = batch.numpy_field("seg_ids")
            dst[seg, batch.numpy_field("ids")] = _unit(_mix(ids + per_seq[seg]))
        else:  # pragma: no cover - every kind is listed above
            raise ValueError(f"no simulated output for {kind}")


_SAMPLE = 4096  # pixel values an image's hash reads


def _sample(values: int) -> np.ndarray:
    """Evenly spread indices of at most ``_SAMPLE`` of ``values`` values."""
    return np.unique(np.linspace(0, values - 1, min(values, _SAMPLE)).astype(np.int64))
