"""The built images: names, user, entrypoints, and that they start the way kubelet starts them
(runc, uid 65532, read-only root filesystem, only /tmp writable, no network)."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from embedfleet.testing.containers import container, image_config
from embedfleet.testing.images import BuiltImage, ensure_images, manifest
from embedfleet.testing.imagespec import UID

ENTRYPOINTS = {
    "operator": "embedfleet-operator",
    "gateway": "embedfleet-gateway",
    "worker-cpu": "embedfleet-worker",
}
#: the images of Python components (the gateway's holds a native binary alone)
PYTHON = sorted(set(ENTRYPOINTS) - {"gateway"})
MODEL = "/opt/embedfleet/models/all-MiniLM-L6-v2"


def test_the_manifest_names_one_archive_per_image(built_images: Mapping[str, BuiltImage]) -> None:
    refs = manifest(built_images.values())
    assert set(refs) == {
        "ghcr.io/embedfleet/operator:0.1.0",
        "ghcr.io/embedfleet/gateway:0.1.0",
        "ghcr.io/embedfleet/worker:0.1.0-cpu",
    }
    for ref, path in refs.items():
        # A docker-archive whose one image carries the published name: what `ctr images import`
        # and `kind load image-archive` register.
        with tarfile.open(path) as archive:
            member = archive.extractfile("manifest.json")
            assert member is not None
            (entry,) = json.load(member)
        assert entry["RepoTags"] == [ref]


def test_the_worker_is_its_dependency_layer_plus_a_small_code_layer(
    built_images: Mapping[str, BuiltImage],
) -> None:
    """A worker source change rebuilds only the code layer (kilobytes); torch and the nvidia-*
    wheels stay in the layer below, built once per lock."""
    with tarfile.open(built_images["worker-cpu"].archive) as archive:
        member = archive.extractfile("manifest.json")
        assert member is not None
        (entry,) = json.load(member)
        sizes = [archive.getmember(layer).size for layer in entry["Layers"]]
    *_, dependencies, code = sizes
    assert dependencies > 2 * 10**9, sizes
    assert code < 10 * 10**6, sizes


def test_a_second_run_reuses_every_image(built_images: Mapping[str, BuiltImage]) -> None:
    started = time.monotonic()
    first = {name: built_images[name].key for name in built_images}
    again = {image.name: image for image in ensure_images()}
    assert not any(image.built for image in again.values())
    assert {name: image.key for name, image in again.items()} == first
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("name", sorted(ENTRYPOINTS))
def test_user_and_entrypoint(built_images: Mapping[str, BuiltImage], name: str) -> None:
    config = image_config(built_images[name].local_ref)
    assert config.uid_gid() == (UID, UID)
    assert config.entrypoint == (ENTRYPOINTS[name],)


@pytest.mark.parametrize("name", sorted(ENTRYPOINTS))
def test_starts_read_only_as_non_root(built_images: Mapping[str, BuiltImage], name: str) -> None:
    with container(built_images[name].local_ref, ["--help"]) as c:
        result = c.run(timeout=120)
    assert result.returncode == 0, result.stderr
    assert ENTRYPOINTS[name] in result.stdout


def test_the_gateway_image_holds_the_binary_its_libraries_and_the_model_alone(
    built_images: Mapping[str, BuiltImage],
) -> None:
    """No Python, no shell, no venv: the binary, what `ldd` names, CA certificates, /tmp and the
    bundled model's files."""
    with tarfile.open(built_images["gateway"].archive) as archive:
        paths = set()
        for layer in (m for m in archive.getmembers() if m.name.endswith(".tar")):
            data = archive.extractfile(layer)
            assert data is not None
            with tarfile.open(fileobj=data) as files:
                paths |= {f.name.removeprefix("./") for f in files.getmembers()}
    assert "usr/local/bin/embedfleet-gateway" in paths
    assert f"{MODEL[1:]}/config.json" in paths
    assert f"{MODEL[1:]}/tokenizer.json" in paths
    assert not [p for p in paths if "python" in p or p.startswith(("opt/venv", "bin/"))]
    assert {p.split("/")[0] for p in paths} <= {"usr", "lib", "lib64", "etc", "tmp", "opt"}


@pytest.mark.parametrize("name", PYTHON)
def test_only_tmp_is_writable(built_images: Mapping[str, BuiltImage], name: str) -> None:
    script = (
        "import errno, os, tempfile\n"
        "print(os.getuid(), os.getgid())\n"
        "tempfile.NamedTemporaryFile(dir=os.environ['HOME']).close()\n"
        "tempfile.NamedTemporaryFile().close()\n"
        "for path in ('/opt/venv/x', '/x'):\n"
        "    try:\n"
        "        open(path, 'w')\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno])\n"
    )
    with container(built_images[name].local_ref, ["-c", script], command=["python3"]) as c:
        result = c.run(timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(UID), str(UID), "EROFS", "EROFS"]


@dataclass(frozen=True)
class Server:
    image: str
    command: list[str] | None
    """None: the image's entrypoint (as a pod's container without `command`)."""
    args: list[str]
    ready: str
    """The log line that says it is up."""


# The worker's "serving" comes after warm-up and the self-check against the committed reference
# vectors, so it also proves the engine runs. The gateway runs as the operator runs it: `command`
# named, the model the image bakes in.
SERVERS = {
    "gateway": Server(
        "gateway",
        ["embedfleet-gateway"],
        ["--workers", "127.0.0.1:50051", "--host", "0.0.0.0", "--port", "8080", "--model", MODEL],
        "embedfleet-gateway listening on http://0.0.0.0:8080",
    ),
    "worker-cpu": Server("worker-cpu", None, [], '"msg": "serving"'),
    # The Rust front's extension from the image's own site-packages: no --front-library.
    "worker-cpu-rust": Server("worker-cpu", None, ["--front", "rust"], '"front": "rust"'),
}


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_serves_then_exits_on_sigterm_as_pid_1(
    built_images: Mapping[str, BuiltImage], name: str
) -> None:
    """kubelet stops a container with SIGTERM to its PID 1, which the kernel does not kill by
    default: the process must handle it itself, well inside the grace period. The gateway also
    proves here that the host-built binary runs on the libraries the image holds, as uid 65532 on
    a read-only root, and loads the model baked into it."""
    server = SERVERS[name]
    with container(built_images[server.image].local_ref, server.args, command=server.command) as c:
        process = c.start()
        try:
            _wait_for_line(process, server.ready, timeout=240)
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert code == 0
    assert time.monotonic() - started < 15


def _wait_for_line(process: subprocess.Popen[str], needle: str, timeout: float) -> None:
    """Reads the process' stderr until a line contains needle (the server's start message)."""
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            break
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"no line with {needle!r} within {timeout} s:\n{''.join(seen[-20:])}")


def test_the_cpu_worker_embeds_with_the_bundled_model(
    built_images: Mapping[str, BuiltImage],
) -> None:
    """The engine in the CPU image (torch without its CUDA wheels) on the baked-in MiniLM, as uid
    65532 on a read-only root: one sequence against the committed sentence-transformers vector."""
    from embedfleet.worker.selfcheck import REFERENCE_FILE, TEXTS

    (reference,) = json.loads(REFERENCE_FILE.read_text()).values()
    assert reference["texts"][0] == TEXTS[0]
    ids, want = reference["token_ids"][0], reference["embeddings"][0]
    script = (
        "import json, torch\n"
        "from embedfleet.worker.engine.config import EngineConfig\n"
        "from embedfleet.worker.engine.torch_engine import TorchEngine\n"
        "from embedfleet.worker.selfcheck import item_of\n"
        f"engine = TorchEngine(EngineConfig(model={MODEL!r}, device='cpu'))\n"
        f"(vector,) = engine.run([item_of({ids!r})])[0]\n"
        "print(json.dumps({'cuda': torch.cuda.is_available(), 'vector': vector.tolist()}))\n"
    )
    with container(built_images["worker-cpu"].local_ref, ["-c", script], command=["python3"]) as c:
        result = c.run(timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["cuda"] is False
    got = out["vector"]
    cosine = sum(a * b for a, b in zip(got, want, strict=True)) / (
        math.sqrt(sum(a * a for a in got)) * math.sqrt(sum(b * b for b in want))
    )
    assert cosine > 0.999
