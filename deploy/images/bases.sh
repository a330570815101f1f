#!/usr/bin/env bash
# Local stand-ins for the Dockerfiles' base images, for machines that cannot
# pull them (deploy/images/README.md). Each is a Debian 13 (trixie) root
# filesystem made by mmdebstrap from Debian's own packages, imported into
# buildah's storage as localhost/tulip-rose-base/NAME:
#   debian  minbase (stands in for debian:13.1-slim)
#   python  + python3, venv, pip (for python:3.12.12-slim-trixie; Debian's
#           Python is 3.13, which the abi3 wheel and PyPI's torch support)
#   rust    + gcc, libc6-dev, and this machine's Rust toolchain (the sysroot
#           of `rustc`, copied into /usr/local/{rustup,cargo} as the rust
#           image lays it out: Debian's rustc is older than the 1.95 the
#           Dockerfiles pin)
# An existing stand-in is kept; REBUILD=1 makes them again.
#
# Behind a TLS-intercepting proxy, HOST_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
# puts this machine's CA bundle in the stand-ins (and points pip and cargo
# at it), so builds on them can fetch crates and wheels. Local builds only:
# the certificates stay in images built on these bases.
set -euo pipefail
BUILDAH=${BUILDAH:-buildah --storage-driver vfs}
SUITE=${SUITE:-trixie}
PREFIX=${BASE_PREFIX:-localhost/tulip-rose-base}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

exists() { $BUILDAH images --quiet "$1" >/dev/null 2>&1; }

# import NAME TARBALL [buildah config flags...]
import() {
    local name=$1 tar=$2; shift 2
    local ctr
    ctr=$($BUILDAH from scratch)
    $BUILDAH add "$ctr" "$tar" /
    if [ -n "${HOST_CA_BUNDLE:-}" ]; then
        $BUILDAH copy "$ctr" "$HOST_CA_BUNDLE" /etc/ssl/certs/ca-certificates.crt >/dev/null
        set -- "$@" --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
            --env CARGO_HTTP_CAINFO=/etc/ssl/certs/ca-certificates.crt
    fi
    $BUILDAH config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd /bin/bash "$@" "$ctr"
    $BUILDAH commit --quiet "$ctr" "$PREFIX/$name:$SUITE" >/dev/null
    $BUILDAH rm "$ctr" >/dev/null
    echo "built $PREFIX/$name:$SUITE"
}

debstrap() {  # OUT.tar [--include=...]
    local out=$1; shift
    mmdebstrap --quiet --variant=minbase --include=ca-certificates "$@" "$SUITE" "$out"
}

if [ -n "${REBUILD:-}" ] || ! exists "$PREFIX/debian:$SUITE"; then
    debstrap "$work/debian.tar"
    import debian "$work/debian.tar"
fi

if [ -n "${REBUILD:-}" ] || ! exists "$PREFIX/python:$SUITE"; then
    debstrap "$work/python.tar" --include=python3,python3-venv,python3-pip,python-is-python3
    import python "$work/python.tar"
fi

if [ -n "${REBUILD:-}" ] || ! exists "$PREFIX/rust:$SUITE"; then
    debstrap "$work/rust.tar" --include=gcc,libc6-dev
    # This machine's toolchain (its sysroot, less the docs), in the rust
    # image's layout: the toolchain under /usr/local/rustup, its commands
    # in /usr/local/cargo/bin (no rustup inside).
    sysroot=$(rustc --print sysroot)
    version=$(rustc --version | cut -d' ' -f2)
    tc=$work/tc/usr/local/rustup/toolchains/$version
    mkdir -p "$tc" "$work/tc/usr/local/cargo/bin"
    cp -a "$sysroot/bin" "$sysroot/lib" "$sysroot/libexec" "$sysroot/etc" "$tc/"
    for tool in cargo rustc rustdoc; do
        ln -s "/usr/local/rustup/toolchains/$version/bin/$tool" "$work/tc/usr/local/cargo/bin/$tool"
    done
    tar -C "$work/tc" -rf "$work/rust.tar" usr/local/rustup usr/local/cargo
    import rust "$work/rust.tar" --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
        --env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
fi
