# embedfleet operator image. Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t ghcr.io/embedfleet/operator:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY common common
COPY operator operator
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir ./common ./operator

FROM python:3.11-slim
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Non-root, matching the chart's securityContext (runAsUser 65532, read-only root FS).
USER 65532:65532
ENTRYPOINT ["embedfleet-operator"]
