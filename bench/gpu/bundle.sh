#!/usr/bin/env bash
# Builds everything that travels to a GPU machine besides the tracked tree
# into one git-ignored folder, strips it, and checks the size limit:
#   _native.abi3.so  the Tulip extension (abi3: imports on Python 3.10+)
#   ivy              the gateway (for the concurrency chart through HTTP)
#   loadgen          the compiled load generator (when its crate exists)
#   protos.desc      tulip/ivy descriptor set: stubs built at run time with
#                    any grpcio/protobuf (generated code pins new versions)
# Usage: bench/gpu/bundle.sh OUT_DIR   (env: PYTHON, MATURIN, CARGO,
# CARGO_TARGET_DIR, LIMIT_MIB)
set -euo pipefail
out=${1:?usage: bundle.sh OUT_DIR}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
PYTHON=${PYTHON:-.venv/bin/python}
MATURIN=${MATURIN:-$(dirname "$PYTHON")/maturin}
CARGO=${CARGO:-cargo}
target=${CARGO_TARGET_DIR:-$repo/target}
# Everything that travels: tracked files + this folder, with 10 MiB spare
# under the 64 MiB a device call carries.
limit_mib=${LIMIT_MIB:-54}

rm -rf "$out" && mkdir -p "$out"
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT

CARGO_TARGET_DIR=$target "$MATURIN" build --release --quiet -o "$wheels"
"$PYTHON" - "$wheels" "$out" <<'PY'
import glob, sys, zipfile
wheel = sorted(glob.glob(f"{sys.argv[1]}/*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.startswith("tulip/_native") and n.endswith(".so"))
    with open(f"{sys.argv[2]}/_native.abi3.so", "wb") as f:
        f.write(z.read(name))
print(f"extension from {wheel}")
PY
bins=(ivy)
if grep -q '"bench/crates/loadgen"' Cargo.toml; then bins+=(loadgen); fi
for b in "${bins[@]}"; do
    # Ivy as shipped (`make ivy`); the load client on the plain release profile.
    profile=release
    if [ "$b" = ivy ]; then profile=dist; fi
    CARGO_TARGET_DIR=$target "$CARGO" build --profile "$profile" --quiet -p "$b"
    cp "$target/$profile/$b" "$out/$b"
done
strip --strip-unneeded "$out/_native.abi3.so"
for b in "${bins[@]}"; do strip "$out/$b"; done
"$PYTHON" -c "import sys; from pathlib import Path; from tulip.client import write_descriptors; write_descriptors(Path(sys.argv[1]))" "$out/protos.desc"

bundle=$(du -sb "$out" | cut -f1)
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
total=$((bundle + tracked))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
ls -l "$out"
echo "gpu bundle: $(mib "$bundle") in $out; tracked tree: $(mib "$tracked"); travelling: $(mib "$total") (limit $limit_mib MiB)"
if [ "$total" -gt $((limit_mib * 1048576)) ]; then
    echo "the travelling tree is over $limit_mib MiB" >&2
    exit 1
fi
