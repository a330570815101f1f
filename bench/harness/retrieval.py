"""Retrieval figures from vectors: each query's target ranked among a pool
by cosine similarity (the vectors are unit length: the dot product), then
recall@k and the mean reciprocal rank."""

from __future__ import annotations

import numpy as np

KS = (1, 3, 5)


def ranks(queries: np.ndarray, pool: np.ndarray, targets: list[int]) -> list[int]:
    """The 1-based rank of each query's target in the pool: one plus the
    number of pool vectors scoring strictly higher (a tie counts for the
    target)."""
    scores = np.asarray(queries, dtype=np.float64) @ np.asarray(pool, dtype=np.float64).T
    own = scores[np.arange(len(targets)), targets]
    return [int(r) for r in (scores > own[:, None]).sum(axis=1) + 1]


def summary(rank_list: list[int], ks: tuple[int, ...] = KS) -> dict[str, float]:
    """recall@k for each k (the share of queries whose target is in the top
    k) and MRR."""
    r = np.asarray(rank_list, dtype=np.float64)
    out = {f"recall@{k}": round(float((r <= k).mean()), 4) for k in ks}
    out["mrr"] = round(float((1.0 / r).mean()), 4)
    return out
