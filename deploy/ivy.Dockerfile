# Ivy, the HTTP/gRPC gateway: one release-built Rust binary on a slim Debian
# base, running as an unprivileged user. It holds no model files: Ivy
# tokenizes with the tokenizer.json the Tulip replicas serve (Info), so it
# always matches the model they run.
#
#   docker build -f deploy/ivy.Dockerfile -t tulip-rose/ivy:0.1.0 .
#
# Base images are pinned to exact releases; mirror them by digest in your
# registry for bit-for-bit rebuilds. They are build arguments, so a machine
# that cannot pull them builds with local stand-ins (`make images`,
# deploy/images/).

ARG RUST_IMAGE=rust:1.95.0-slim-trixie
ARG DEBIAN_IMAGE=debian:13.1-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
# Cargo loads every workspace member's manifest, so all members are copied.
COPY Cargo.toml Cargo.lock ./
COPY proto proto
COPY telemetry telemetry
COPY ivy ivy
COPY tulip tulip
COPY bench/crates bench/crates
# The same command as `make ivy`; target/ lives in a cache mount, so the
# binary is copied out within the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --profile dist -p ivy \
    && install -m 0755 target/dist/ivy /usr/local/bin/ivy

FROM ${DEBIAN_IMAGE}
RUN groupadd --system --gid 10001 ivy \
    && useradd --system --uid 10001 --gid ivy --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin ivy \
    && install -d -o 10001 -g 10001 /var/lib/ivy
# /var/lib/ivy: the Batch API's store when IVY_BATCH_DIR points there (a
# volume mounted over it takes this owner; docker-compose.yml).
COPY --from=build /usr/local/bin/ivy /usr/local/bin/ivy
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/ivy"]
