"""The control-plane binaries pinned in hack/tools, built on first use by hack/build-tools.sh."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# testing/src/embedfleet/testing/tools.py -> the repository root.
REPO_ROOT = Path(__file__).resolve().parents[4]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-tools.sh"
VERSIONS_FILE = REPO_ROOT / "hack" / "tools" / "versions.env"
# Points at a directory of already built binaries (same names as build-tools.sh writes); skips
# hack/build-tools.sh entirely, e.g. for a package installed outside a clone.
BIN_DIR_ENV = "EMBEDFLEET_BIN_DIR"

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)
KWOK_STAGES = "kwok-stages.yaml"


class ToolsError(RuntimeError):
    """The binaries are missing and could not be built."""


@dataclass(frozen=True)
class Toolset:
    """A directory holding every binary in BINARIES plus KWOK's stage configuration."""

    bin_dir: Path
    built: bool
    """True when this process compiled them; False when a cached build was reused."""

    def path(self, name: str) -> Path:
        if name not in BINARIES:
            raise KeyError(f"unknown tool {name!r}; expected one of {', '.join(BINARIES)}")
        return self.bin_dir / name

    @property
    def kwok_stages(self) -> Path:
        return self.bin_dir / KWOK_STAGES


def pinned_versions() -> dict[str, str]:
    """hack/tools/versions.env as a dict: K8S_VERSION, ETCD_VERSION, KWOK_VERSION, HELM_VERSION."""
    versions = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip()
    return versions


def run_build_script(*args: str, capture_stderr: bool, script: Path = BUILD_SCRIPT) -> str:
    """Runs a hack/build-*.sh script; returns the last line it printed (its output dir)."""
    if not script.is_file():
        raise ToolsError(
            f"{script} not found: embedfleet.testing builds its binaries from a clone of the "
            f"repository; set {BIN_DIR_ENV} to a directory of prebuilt binaries instead"
        )
    proc = subprocess.run(
        [str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if capture_stderr else None,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        detail = (proc.stderr or "")[-4000:] if capture_stderr else "see the output above"
        command = " ".join([script.name, *args])
        raise ToolsError(f"{command} failed ({proc.returncode}): {detail}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise ToolsError(f"{script.name} printed no output directory")
    return lines[-1]


RUST_BUILD_SCRIPT = REPO_ROOT / "hack" / "build-rust.sh"


def rust_artifact(crate: str, override_env: str, *, build: bool = True) -> Path:
    """The artifact of this tree's `crate` (a member of the root cargo workspace), compiled
    first by hack/build-rust.sh when no cached build matches (minutes cold: its progress goes to
    this process's stderr); the path in $`override_env` instead when set."""
    override = os.environ.get(override_env)
    if override:
        return Path(override)
    script = RUST_BUILD_SCRIPT
    expected = Path(run_build_script(crate, "--key", capture_stderr=True, script=script))
    if expected.is_file():
        return expected
    if not build:
        raise ToolsError(f"{expected} not built yet; run {script} {crate}")
    built = Path(run_build_script(crate, capture_stderr=False, script=script))
    if not built.is_file():
        raise ToolsError(f"{script.name} printed {built}, which is not a file")
    return built


def _missing(bin_dir: Path) -> list[str]:
    names = [*BINARIES, KWOK_STAGES]
    return [name for name in names if not (bin_dir / name).is_file()]


def ensure_tools(*, build: bool = True) -> Toolset:
    """Returns the pinned binaries, compiling them first when no cached build matches.

    A cold build takes tens of minutes on two cores; its progress goes to this process's stderr.
    """
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        bin_dir = Path(override)
        if missing := _missing(bin_dir):
            raise ToolsError(f"{BIN_DIR_ENV}={override} lacks {', '.join(missing)}")
        return Toolset(bin_dir=bin_dir, built=False)

    expected = Path(run_build_script("--key", capture_stderr=True))
    cached = (expected / ".complete").is_file()
    if not cached and not build:
        raise ToolsError(f"binaries not built yet; run {BUILD_SCRIPT}")
    # Also for a cached build: the script is then a few file checks, and fills in any file added
    # to the build since that cache entry was made.
    bin_dir = Path(run_build_script(capture_stderr=cached))
    if missing := _missing(bin_dir):
        raise ToolsError(f"{bin_dir} lacks {', '.join(missing)} after {BUILD_SCRIPT.name}")
    return Toolset(bin_dir=bin_dir, built=not cached)
