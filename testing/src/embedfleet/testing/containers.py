"""Runs an image built by embedfleet.testing.images the way kubelet would run it, with runc: the
image's user, environment and entrypoint, a read-only root filesystem, a fresh tmpfs at /tmp (the
pods' emptyDir) and its own network namespace holding only loopback.

    with container("localhost/embedfleet/gateway:KEY", ["--help"]) as c:
        result = c.run(timeout=60)

`command` and `args` mean what they mean in a pod's container spec.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedfleet.testing.images import run_tool

WRITABLE_DIR = "/tmp"
"""The only writable path in our pods (an emptyDir in the operator's and the chart's manifests)."""


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an image's OCI config that decide how its process starts."""

    user: str
    env: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    workdir: str

    @classmethod
    def from_oci(cls, config: Mapping[str, Any]) -> ImageConfig:
        return cls(
            user=str(config.get("User") or "0"),
            env=tuple(config.get("Env") or ()),
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            workdir=str(config.get("WorkingDir") or "/"),
        )

    def uid_gid(self) -> tuple[int, int]:
        """Numeric users only: a name would need the image's /etc/passwd, and kubelet's
        runAsNonRoot check refuses names anyway."""
        user, _, group = self.user.partition(":")
        return int(user), int(group or user)


def process_args(
    image: ImageConfig, command: Sequence[str] | None, args: Sequence[str]
) -> list[str]:
    """Kubernetes' rule: `command` replaces the entrypoint, `args` replace the image's CMD."""
    entrypoint = list(command) if command is not None else list(image.entrypoint)
    if args:
        return [*entrypoint, *args]
    return entrypoint if command is not None else [*entrypoint, *image.cmd]


def bundle_spec(
    template: Mapping[str, Any],
    image: ImageConfig,
    rootfs: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    tmpfs_size: str = "1g",
) -> dict[str, Any]:
    """`runc spec`'s template adapted to one image: read-only root, its user, a tmpfs at /tmp."""
    spec: dict[str, Any] = json.loads(json.dumps(template))
    uid, gid = image.uid_gid()
    overrides = [f"{name}={value}" for name, value in env.items()]
    kept = [e for e in image.env if e.split("=", 1)[0] not in env]
    spec["root"] = {"path": rootfs, "readonly": True}
    spec["process"].update(
        terminal=False,
        user={"uid": uid, "gid": gid},
        args=list(argv),
        env=[*kept, *overrides],
        cwd=image.workdir,
        noNewPrivileges=True,
    )
    spec["hostname"] = "embedfleet-test"
    spec["mounts"].append(
        {
            "destination": WRITABLE_DIR,
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", f"size={tmpfs_size}"],
        }
    )
    return spec


def image_config(ref: str) -> ImageConfig:
    out = run_tool(["buildah", "inspect", "--type", "image", ref])
    return ImageConfig.from_oci(json.loads(out)["OCIv1"]["config"])


@dataclass
class Container:
    bundle: Path
    name: str

    def run(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """Runs the process to its end; stdout and stderr captured."""
        argv = ["runc", "run", "--bundle", str(self.bundle), self.name]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def start(self) -> subprocess.Popen[str]:
        """Starts it in the foreground of `runc run`, which relays signals to the container's
        PID 1: send_signal(SIGTERM) is what kubelet's stop does."""
        argv = ["runc", "run", "--bundle", str(self.bundle), self.name]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextmanager
def container(
    ref: str,
    args: Sequence[str] = (),
    *,
    command: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[Container]:
    """A runc bundle for `ref` (root mounted by buildah), removed with everything it made."""
    image = image_config(ref)
    working = run_tool(["buildah", "from", "--pull=false", "--quiet", ref]).strip()
    name = f"embedfleet-{secrets.token_hex(4)}"
    try:
        rootfs = run_tool(["buildah", "mount", working]).strip()
        with tempfile.TemporaryDirectory(prefix="embedfleet-bundle-") as bundle:
            run_tool(["runc", "spec", "--bundle", bundle])
            config = Path(bundle) / "config.json"
            template = json.loads(config.read_text())
            argv = process_args(image, command, args)
            spec = bundle_spec(template, image, rootfs, argv, env or {})
            config.write_text(json.dumps(spec))
            try:
                yield Container(Path(bundle), name)
            finally:
                subprocess.run(
                    ["runc", "delete", "--force", name], capture_output=True, check=False
                )
    finally:
        subprocess.run(["buildah", "umount", working], capture_output=True, check=False)
        subprocess.run(["buildah", "rm", working], capture_output=True, check=False)
