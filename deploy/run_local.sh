#!/usr/bin/env bash
# Serves the embedded default model on this machine through `tulip-rose
# serve` (Tulip replicas and Ivy over Unix sockets; docs/serve.md). Flags
# go through, e.g. `deploy/run_local.sh --model BAAI/bge-m3 --replicas 2`;
# so do the environment variables (IVY_PORT, TULIP_DTYPE, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
exec "$VENV/bin/python" -m tulip_rose_cli serve "$@"
