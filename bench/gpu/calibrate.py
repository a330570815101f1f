"""Fits the simulated device's cost model (``rose/sim/cost.py``:
``t = t0 + a * tokens + b * sum(len^2)``) to a real device, so the first GPU
run also gives the simulator real constants.

Two sources:

- a live engine (the GPU bundle's ``<model>/calibrate`` section): ROSE steps
  with CUDA graphs over a grid of (sequences x length), each timed from the
  launch to its rows on the host, as Tulip runs them;
- a finished ``gpu.json`` (``--from``): the ``<model>/graphs`` section's
  batch-1 CUDA-graph timings over its length sweep (plus the 128/512/4,096
  cells), which the bundle records anyway.

Both time the step call and the wait with the device, so ``t0`` also holds
the few microseconds of host work around a graph replay; ``--sim-launch-us``
then double-counts them (say so next to results that use both).

    python -m bench.gpu.calibrate --from bench/results/<date>-h200/gpu.json --model bge-m3 --out sim-cost.json
    python -m tulip --device sim --sim-cost sim-cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from rose.sim.cost import CostModel, fit

Point = tuple[list[int], float]  # (sequence lengths of one step, seconds)


def grid(lengths: list[int], counts: list[int], max_tokens: int) -> list[tuple[int, int]]:
    """(sequences, length) cells within the step token budget."""
    return [(n, length) for n in counts for length in lengths if n * length <= max_tokens]


def measure(engine, cells: list[tuple[int, int]], rounds: int, vocab: int = 1000) -> list[Point]:
    """The median time of ``rounds`` steps per cell, launch to rows on the
    host (after three untimed steps: warm-up and graph capture)."""
    from bench.gpu.timing import arena_step

    out = []
    for n, length in cells:
        seqs = [[(7 * i + j) % (vocab - 3) + 3 for j in range(length)] for i in range(n)]
        step = arena_step(engine, seqs)
        for _ in range(3):
            step()
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        out.append(([length] * n, statistics.median(times)))
    return out


def points_from_gpu_json(path: Path, model: str) -> list[Point]:
    """Batch-1 CUDA-graph p50s per length from a GPU run's ``<model>/graphs``."""
    data = json.loads(Path(path).read_text())
    section = data.get("sections", {}).get(f"{model}/graphs", {})
    result = section.get("result") or {}
    cells: dict[int, float] = {}
    for part in ("sweep", "eager_vs_graphs"):
        for length, sides in (result.get(part) or {}).items():
            if "rose graphs" in sides:
                cells[int(length)] = sides["rose graphs"]["p50"] / 1e3
    if len(cells) < 3:
        raise ValueError(f"{path}: no '{model}/graphs' section with at least three lengths "
                         f"(sections: {', '.join(sorted(data.get('sections', {}))) or 'none'})")
    return [([n], s) for n, s in sorted(cells.items())]


def calibrate(points: list[Point]) -> dict:
    """The fitted constants and how well they fit."""
    model = fit(points)
    errors = [model.seconds(ls) / s - 1 for ls, s in points]
    return {**model.to_dict(), "text": model.describe(), "points": len(points),
            "max_relative_error": round(max(abs(e) for e in errors), 4),
            "cells": [{"sequences": len(ls), "length": ls[0], "measured_ms": round(s * 1e3, 4),
                       "model_ms": round(model.seconds(ls) * 1e3, 4)} for ls, s in points]}


def write_cost(result: dict, path: Path) -> Path:
    """The file ``--sim-cost`` reads."""
    path.write_text(json.dumps({k: result[k] for k in ("t0", "a", "b")}, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="source", type=Path, required=True, help="a GPU run's gpu.json")
    p.add_argument("--model", default="bge-m3", help="the timed model's section prefix (bge-m3, pplx-0.6b)")
    p.add_argument("--out", type=Path, default=None, help="write the fitted t0, a, b here (for --sim-cost)")
    args = p.parse_args(argv)
    try:
        result = calibrate(points_from_gpu_json(args.source, args.model))
    except (OSError, ValueError) as e:
        print(f"calibrate: {e}", file=sys.stderr)
        return 2
    if args.out:
        write_cost(result, args.out)
    print(json.dumps(result, indent=1))
    print(f"fitted {CostModel(result['t0'], result['a'], result['b']).describe()}; worst cell off by "
          f"{result['max_relative_error'] * 100:.1f}%", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
