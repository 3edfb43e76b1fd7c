"""Where `embedfleet serve` finds the gateway, a Rust binary (gateway/, `make install` builds
it): the one named by --gateway-binary or $EMBEDFLEET_SERVE_GATEWAY_BINARY, else
`embedfleet-gateway` on PATH, else this clone's build cache (hack/build-gateway.sh --key
names the build of the sources as they are, without building)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

BINARY = "embedfleet-gateway"
BINARY_ENV = "EMBEDFLEET_SERVE_GATEWAY_BINARY"
#: present in a clone (an editable install); absent where the package was installed on its own
BUILD_SCRIPT = Path(__file__).resolve().parents[4] / "hack" / "build-gateway.sh"


class GatewayBinaryError(RuntimeError):
    """No gateway binary where `embedfleet serve` looks; the message says what to do."""


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def cached_build(script: Path = BUILD_SCRIPT) -> Path | None:
    """The cached build of this clone's gateway/ sources, if it is built."""
    if not script.is_file():
        return None
    try:
        done = subprocess.run(
            ["bash", str(script), "--key"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None
    path = Path(lines[-1])
    return path if _executable(path) else None


def find_gateway_binary(
    setting: str = "", env: Mapping[str, str] | None = None, script: Path = BUILD_SCRIPT
) -> Path:
    named = setting or (os.environ if env is None else env).get(BINARY_ENV, "")
    if named:
        if not _executable(Path(named)):
            raise GatewayBinaryError(f"the gateway binary {named} is not an executable file")
        return Path(named)
    on_path = shutil.which(BINARY)
    if on_path:
        return Path(on_path)
    built = cached_build(script)
    if built is not None:
        return built
    raise GatewayBinaryError(
        f"the gateway binary ({BINARY}) is not built: run `make install` "
        "(it needs a Rust toolchain), or name one with --gateway-binary"
    )
