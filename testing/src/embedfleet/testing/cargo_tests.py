"""The gateway crate's own test executables (its unit tests, tests/contract.rs, tests/layers.rs)
and the shared crates' (crates/: what the gateway and the worker's Rust front both use),
compiled once per content key and kept under ~/.cache/embedfleet/gateway/tests/<key>.

`cargo test` in a fresh clone recompiles the crate even when nothing changed: cargo judges a local
crate by its files' mtimes, and a clone's are new (about 2 minutes on two cores, each CI run). The
executables depend on what the gateway binary's key covers plus tests/, so that key and the
tests' contents name them; a cached set is run as cargo would run it (in the crate's directory,
CARGO_MANIFEST_DIR set), with no cargo at all.

`python -m embedfleet.testing.cargo_tests` compiles them ahead (`make prepare`)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from embedfleet.common.cpus import detect_cores
from embedfleet.testing.gateway import BUILD_SCRIPT, CRATE, cargo_tool, child_env, gateway_binary
from embedfleet.testing.tools import ToolsError, run_build_script

#: the packages whose tests run: the gateway and the shared crates (the worker's front, a Python
#: extension, links against libpython only when loaded: it is tested from Python)
PACKAGES = ("embedfleet-gateway", "embedfleet-logs")
#: cached sets kept beside the newest (worktrees sharing the cache alternate between their trees)
KEEP = 4


@dataclass(frozen=True)
class TestRun:
    """Each executable's name, exit status and output, in the order they ran."""

    results: tuple[tuple[str, int, str], ...]

    @property
    def passed(self) -> bool:
        return all(code == 0 for _, code, _ in self.results)

    def output(self) -> str:
        return "\n".join(f"== {name}: exit {code}\n{out}" for name, code, out in self.results)


def tests_key(binary: Path) -> str:
    """The gateway binary's key (its cache directory's name) and the contents of tests/."""
    digest = hashlib.sha256(binary.parent.name.encode())
    for path in sorted((CRATE / "tests").rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(CRATE)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def test_executables() -> list[Path]:
    """This tree's test executables, compiled first when no cached set matches (minutes cold)."""
    binary = gateway_binary()
    root = binary.parent.parent.parent / "tests"
    cached = root / tests_key(binary)
    if not cached.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        with (root / ".build.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second caller waits, then finds the set
            if not cached.is_dir():
                _compile_into(cached)
                _prune(root, cached)
    return sorted(path for path in cached.iterdir() if path.is_file())


def _compile_into(cached: Path) -> None:
    target = run_build_script("--target-dir", capture_stderr=True, script=BUILD_SCRIPT)
    jobs = str(detect_cores())
    env = {**child_env(), "CARGO_TARGET_DIR": target, "CARGO_BUILD_JOBS": jobs}
    packages = [f"--package={name}" for name in PACKAGES]
    command = ["cargo", "test", "--release", "--locked", "--no-run", *packages]
    proc = subprocess.run(
        ["nice", "-n", "19", cargo_tool(), *command[1:], "--message-format=json", "-j", jobs],
        cwd=CRATE,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ToolsError(f"{' '.join(command)} failed ({proc.returncode}): {proc.stderr[-6000:]}")
    staging = Path(tempfile.mkdtemp(prefix=".building.", dir=cached.parent))
    for line in proc.stdout.splitlines():
        artifact = json.loads(line) if line.startswith("{") else {}
        # a binary target is built beside the tests (integration tests may start it): not a test
        if artifact.get("executable") and artifact.get("profile", {}).get("test"):
            target_of = artifact["target"]
            name = f"{target_of['kind'][0]}-{target_of['name']}"
            shutil.copy2(artifact["executable"], staging / name)
    if not any(staging.iterdir()):
        raise ToolsError(f"{' '.join(command)} listed no test executable")
    staging.rename(cached)


def _prune(root: Path, keep: Path) -> None:
    sets = sorted(
        (path for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")),
        key=lambda path: path.stat().st_mtime,
        reverse=True,
    )
    for old in sets[KEEP:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def run_tests(timeout: float = 600) -> TestRun:
    """Every test executable of this tree, one after another, as `cargo test` runs them."""
    env = {**child_env(), "CARGO_MANIFEST_DIR": str(CRATE)}
    results = []
    for executable in test_executables():
        proc = subprocess.run(
            [str(executable)],
            cwd=CRATE,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        results.append((executable.name, proc.returncode, proc.stdout + proc.stderr))
    return TestRun(tuple(results))


def main() -> int:
    try:
        print(len(test_executables()), "gateway test executables ready")
    except ToolsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
