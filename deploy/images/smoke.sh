#!/usr/bin/env bash
# `make images-smoke`: runs the images `make images` built, by their own
# entrypoints, and embeds a request through them (deploy/images/README.md).
#   1. split: the Tulip image's entrypoint (python -m tulip, the embedded
#      model) and the Ivy image's entrypoint in front of it over TCP;
#   2. single node: the Tulip image running `tulip-rose serve` (its Ivy from
#      the tulip-rose-ivy wheel) as the compose single-node profile does.
# Each answer is compared with sentence-transformers on the host (cosine),
# then each entrypoint gets SIGTERM and must exit 0. TULIP_IMAGE=host checks
# the Ivy image alone: in front of this checkout's `python -m tulip`.
#
# Containers run with `buildah run` (chroot isolation: this machine's
# network, so the ports are host ports). buildah answers its own SIGTERM by
# killing the container's process, so the entrypoint process is signalled
# directly, as a container engine's stop would. Logs go to OUT (default
# smoke-logs/).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILDAH=${BUILDAH:-buildah --storage-driver vfs}
VERSION=${VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)}
PYTHON=${PYTHON:-.venv/bin/python}  # the host's, with sentence-transformers
OUT=$(realpath -m "${1:-smoke-logs}")
TULIP_IMAGE=${TULIP_IMAGE:-tulip-rose/tulip:$VERSION-cpu}
IVY_IMAGE=${IVY_IMAGE:-tulip-rose/ivy:$VERSION}
mkdir -p "$OUT"
port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

containers=() pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    for c in "${containers[@]}"; do $BUILDAH rm "$c" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

# entrypoint_of PID: the first process under PID (buildah run) that is not
# buildah's own (it re-executes itself as buildah-chroot-exec and such to
# set up the chroot) and runs inside the container's root.
entrypoint_of() {
    local queue=("$1") pid child argv0
    while [ ${#queue[@]} -gt 0 ]; do
        pid=${queue[0]} queue=("${queue[@]:1}")
        for child in $(pgrep -P "$pid"); do
            argv0=$(tr '\0' '\n' < "/proc/$child/cmdline" 2>/dev/null | head -1)
            if [[ "$argv0" != *buildah* ]] && [ "$(readlink "/proc/$child/root")" != / ]; then
                echo "$child"; return 0
            fi
            queue+=("$child")
        done
    done
    return 1
}

# run NAME IMAGE ENTRYPOINT ENV... -- [ARGS...]: the container in the
# background, running the image's entrypoint (ENTRYPOINT "") or the one
# given, plus ARGS; sets $entry_pid to that process and $runner to buildah's.
run() {
    local name=$1 image=$2 override=$3; shift 3
    local envs=() args=() entrypoint=() ctr
    while [ "$1" != "--" ]; do envs+=(--env "$1"); shift; done
    shift; args=("$@")
    if [ -n "$override" ]; then
        read -ra entrypoint <<< "$override"
    else
        mapfile -t entrypoint < <($BUILDAH inspect --type image \
            --format '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}' "$image" | sed '/^$/d')
    fi
    ctr=$($BUILDAH from --pull-never --name "smoke-$name-$$" "$image")
    containers+=("$ctr")
    echo "== $name: $image runs ${entrypoint[*]} ${args[*]}"
    $BUILDAH run --isolation chroot "${envs[@]}" "$ctr" -- "${entrypoint[@]}" "${args[@]}" > "$OUT/$name.log" 2>&1 &
    runner=$!
    pids+=("$runner")
    # Found the same twice in a row: the entrypoint, not a passing helper.
    local seen=""
    entry_pid=""
    for _ in $(seq 300); do
        sleep 0.2
        seen=$(entrypoint_of "$runner") || continue
        [ "$seen" = "$entry_pid" ] && break
        entry_pid=$seen
    done
    [ -n "$entry_pid" ] || { echo "no entrypoint process for $name"; cat "$OUT/$name.log"; exit 1; }
    pids+=("$entry_pid")
    echo "   pid $entry_pid as uid $(ps -o uid= -p "$entry_pid" | tr -d ' '): $(tr '\0' ' ' < "/proc/$entry_pid/cmdline")"
}

wait_ready() {  # URL NAME
    for _ in $(seq 1200); do
        if "$PYTHON" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2>/dev/null; then
            return 0
        fi
        sleep 0.5
    done
    echo "$2 not ready at $1"; tail -40 "$OUT/$2.log"; exit 1
}

check() {  # HTTP-URL WHAT
    "$PYTHON" - "$1" "$2" <<'PY'
import json, sys, time, urllib.request
import numpy as np
from sentence_transformers import SentenceTransformer
from tulip.launcher import default_model_dir

url, what = sys.argv[1], sys.argv[2]
texts = ["What is an embedding?", "A vector that captures meaning.", "Buildah builds images without a daemon."]
t0 = time.monotonic()
req = urllib.request.Request(url + "/v1/embeddings", data=json.dumps({"input": texts}).encode(),
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=120) as r:
    body = json.loads(r.read())
ms = (time.monotonic() - t0) * 1000
got = np.array([d["embedding"] for d in body["data"]])
want = SentenceTransformer(default_model_dir(), device="cpu").encode(texts, normalize_embeddings=True)
cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
print(f"   {what}: {got.shape[0]} x {got.shape[1]} vectors of {body['model']} in {ms:.0f} ms, "
      f"min cosine vs sentence-transformers {cos.min():.6f}")
assert cos.min() >= 0.999, cos
PY
}

stop() {  # PID NAME: SIGTERM to the entrypoint, which must exit 0
    local pid=$1 name=$2 runner=$3
    kill -TERM "$pid"
    local rc=0
    wait "$runner" || rc=$?
    echo "   $name stopped on SIGTERM: exit $rc"
    [ "$rc" = 0 ] || { tail -40 "$OUT/$name.log"; exit 1; }
}

start=$(date +%s)
tulip_port=$(port) tulip_metrics=$(port) ivy_port=$(port) ivy_grpc=$(port)
if [ "$TULIP_IMAGE" = host ]; then
    echo "== tulip: $PYTHON -m tulip on this machine (TULIP_IMAGE=host)"
    TULIP_HOST=127.0.0.1 TULIP_PORT="$tulip_port" TULIP_METRICS_PORT="$tulip_metrics" \
        "$PYTHON" -m tulip > "$OUT/tulip.log" 2>&1 &
    tulip_pid=$! tulip_runner=$!
    pids+=("$tulip_pid")
else
    run tulip "$TULIP_IMAGE" "" TULIP_HOST=127.0.0.1 TULIP_PORT="$tulip_port" TULIP_METRICS_PORT="$tulip_metrics" --
    tulip_pid=$entry_pid tulip_runner=$runner
fi
run ivy "$IVY_IMAGE" "" IVY_TULIP="http://127.0.0.1:$tulip_port" IVY_HOST=127.0.0.1 IVY_PORT="$ivy_port" \
    IVY_GRPC_PORT="$ivy_grpc" --
ivy_pid=$entry_pid ivy_runner=$runner
wait_ready "http://127.0.0.1:$ivy_port/ready" ivy
check "http://127.0.0.1:$ivy_port" "Ivy image -> Tulip ${TULIP_IMAGE/#host/on the host}"
stop "$ivy_pid" ivy "$ivy_runner"
stop "$tulip_pid" tulip "$tulip_runner"

if [ "$TULIP_IMAGE" = host ]; then
    echo "smoke of the Ivy image passed in $(( $(date +%s) - start ))s; logs in $OUT"
    exit 0
fi
serve_port=$(port) serve_grpc=$(port)
# The entrypoint docker-compose.yml's single-node profile gives the image.
run serve "$TULIP_IMAGE" "tulip-rose serve" TULIP_ROSE_REPLICAS=2 -- \
    --host 127.0.0.1 --port "$serve_port" --grpc-port "$serve_grpc"
serve_pid=$entry_pid serve_runner=$runner
wait_ready "http://127.0.0.1:$serve_port/ready" serve
check "http://127.0.0.1:$serve_port" "tulip-rose serve in the Tulip image"
stop "$serve_pid" serve "$serve_runner"
echo "smoke passed in $(( $(date +%s) - start ))s; logs in $OUT"
