"""Where `embedfleet serve` finds its Rust parts (`make install` builds both).

The gateway (gateway/): the binary named by --gateway-binary or $EMBEDFLEET_SERVE_GATEWAY_BINARY,
else `embedfleet-gateway` on PATH, else this clone's build cache (hack/build-gateway.sh --key
names the build of the sources as they are, without building).

The workers' Rust front (worker-front/, `embedfleet-worker --front rust`): the extension named by
$EMBEDFLEET_WORKER_FRONT_LIBRARY, else `embedfleet_front` on the Python path (an image's venv),
else this clone's build cache (hack/build-rust.sh worker-front --key)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

BINARY = "embedfleet-gateway"
BINARY_ENV = "EMBEDFLEET_SERVE_GATEWAY_BINARY"
#: present in a clone (an editable install); absent where the package was installed on its own
BUILD_SCRIPT = Path(__file__).resolve().parents[4] / "hack" / "build-gateway.sh"
#: the worker's own setting (--front-library) as its environment names it
FRONT_LIBRARY_ENV = "EMBEDFLEET_WORKER_FRONT_LIBRARY"
FRONT_MODULE = "embedfleet_front"
RUST_BUILD_SCRIPT = BUILD_SCRIPT.with_name("build-rust.sh")


class UnbuiltError(RuntimeError):
    """No gateway binary, or no Rust front, where `embedfleet serve` looks; the message says
    what to do."""


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def cached_build(script: Path = BUILD_SCRIPT, *args: str) -> Path | None:
    """The cached build that `script *args --key` names for this clone's sources, if built."""
    if not script.is_file():
        return None
    try:
        done = subprocess.run(
            ["bash", str(script), *args, "--key"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None
    path = Path(lines[-1])
    return path if path.is_file() else None


def find_gateway_binary(
    setting: str = "", env: Mapping[str, str] | None = None, script: Path = BUILD_SCRIPT
) -> Path:
    named = setting or (os.environ if env is None else env).get(BINARY_ENV, "")
    if named:
        if not _executable(Path(named)):
            raise UnbuiltError(f"the gateway binary {named} is not an executable file")
        return Path(named)
    on_path = shutil.which(BINARY)
    if on_path:
        return Path(on_path)
    built = cached_build(script)
    if built is not None and _executable(built):
        return built
    raise UnbuiltError(
        f"the gateway binary ({BINARY}) is not built: run `make install` "
        "(it needs a Rust toolchain), or name one with --gateway-binary"
    )


def find_front_library(
    env: Mapping[str, str] | None = None, script: Path = RUST_BUILD_SCRIPT
) -> str:
    """The workers' --front-library: a path, or "" where the worker imports the installed
    extension itself."""
    named = (os.environ if env is None else env).get(FRONT_LIBRARY_ENV, "")
    if named:
        if not Path(named).is_file():
            raise UnbuiltError(f"{FRONT_LIBRARY_ENV}={named} is not a file")
        return named
    if importlib.util.find_spec(FRONT_MODULE) is not None:
        return ""
    built = cached_build(script, "worker-front")
    if built is not None:
        return str(built)
    raise UnbuiltError(
        f"the workers' Rust front ({FRONT_MODULE}) is not built: run `make install` (it needs a "
        "Rust toolchain), or serve with --worker-front python"
    )
