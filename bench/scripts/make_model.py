"""Writes a seeded random-weight benchmark model for a family whose real
weights cannot be downloaded here (``python -m bench.scripts.make_model xlmr DIR``),
for ``--model DIR`` of any benchmark. Speed depends on the shape, not the
weights; the correctness gate still compares every side on these weights."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.harness.tiny_models import multilingual_minilm

FAMILIES = {"xlmr": multilingual_minilm}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(FAMILIES[args.family](args.out, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
