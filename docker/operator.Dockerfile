# embedfleet operator image: ghcr.io/embedfleet/operator:VERSION. One file builds the published
# image and the local one (docs/development.md, "Images"):
#   published, from the repository root, installing the lock's pins from PyPI:
#     docker build -f docker/operator.Dockerfile -t ghcr.io/embedfleet/operator:0.1.0 .
#   local, on the Debian base with no network (what `make images` runs):
#     buildah bud --pull=false --network=none -v WHEELHOUSE:/wheels:ro \
#       --build-arg BASE_IMAGE=localhost/embedfleet/base:KEY \
#       --build-arg PIP_ARGS="--no-index --find-links /wheels" -f docker/operator.Dockerfile .
ARG BASE_IMAGE=python:3.11-slim
# One stage, so a build never holds a second copy of the venv. buildah (without --layers) commits
# it as one layer, in which the sources copied to /src and removed again do not appear.
FROM ${BASE_IMAGE}
# Where pip finds packages: empty means PyPI; local builds point it at the bind-mounted wheelhouse.
ARG PIP_ARGS=""
WORKDIR /src
COPY docker/locks/operator.txt lock.txt
COPY common common
COPY operator operator
# Every dependency is pinned by the lock, so --no-deps installs exactly it on either path.
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps ${PIP_ARGS} -r lock.txt ./common ./operator \
 && rm -rf /src
WORKDIR /
# Non-root, matching the chart's securityContext (runAsUser 65532, read-only root FS): kopf and
# Python write only under /tmp, the chart's emptyDir.
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp TMPDIR=/tmp XDG_CACHE_HOME=/tmp/.cache PIP_NO_CACHE_DIR=1
USER 65532:65532
# PID 1 is kopf's event loop, which stops its handlers and releases the Lease on SIGTERM.
ENTRYPOINT ["embedfleet-operator"]
