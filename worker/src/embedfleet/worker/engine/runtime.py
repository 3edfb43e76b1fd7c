"""How the encoder runs on a CPU: op by op (eager PyTorch), compiled by `torch.compile` (inductor),
or converted once to an OpenVINO graph.

On a CPU the per-operator dispatch of eager PyTorch is what kernel launches are on a GPU: a fixed
cost per op that dominates small batches. The compiled runtimes take the same model module and the
same packed batch, with attention in the traceable padded layout (`padded.PaddedPlan`), and
return the packed hidden states; heads and pooling stay the eager ones (a handful of ops). Which
is the default is a measurement (docs/benchmarks/README.md, "CPU engine paths"); every runtime
meets the same parity tests (tests/worker/engine/test_engine_runtimes.py).

OpenVINO is an optional extra of the worker (`embedfleet-worker[openvino]`), imported only here and
only when selected, so the GPU image never carries it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt
import torch
from torch.jit._trace import TracerWarning

from embedfleet.common.caches import user_cache_dir
from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import ModelDir
from embedfleet.worker.engine.attention import GroupedBackend
from embedfleet.worker.engine.batch import DeviceBatch, pack, to_device
from embedfleet.worker.engine.forward import Runtime, default_outputs
from embedfleet.worker.engine.models import Model
from embedfleet.worker.engine.models.family import load_model
from embedfleet.worker.engine.padded import PaddedPlan, padded_layout, plan_tensors
from embedfleet.worker.engine.pooling import Pooler
from embedfleet.worker.engine.precision import (
    PARITY_MAX_SCORE_DIFF,
    PARITY_MIN_COSINE,
    REDUCED_MARGIN,
    candidate_dtype,
)
from embedfleet.worker.engine.probe import agreement, probe_items

log = logging.getLogger(__name__)

RuntimeName = Literal["auto", "eager", "inductor", "openvino"]
RUNTIMES: tuple[RuntimeName, ...] = get_args(RuntimeName)

#: the graph's inputs, in the order `_Traced.forward` takes them
INPUT_NAMES = ("input_ids", "type_ids", "positions", "gather", "inverse", "mask")

#: OpenVINO's inference precision for each compute dtype
OV_PRECISIONS = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


#: the longest sequence the OpenVINO runtime takes: its attention holds each sequence's L x L
#: scores per head (16 heads x 2,048^2 x 4 bytes = 268 MB), so a model allowing more serves
#: this many tokens under it (the gateway reads the worker's limit, and answers past it as usual)
OPENVINO_MAX_TOKENS = 2048


def openvino() -> Any:
    """The openvino module, imported without its usage telemetry.

    `import openvino` loads its converter, which reports each conversion (a few dozen events) to
    Google Analytics unless the user opted out in their home directory: each event a `fork()`ed
    process, and each fork after gRPC started wrote `fork_posix.cc ... skipping fork() handlers`
    to stderr. A missing openvino_telemetry package is the converter's own supported case (it
    falls back to a no-op stub), so the package is marked missing before the first import.
    """
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
    return importlib.import_module("openvino")


def openvino_available() -> bool:
    return importlib.util.find_spec("openvino") is not None


def auto_runtime(installed: bool, kept_cache: bool, max_tokens: int) -> RuntimeName:
    """What auto runs on a CPU. OpenVINO is the fastest per batch on every measured point
    (docs/benchmarks/README.md, "CPU engine paths"), but its first conversion of a model is most
    of a start-up: it is chosen where that is paid once, i.e. where the converted graph is kept
    in a cache that outlives the process (`--openvino-cache-dir` given: `embedfleet serve` points
    it under ~/.cache, the operator into a model cache claim). A pod's default cache is its
    emptyDir, which every new pod, a worker woken from zero too, would convert into again: eager.
    A model allowing more than OpenVINO's attention bound stays eager too, so auto never lowers
    a model's input limit."""
    if installed and kept_cache and max_tokens <= OPENVINO_MAX_TOKENS:
        return "openvino"
    return "eager"


def graph_inputs(
    batch: DeviceBatch,
    lengths: npt.NDArray[np.int64],
    keys: npt.NDArray[np.int64] | None = None,
) -> tuple[torch.Tensor, ...]:
    """The compiled graph's inputs for one packed batch, in `INPUT_NAMES` order; key lengths
    (`keys`) only change the values of its key mask, so one graph serves batches with and
    without them."""
    gather, inverse, mask = plan_tensors(padded_layout(lengths, keys))
    return (batch.input_ids, batch.type_ids, batch.positions, gather, inverse, mask)


class _Traced(torch.nn.Module):
    """The model's encoder as a module of plain tensor inputs: what tracing and compiling see."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        type_ids: torch.Tensor,
        positions: torch.Tensor,
        gather: torch.Tensor,
        inverse: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        # Encoders read ids, segment ids and positions only; the pooling fields stay outside.
        batch = DeviceBatch(
            input_ids, type_ids, positions, input_ids, input_ids, input_ids, input_ids, gather
        )
        plan = PaddedPlan(gather, inverse, mask, self.model.shape.causal)
        return self.model.forward(batch, plan)


def _filler(lengths: tuple[int, ...]) -> tuple[DeviceBatch, npt.NDArray[np.int64]]:
    """A packed batch of ones with sequences of `lengths`, and its host lengths."""
    ids = np.ones(sum(lengths), np.int32)
    host = pack([Tokens(ids, np.asarray(lengths, np.int32))])
    return to_device(host, torch.device("cpu")), host.lengths


def example_inputs(lengths: tuple[int, ...] = (3, 5)) -> tuple[torch.Tensor, ...]:
    """A small two-sequence batch to trace with (every shape is dynamic afterwards)."""
    return graph_inputs(*_filler(lengths))


class InductorRuntime:
    """`torch.compile` with dynamic shapes: one graph for every (T, B, L); dynamo still
    specializes sizes 0 and 1, so a single-sequence batch compiles once more on first use."""

    name = "inductor"

    def __init__(self, model: Model) -> None:
        self._fn = torch.compile(_Traced(model), dynamic=True)

    def hidden(
        self,
        batch: DeviceBatch,
        lengths: npt.NDArray[np.int64],
        keys: npt.NDArray[np.int64] | None = None,
    ) -> torch.Tensor:
        out: torch.Tensor = self._fn(*graph_inputs(batch, lengths, keys))
        return out


def convert(model: Model) -> Any:
    """The encoder as an `openvino.Model` (float32 weights as constants; every dimension
    dynamic), traced once from the module with a small example batch."""
    ov = openvino()
    with torch.no_grad(), warnings.catch_warnings():
        # The head counts are read as ints while tracing: constants of the model, as intended.
        warnings.simplefilter("ignore", TracerWarning)
        # OpenVINO's PyTorch frontend traces with TorchScript, which torch now marks deprecated.
        warnings.filterwarnings("ignore", "`torch.jit.trace", FutureWarning)
        return ov.convert_model(
            _Traced(model),
            example_input=example_inputs(),
            input=[ov.PartialShape([-1])] * 5 + [ov.PartialShape([-1, 1, 1, -1])],
        )


def cache_dir(configured: str = "") -> Path:
    """Where converted graphs are kept between starts: `configured` (--openvino-cache-dir), else
    $XDG_CACHE_HOME/embedfleet/openvino (~/.cache without it)."""
    return Path(configured) if configured else user_cache_dir("openvino")


def cache_key(model_dir: ModelDir, bidirectional: bool | None) -> str:
    """What the converted graph depends on: the checkpoint's files, the code that builds the
    encoder, and the converter's and torch's versions."""
    ov = openvino()
    digest = hashlib.sha256()
    for file in sorted(model_dir.path.iterdir()):
        if file.is_file():
            stat = file.stat()
            digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    code = Path(__file__).parent
    for source in sorted([*code.glob("models/*.py"), code / "padded.py", code / "runtime.py"]):
        digest.update(source.read_bytes())
    digest.update(f"{ov.get_version()};{torch.__version__};{bidirectional}".encode())
    return digest.hexdigest()[:24]


def converted_model(
    model_dir: ModelDir, model: Model, bidirectional: bool | None, root: Path
) -> Any:
    """The encoder's OpenVINO graph: read from the cache under `root` when this checkpoint and
    code were converted before (a start then costs a read, not a trace and a conversion), else
    converted and saved there. A cache that cannot be written only costs the next start the
    conversion."""
    ov = openvino()
    entry = root / cache_key(model_dir, bidirectional)
    path = entry / "encoder.xml"
    if path.is_file():
        try:
            graph = ov.Core().read_model(str(path))
            entry.touch()  # most recently used: pruning keeps it
            return graph
        except RuntimeError:
            log.warning("unreadable cached OpenVINO graph %s: converting again", path)
            shutil.rmtree(entry, ignore_errors=True)  # so this conversion replaces it
    converted = convert(model)
    try:
        _save(ov, converted, entry)
        _prune(root, KEPT_GRAPHS)
    except OSError as err:
        log.warning("could not cache the OpenVINO graph in %s: %s", entry, err)
    return converted


#: converted graphs kept per cache: each checkpoint or code change keys a new one (tens of MB to
#: GBs), so an unbounded cache fills a node's disk over upgrades
KEPT_GRAPHS = 8


def _prune(root: Path, keep: int) -> None:
    """Removes all but the `keep` most recently used entries (a read touches its entry)."""
    entries = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    entries.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in entries[keep:]:
        shutil.rmtree(stale, ignore_errors=True)


def _save(ov: Any, converted: Any, entry: Path) -> None:
    """Writes the graph into a folder of its own, then renames that to `entry`: a cache shared by
    several pods (a model cache claim; every container is PID 1) never shows a half-written or
    mixed pair of files, and the first writer's entry stays."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=entry.parent))
    try:
        # Weights stay float32 in the file: the precision hint decides at compile time.
        ov.save_model(converted, str(partial / "encoder.xml"), compress_to_fp16=False)
        if entry.is_dir() and not (entry / "encoder.xml").is_file():
            shutil.rmtree(entry, ignore_errors=True)  # an entry left incomplete by older code
        try:
            partial.rename(entry)
        except OSError:
            if not (entry / "encoder.xml").is_file():
                raise
            # Another process saved the same graph first: keep its entry.
    finally:
        shutil.rmtree(partial, ignore_errors=True)


class OpenVINORuntime:
    """A converted encoder compiled for this CPU at `precision` (OpenVINO's inference precision
    hint: f32, bf16 or f16; weights are repacked to it once, here)."""

    name = "openvino"

    def __init__(self, converted: Any, precision: str, threads: int = 0) -> None:
        ov = openvino()
        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": precision,
            # One request at a time (the engine thread): no streams, every core on the request.
            "PERFORMANCE_HINT": "LATENCY",
        }
        if threads > 0:
            config["INFERENCE_NUM_THREADS"] = threads
        start = time.perf_counter()
        compiled = ov.Core().compile_model(converted, "CPU", config)
        self.compile_seconds = time.perf_counter() - start
        self.precision = precision
        # Qwen3 reads no segment ids: the converted graph then has no input for them.
        self._inputs = [INPUT_NAMES.index(next(iter(p.get_names()))) for p in compiled.inputs]
        self._request = compiled.create_infer_request()

    def hidden(
        self,
        batch: DeviceBatch,
        lengths: npt.NDArray[np.int64],
        keys: npt.NDArray[np.int64] | None = None,
    ) -> torch.Tensor:
        args = graph_inputs(batch, lengths, keys)
        self._request.infer([args[i].numpy() for i in self._inputs], share_inputs=True)
        # The output buffer is the request's own, rewritten by the next infer: copy it out.
        out = self._request.get_output_tensor(0).data
        return torch.from_numpy(np.array(out, np.float32))


def best_seconds(call: Callable[[], object], reps: int = 3) -> float:
    """Best time of `reps` calls of `call`, after one untimed call (memory and kernel set-up)."""
    call()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def seconds_per_batch(runtime: Runtime, tokens: int = 256, reps: int = 3) -> float:
    """Best time of one forward over two sequences of `tokens` / 2 ids."""
    half = max(1, tokens // 2)
    batch, lengths = _filler((half, half))
    return best_seconds(lambda: runtime.hidden(batch, lengths), reps)


def filler_batch(length: int) -> tuple[DeviceBatch, npt.NDArray[np.int64]]:
    """A packed batch of one sequence of `length` ids, and its host lengths."""
    return _filler((length,))


#: the sequence lengths auto times OpenVINO against eager at, doubling from this one up to the
#: model's limit (which is always timed last)
SEQLEN_PROBE_START = 32

#: the start-up seconds auto spends on that timing at most: a long-context model's eager forward
#: at its limit takes seconds on a small CPU, so the lengths past the budget are left to eager
SEQLEN_PROBE_SECONDS = 8.0


def seqlen_probe_lengths(max_tokens: int) -> list[int]:
    """Ascending lengths to time: 32, 64, ... below `max_tokens`, then `max_tokens` itself."""
    lengths: list[int] = []
    length = SEQLEN_PROBE_START
    while length < max_tokens:
        lengths.append(length)
        length *= 2
    return [*lengths, max_tokens]


#: (sequence length, OpenVINO seconds, eager seconds) of one timed length
SeqlenTiming = tuple[int, float, float]


def openvino_seqlen(
    lengths: Sequence[int],
    timer: Callable[[int], tuple[float, float]],
    budget_seconds: float = SEQLEN_PROBE_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[int, list[SeqlenTiming]]:
    """The longest sequence auto runs in OpenVINO, and the timings it was read from.

    `timer(length)` gives (OpenVINO seconds, eager seconds) for one sequence of `length` tokens.
    Lengths are timed in ascending order until eager is the faster (it is the sequences' length,
    not the batch's tokens, that turns the ranking, and on every CPU measured it turned once) or
    the budget is spent; the answer is the last length OpenVINO won, 0 if it lost the first.
    """
    start = clock()
    won, timings = 0, list[SeqlenTiming]()
    for length in lengths:
        if timings and clock() - start > budget_seconds:
            break
        openvino_s, eager_s = timer(length)
        timings.append((length, openvino_s, eager_s))
        if openvino_s >= eager_s:
            break
        won = length
    return won, timings


def reduced_pays(reduced_seconds: float, float32_seconds: float) -> bool:
    """Whether a reduced-precision forward beats float32's by the margin the eager choice asks."""
    return reduced_seconds < REDUCED_MARGIN * float32_seconds


def openvino_at_dtype(
    model_dir: ModelDir,
    choice: str,
    threads: int,
    max_tokens: int,
    bidirectional: bool | None = None,
    cache: str = "",
) -> tuple[torch.dtype, Model, OpenVINORuntime]:
    """The compute dtype for `choice`, the float32 model (the heads and the reference) and the
    OpenVINO runtime compiled at that dtype.

    auto on a CPU with native bf16 measures, as the eager path does, on OpenVINO itself: bf16 is
    kept only if its forward is faster than f32's here (both compiled from one conversion, timed
    alternately) and the probe inputs agree with eager float32.
    """
    cpu = torch.device("cpu")
    model = load_model(model_dir, torch.float32, cpu, bidirectional)
    dtype, must_probe = candidate_dtype(choice, cpu)
    start = time.perf_counter()
    converted = converted_model(model_dir, model, bidirectional, cache_dir(cache))
    converted_s = time.perf_counter() - start
    fast = OpenVINORuntime(converted, OV_PRECISIONS[dtype], threads)
    chosen: tuple[torch.dtype, OpenVINORuntime] = (dtype, fast)
    if must_probe:
        exact = OpenVINORuntime(converted, "f32", threads)
        fast_s, exact_s = float("inf"), float("inf")
        for _ in range(2):
            fast_s = min(fast_s, seconds_per_batch(fast))
            exact_s = min(exact_s, seconds_per_batch(exact))
        items = probe_items(model_dir, max_tokens)
        grouped, pooling = GroupedBackend(), Pooler.of(model_dir, cpu)
        got = [default_outputs(model, grouped, pooling, it.tokens, cpu, fast) for it in items]
        want = [default_outputs(model, grouped, pooling, it.tokens, cpu) for it in items]
        cosine, score_diff = agreement(got, want, model_dir.task)
        keep = (
            reduced_pays(fast_s, exact_s)
            and cosine >= PARITY_MIN_COSINE
            and score_diff <= PARITY_MAX_SCORE_DIFF
        )
        log.info(
            "openvino %s vs f32: %.2f ms vs %.2f ms per 256 tokens, min cosine %.6f, max score "
            "diff %.2e -> %s",
            fast.precision,
            1e3 * fast_s,
            1e3 * exact_s,
            cosine,
            score_diff,
            "kept" if keep else "float32",
        )
        if not keep:
            chosen = (torch.float32, exact)
    log.info(
        "openvino runtime ready",
        extra={
            "precision": chosen[1].precision,
            "convert_seconds": round(converted_s, 3),
            "compile_seconds": round(chosen[1].compile_seconds, 3),
        },
    )
    return chosen[0], model, chosen[1]
