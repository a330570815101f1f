"""The correctness gate: nothing is timed until its outputs match a
reference implementation on the same weights."""

from __future__ import annotations

import numpy as np

THRESHOLD = 0.999


class GateFailed(RuntimeError):
    """A served model's outputs differ from the reference: do not time it."""


def cosines(got, want) -> np.ndarray:
    """Row-wise cosine similarity of two [n, d] arrays."""
    a = np.asarray(got, dtype=np.float64)
    b = np.asarray(want, dtype=np.float64)
    if a.shape != b.shape:
        raise GateFailed(f"shape {a.shape} differs from the reference's {b.shape}")
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(na * nb, 1e-30)


def check(name: str, got, want, reference: str, threshold: float = THRESHOLD) -> dict:
    """Raises GateFailed unless every row's cosine is at least ``threshold``;
    returns the record to keep with the results."""
    cos = cosines(got, want)
    record = {"side": name, "reference": reference, "rows": int(cos.size),
              "min_cosine": round(float(cos.min()), 6), "threshold": threshold,
              "passed": bool(cos.min() >= threshold)}
    if not record["passed"]:
        worst = int(cos.argmin())
        raise GateFailed(f"{name}: cosine {cos[worst]:.6f} < {threshold} against {reference} on row {worst}")
    return record


def check_shape(name: str, got, rows: int, dim: int, what: str) -> dict:
    """For outputs with no reference values (the null model): the shape and
    the amount of work done must match."""
    arr = np.asarray(got)
    passed = arr.shape == (rows, dim)
    record = {"side": name, "reference": what, "rows": rows, "shape": list(arr.shape), "passed": passed}
    if not passed:
        raise GateFailed(f"{name}: output shape {arr.shape}, expected {(rows, dim)} ({what})")
    return record
