#!/usr/bin/env bash
# `make images`: the Ivy image and the Tulip image (VARIANTS, default cpu)
# built with buildah, daemonless: no Docker engine, vfs storage, chroot
# isolation (what works on a machine without privileges for overlays or
# namespaces). deploy/images/README.md says what differs from `docker build`.
#
# LOCAL_BASES=1 (the default) builds on local stand-ins for the base images
# (bases.sh: Debian 13 root filesystems from mmdebstrap) and takes the CPU
# variant's PyTorch from PyPI instead of PyTorch's CPU index; LOCAL_BASES=0
# pulls the pinned bases and uses the CPU index, as `docker build` does.
# HOST_CA_BUNDLE (bases.sh) is for machines behind a TLS-intercepting proxy.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILDAH=${BUILDAH:-buildah --storage-driver vfs}
VERSION=${VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)}
VARIANTS=${VARIANTS:-cpu}
# No --layers: with vfs every cached step is a full copy of the root
# filesystem (tens of GB for the Tulip image); the cargo and pip cache
# mounts still make rebuilds incremental.
args=(--isolation chroot)

if [ "${LOCAL_BASES:-1}" = 1 ]; then
    BUILDAH="$BUILDAH" deploy/images/bases.sh
    base=${BASE_PREFIX:-localhost/tulip-rose-base}
    args+=(--build-arg "RUST_IMAGE=$base/rust:trixie"
           --build-arg "DEBIAN_IMAGE=$base/debian:trixie"
           --build-arg "PYTHON_IMAGE=$base/python:trixie"
           --build-arg "TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://pypi.org/simple}")
fi

start=$(date +%s)
$BUILDAH bud "${args[@]}" -f deploy/ivy.Dockerfile -t "tulip-rose/ivy:$VERSION" .
for variant in $VARIANTS; do
    $BUILDAH bud "${args[@]}" -f deploy/tulip.Dockerfile --build-arg "VARIANT=$variant" \
        -t "tulip-rose/tulip:$VERSION-$variant" .
done
echo "images built in $(( $(date +%s) - start ))s:"
$BUILDAH images --filter reference='*tulip-rose/*'
