"""Writes a seeded random-weight benchmark model for a family whose real
weights cannot be downloaded here (``python -m bench.make_model xlmr DIR``),
for ``--model DIR`` of any benchmark. Speed depends on the shape, not the
weights; the correctness gate still compares every side on these weights."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.tiny_models import multilingual_minilm  # noqa: E402

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
