#!/usr/bin/env bash
# `make wheels`: the two wheels into OUT (default dist/); PYTHON is the
# interpreter whose pip and maturin build them (default .venv/bin/python).
#   tulip_rose-*-cp310-abi3-*.whl    Tulip's extension (abi3), ROSE, the CLI
#   tulip_rose_ivy-*-py3-none-*.whl  the Ivy binary (maturin's "bin" bindings,
#                                    packaging/ivy/pyproject.toml), stripped
# Both builds use the cargo target folder the rest of the build uses
# (CARGO_TARGET_DIR applies) with the profiles `make native` and `make ivy`
# use, so after `make install` they compile nothing new.
set -euo pipefail
out=$(realpath -m "${1:-dist}")
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
# maturin's build backend runs the `maturin` command: the one beside PYTHON
# (a virtualenv that is not activated, as in the Tulip image's wheel stage).
PATH="$(cd "$(dirname "$PYTHON")" && pwd):$PATH"
mkdir -p "$out"
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$out" . packaging/ivy
# Stripped after the build, not by maturin (see strip_wheel.py).
"$PYTHON" packaging/strip_wheel.py "$out"/tulip_rose_ivy-*.whl
ls -l "$out"/tulip_rose-*.whl "$out"/tulip_rose_ivy-*.whl
