"""Comparing embeddings row by row."""

from __future__ import annotations

import numpy as np


def cosines(a, b) -> np.ndarray:
    """The cosine similarity of each row of ``a`` with the same row of ``b``
    (in float64, so the comparison adds no rounding of its own)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
