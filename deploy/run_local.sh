#!/usr/bin/env bash
# Starts one Tulip replica on the embedded default model and Ivy in front of
# it, prints how to call it, and stops both on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
TULIP_PORT=${TULIP_PORT:-7070}
IVY_PORT=${IVY_PORT:-8080}

model_dir=$("$PY" -c 'from tulip.launcher import default_model_dir; print(default_model_dir())')

# Ivy runs next to Tulip, so it reaches it over a Unix socket (the lower
# latency path; docs/latency.md).
socket="${TMPDIR:-/tmp}/tulip-rose-$TULIP_PORT.sock"
"$PY" -m tulip --model "$model_dir" --host 127.0.0.1 --port "$TULIP_PORT" --unix-socket "$socket" &
tulip_pid=$!
# No --tokenizer: Ivy tokenizes with the tokenizer.json Tulip serves.
"${CARGO_TARGET_DIR:-target}/dist/ivy" --tulip "unix://$socket" --host 0.0.0.0 --port "$IVY_PORT" &
ivy_pid=$!
trap 'kill -TERM $ivy_pid $tulip_pid 2>/dev/null; wait' INT TERM EXIT

ready() {
    "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
        "http://127.0.0.1:$IVY_PORT/ready" >/dev/null 2>&1
}
for _ in $(seq 1 120); do
    if ready; then break; fi
    if ! kill -0 $tulip_pid 2>/dev/null || ! kill -0 $ivy_pid 2>/dev/null; then
        echo "a service exited during start-up" >&2; exit 1
    fi
    sleep 0.5
done
ready || { echo "Ivy did not become ready" >&2; exit 1; }

cat <<MSG

Ivy is serving all-MiniLM-L6-v2 on http://127.0.0.1:$IVY_PORT  (Ctrl-C stops both services)

  curl -s http://127.0.0.1:$IVY_PORT/v1/embeddings -H 'Content-Type: application/json' \\
       -d '{"input": ["What is an embedding?", "A vector that captures meaning."]}'

MSG
wait -n $tulip_pid $ivy_pid
