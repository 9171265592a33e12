# Multi-stage build of the manager: a static musl binary on distroless, as a
# non-root user, for those who build with Docker. `make image` (hack/build-image.sh)
# builds the shipped image without any daemon: from scratch, a static glibc binary,
# user 65532, reproducible by digest (docs/install.md).
FROM rust:1.95-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl && apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin ballast

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/ballast /ballast
USER 65532:65532
ENTRYPOINT ["/ballast"]
