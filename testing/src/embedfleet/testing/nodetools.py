"""What a real node runs, built on first use by hack/build-node.sh (see its header), plus the
Debian programs hack/install-node-deps.sh installs."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from embedfleet.testing.tools import REPO_ROOT, ToolsError, run_build_script

NODE_BUILD_SCRIPT = REPO_ROOT / "hack" / "build-node.sh"
DEPS_SCRIPT = REPO_ROOT / "hack" / "install-node-deps.sh"
# A directory laid out as hack/build-node.sh writes it; skips the build script.
NODE_DIR_ENV = "EMBEDFLEET_NODE_BIN_DIR"

BINARIES = ("kubelet", "kube-proxy", "containerd", "ctr", "containerd-shim-runc-v2")
CNI_PLUGINS = ("bridge", "host-local")
HOST_PROGRAMS = ("runc", "nft", "ip", "nsenter", "sysctl")


@dataclass(frozen=True)
class ImageArchive:
    ref: str
    archive: Path


@dataclass(frozen=True)
class NodeToolset:
    root: Path
    built: bool

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def cni_dir(self) -> Path:
        return self.root / "cni"

    def path(self, name: str) -> Path:
        if name not in BINARIES:
            raise KeyError(f"unknown node binary {name!r}; expected one of {', '.join(BINARIES)}")
        return self.bin_dir / name

    def image(self, name: str) -> ImageArchive:
        """`pause` or `testserver` (hack/node/testserver): a one-layer image archive."""
        entry = json.loads((self.root / "images.json").read_text())[name]
        return ImageArchive(ref=entry["ref"], archive=self.root / entry["archive"])


def _missing(root: Path) -> list[str]:
    wanted = [f"bin/{b}" for b in BINARIES] + [f"cni/{p}" for p in CNI_PLUGINS] + ["images.json"]
    return [name for name in wanted if not (root / name).is_file()]


def host_program(name: str) -> Path:
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if found is None:
        raise ToolsError(f"{name} not found; run {DEPS_SCRIPT}")
    return Path(found)


def ensure_node_tools(*, build: bool = True) -> NodeToolset:
    """The node's binaries and images, compiled first when no cached build matches (minutes)."""
    for program in HOST_PROGRAMS:
        host_program(program)
    if override := os.environ.get(NODE_DIR_ENV):
        root = Path(override)
        if missing := _missing(root):
            raise ToolsError(f"{NODE_DIR_ENV}={override} lacks {', '.join(missing)}")
        return NodeToolset(root=root, built=False)
    expected = Path(run_build_script("--key", capture_stderr=True, script=NODE_BUILD_SCRIPT))
    cached = (expected / ".complete").is_file()
    if not cached and not build:
        raise ToolsError(f"node binaries not built yet; run {NODE_BUILD_SCRIPT}")
    root = Path(run_build_script(capture_stderr=cached, script=NODE_BUILD_SCRIPT))
    if missing := _missing(root):
        raise ToolsError(f"{root} lacks {', '.join(missing)} after {NODE_BUILD_SCRIPT.name}")
    return NodeToolset(root=root, built=not cached)
