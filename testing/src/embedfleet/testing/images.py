"""Container images built here, with no registry: a Debian base made by debootstrap, then the
component images built from docker/*.Dockerfile by buildah with no network, each saved as a
docker-archive under the cache. Every step is keyed by its inputs' content, so an unchanged tree
reuses what an earlier run built.

`built_manifest()` returns the manifest (image reference -> archive path) that a node imports;
`python -m embedfleet.testing.images` (what `make images` runs) prints it as JSON, and
`python -m embedfleet.testing.images lock` rewrites docker/locks/ from PyPI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from embedfleet.testing.gateway import gateway_binary
from embedfleet.testing.imagespec import (
    BASE_PACKAGES,
    BASE_REPOSITORY,
    BUILD_BACKEND,
    BUILD_LOCK,
    DEFAULT_IMAGES,
    DEPS_STAGE,
    FRONT_LIBRARY_FILE,
    LOCAL_REPOSITORY,
    SPECS,
    SUITE,
    ImageSpec,
    base_key,
    build_args,
    content_key,
    declared_dependencies,
    dependency_image,
    deps_args,
    disk_needed,
    front_library_ref,
    gateway_binary_ref,
    image_key,
    image_version,
    lock_pins,
    lock_roots,
    lock_text,
    stale_builds,
    wheel_prefixes,
)
from embedfleet.testing.nodeslots import locked
from embedfleet.testing.tools import REPO_ROOT
from embedfleet.testing.workers import front_library

KEEP_BUILDS = 2
STORAGE = Path("/var/lib/containers/storage")
"""buildah's storage as root (Debian's default graphroot)."""


class ImagesError(RuntimeError):
    """An image could not be built; the message says why (a missing tool, a failed step)."""


# -- building (I/O) --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltImage:
    name: str
    ref: str
    """The name the image carries in its archive (and in a node after import)."""
    local_ref: str
    """The same image in buildah's storage under its key (for `buildah run`)."""
    archive: Path
    key: str
    built: bool
    """False when an earlier build with the same key was reused."""
    seconds: float


def cache_dir() -> Path:
    cache = os.environ.get("EMBEDFLEET_CACHE") or str(Path.home() / ".cache" / "embedfleet")
    return Path(cache) / "images"


def require_tools() -> None:
    missing = [tool for tool in ("buildah", "debootstrap", "runc") if shutil.which(tool) is None]
    if missing:
        raise ImagesError(
            f"{', '.join(missing)} not found: `make image-tools` installs Debian's buildah, "
            "debootstrap and runc (apt-get install buildah debootstrap runc)"
        )


def _log(message: str) -> None:
    print(f"images: {message}", file=sys.stderr, flush=True)


def run_tool(argv: Sequence[str], *, cwd: Path | None = None) -> str:
    """Runs a builder command; its stdout, or ImagesError with the tail of what it said."""
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-4000:]
        raise ImagesError(f"{' '.join(argv[:3])} ... failed ({proc.returncode}):\n{tail}")
    return proc.stdout


def _exists(ref: str) -> bool:
    probe = ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


def ensure_base(root: Path, cache: Path) -> str:
    key = base_key(root)
    ref = f"{BASE_REPOSITORY}:{key}"
    if not _exists(ref):
        _log(f"base image {ref} (debootstrap {SUITE} when its rootfs is not cached: ~4 min)")
        script = root / "hack" / "build-base-image.sh"
        rootfs = cache / f"base-{key}.rootfs.tar"
        run_tool(["bash", str(script), SUITE, ",".join(BASE_PACKAGES), str(rootfs), ref])
    return ref


def ensure_wheels(root: Path, lock: str, pool: Path) -> None:
    """Wheels for every pin of a lock in pool (from pip's cache or PyPI), once per lock content."""
    text = (root / "docker" / "locks" / f"{lock}.txt").read_bytes()
    stamp = pool / f".{lock}-{content_key({'lock': text})}"
    if stamp.exists():
        return
    pool.mkdir(parents=True, exist_ok=True)
    _log(f"wheels for docker/locks/{lock}.txt into {pool}")
    requirements = str(root / "docker" / "locks" / f"{lock}.txt")
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    run_tool([*pip, "--wheel-dir", str(pool), "--requirement", requirements])
    stamp.touch()


def _check_space(root: Path, spec: ImageSpec, pool: Path, cache: Path) -> None:
    """Refuses a build that would fill the disk (shared by others) halfway through."""
    prefixes = wheel_prefixes(
        lock_pins((root / "docker" / "locks" / f"{spec.lock}.txt").read_text())
    )
    wheels = sum(p.stat().st_size for p in pool.iterdir() if p.name.lower().startswith(prefixes))
    needed = disk_needed(wheels)
    for where in (STORAGE, cache):
        free = shutil.disk_usage(where if where.exists() else where.parent).free
        if free < needed:
            raise ImagesError(
                f"building {spec.name} needs about {needed / 1e9:.1f} GB free in {where} "
                f"({wheels / 1e9:.1f} GB of wheels, unpacked in a container, committed, archived); "
                f"{free / 1e9:.1f} GB are"
            )


def _prune(cache: Path, name: str, keep: int) -> None:
    """Drops this image's builds beyond its `keep` newest: archives and their tags in buildah's
    storage."""
    archives = [(p.stat().st_mtime, p) for p in cache.iterdir()]
    for key in stale_builds(archives, name, keep):
        (cache / f"{name}-{key}.tar").unlink(missing_ok=True)
        rmi = ["buildah", "rmi", f"{LOCAL_REPOSITORY}/{name}:{key}"]
        subprocess.run(rmi, capture_output=True, check=False)


def ensure_gateway_binary(binary: Path) -> str:
    """The Rust gateway binary (built on this Debian host, as the base) committed as a local image
    holding only /out/embedfleet-gateway, which the gateway image's build copies from."""
    ref = gateway_binary_ref(binary.read_bytes())
    return _ensure_artifact_image(binary, ref, "/out/embedfleet-gateway", "0755")


def ensure_front_library(library: Path) -> str:
    """The worker's Rust front (embedfleet_front.abi3.so, built on this host) committed as a local
    image holding only /out/FRONT_LIBRARY_FILE, which the worker images' code layer copies from."""
    ref = front_library_ref(library.read_bytes())
    return _ensure_artifact_image(library, ref, f"/out/{FRONT_LIBRARY_FILE}", "0644")


def _ensure_artifact_image(artifact: Path, ref: str, target: str, mode: str) -> str:
    """One host-built file committed as a scratch image holding it at `target`, when ref (named by
    the file's content) is new; older such images beyond KEEP_BUILDS are removed."""
    if not _exists(ref):
        _log(f"{ref} from {artifact}")
        working = run_tool(["buildah", "from", "--quiet", "scratch"]).strip()
        try:
            run_tool(
                ["buildah", "copy", "--quiet", "--chmod", mode, working, str(artifact), target]
            )
            run_tool(["buildah", "commit", "--quiet", working, ref])
        finally:
            subprocess.run(["buildah", "rm", working], capture_output=True, check=False)
    _prune_tags(ref, KEEP_BUILDS)
    return ref


def _prune_tags(ref: str, keep: int) -> None:
    """Removes the images of ref's repository beyond its `keep` newest, ref kept. One that a kept
    image is built on stays (buildah refuses) until that image goes too."""
    repository = ref.rpartition(":")[0]
    listed = json.loads(run_tool(["buildah", "images", "--json"]) or "[]")
    tagged = [
        (image["created"], name)
        for image in listed
        for name in image.get("names") or ()
        if name.startswith(f"{repository}:") and name != ref
    ]
    for _, name in sorted(tagged, reverse=True)[keep - 1 :]:
        subprocess.run(["buildah", "rmi", name], capture_output=True, check=False)


def ensure_deps(root: Path, spec: ImageSpec, base_ref: str, cache: Path) -> str:
    """A layered image's dependency stage (the lock installed, none of our code), built when its
    key is new; older ones beyond KEEP_BUILDS are removed."""
    ref = dependency_image(root, spec, base_ref)
    if not _exists(ref):
        pool = cache / "wheels"
        ensure_wheels(root, spec.lock, pool)
        _check_space(root, spec, pool, cache)
        _build(root, spec, deps_args(spec, base_ref), cache, [ref], target=DEPS_STAGE)
    _prune_tags(ref, KEEP_BUILDS)
    return ref


def _build(
    root: Path,
    spec: ImageSpec,
    args: dict[str, str],
    cache: Path,
    tags: Sequence[str],
    target: str = "",
) -> None:
    """buildah bud of spec's Dockerfile (its `target` stage alone when given) with the wheelhouse
    mounted; the caller has made the wheels it installs."""
    _log(f"building {tags[-1]} ({spec.dockerfile}, {tags[0]})")
    # --force-rm (which buildah takes only with --no-cache; nothing is cached without --layers
    # anyway): a failed build's working container (GBs for the worker) is removed too.
    argv = ["buildah", "bud", "--pull=false", "--network=none", "--quiet", "--no-cache"]
    argv += ["--force-rm"]
    argv += ["--volume", f"{cache / 'wheels'}:/wheels:ro", "--file", spec.dockerfile]
    if target:
        argv += ["--target", target]
    for name, value in args.items():
        argv += ["--build-arg", f"{name}={value}"]
    for tag in tags:
        argv += ["--tag", tag]
    run_tool([*argv, "."], cwd=root)


def _build_image(
    root: Path, spec: ImageSpec, base_ref: str, cache: Path, refs: Artifacts, tags: Sequence[str]
) -> None:
    """Builds one image: a layered one on its dependency image (built first when missing), which
    holds the lock, so this build installs only our code; any other in one stage."""
    pool = cache / "wheels"
    ensure_wheels(root, BUILD_LOCK, pool)
    deps = ""
    if spec.layered:
        deps = ensure_deps(root, spec, base_ref, cache)
    else:
        ensure_wheels(root, spec.lock, pool)
        _check_space(root, spec, pool, cache)
    args = build_args(spec, base_ref, refs.gateway_binary, deps, refs.front_library)
    _build(root, spec, args, cache, tags)


def _image_id(ref: str) -> str:
    return run_tool(
        ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref]
    ).strip()


@dataclass(frozen=True)
class Artifacts:
    """The local images of the host-built Rust artifacts an image may carry ("": not made)."""

    gateway_binary: str = ""
    front_library: str = ""


def ensure_image(
    root: Path, spec: ImageSpec, base_ref: str, cache: Path, refs: Artifacts = Artifacts()
) -> BuiltImage:
    started = time.monotonic()
    version = image_version(root, spec)
    key = image_key(root, spec, base_ref, refs.gateway_binary, refs.front_library)
    ref = spec.ref(version)
    local_ref = f"{LOCAL_REPOSITORY}/{spec.name}:{key}"
    archive = cache / f"{spec.name}-{key}.tar"
    built = not archive.is_file()
    if built:
        # Before the build, not after: a worker build needs GBs, and the disk must hold the
        # new one beside the kept ones, not beside all the old ones too.
        _prune(cache, spec.name, KEEP_BUILDS - 1)
        if not _exists(local_ref):
            _build_image(root, spec, base_ref, cache, refs, [local_ref, ref])
        # An interrupted run may have built the image but not archived it: then only this step.
        partial = archive.with_suffix(".partial")
        image_id = _image_id(local_ref)
        # By ID, so that the archive names the image only by its published name.
        run_tool(["buildah", "push", "--quiet", image_id, f"docker-archive:{partial}:{ref}"])
        partial.rename(archive)
    elif not _exists(local_ref):
        # Storage was reset but the archive survived: load it instead of building again.
        run_tool(["buildah", "pull", "--quiet", f"docker-archive:{archive}"])
        run_tool(["buildah", "tag", ref, local_ref])
    return BuiltImage(spec.name, ref, local_ref, archive, key, built, time.monotonic() - started)


def ensure_images(
    names: Iterable[str] = DEFAULT_IMAGES, root: Path = REPO_ROOT
) -> list[BuiltImage]:
    """Builds (or reuses) the named images; see manifest() for what a node imports."""
    specs = [SPECS[name] for name in names]
    require_tools()
    cache = cache_dir()
    # One builder at a time per cache: a second waits, then finds the first one's results.
    with locked(cache):
        base = ensure_base(root, cache)
        built = {}
        # The images carrying the gateway binary last: its binary may still be compiling beside
        # this (`make prepare`), and hack/build-gateway.sh waits for that build.
        refs = Artifacts()
        for spec in sorted(specs, key=lambda spec: spec.gateway_binary):
            refs = _ensure_artifacts(spec, refs)
            built[spec.name] = ensure_image(root, spec, base, cache, refs)
        images = [built[spec.name] for spec in specs]
        write_manifest(cache / "manifest.json", images)
    return images


def _ensure_artifacts(spec: ImageSpec, refs: Artifacts) -> Artifacts:
    """refs with the Rust artifacts spec carries made (compiled first when no cached build of this
    tree's sources matches), each once per run."""
    if spec.gateway_binary and not refs.gateway_binary:
        refs = replace(refs, gateway_binary=ensure_gateway_binary(gateway_binary()))
    if spec.front_library and not refs.front_library:
        refs = replace(refs, front_library=ensure_front_library(front_library()))
    return refs


def built_manifest(names: Iterable[str] = DEFAULT_IMAGES) -> dict[str, str]:
    """Builds or reuses the images and returns what a node imports: {image ref: archive path}.
    For a test fixture: `for path in built_manifest().values(): node.import_image(path)`."""
    return manifest(ensure_images(names))


def manifest(images: Iterable[BuiltImage]) -> dict[str, str]:
    """Image reference -> docker-archive path: what `node.import_image(path)` loads."""
    return {image.ref: str(image.archive) for image in images}


def write_manifest(path: Path, images: Iterable[BuiltImage]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(manifest(images), indent=2, sort_keys=True) + "\n")
    partial.rename(path)


# -- locks (I/O) -----------------------------------------------------------------------------------

LOCK_HEADER = (
    "# Generated by `python -m embedfleet.testing.images lock` from {inputs}\n"
    "# (Python 3.11, Linux x86_64). Every image installs exactly these with --no-deps.\n"
)


def write_locks(root: Path = REPO_ROOT) -> list[Path]:
    """Resolves each image's requirements against PyPI (pip's cache) into docker/locks/."""
    locks = root / "docker" / "locks"
    written = []
    for spec in SPECS.values():
        resolved, alone = lock_roots(declared_dependencies(root, spec), spec)
        report = _dryrun_tool(root, resolved)
        report["install"] += _dryrun_tool(root, alone, "--no-deps")["install"] if alone else []
        extra = ", ".join(spec.extra_requirements) or "nothing else"
        of = f"the dependencies of {' and '.join(spec.sources)}, " if spec.sources else ""
        inputs = f"{of}{extra}"
        header = LOCK_HEADER.format(inputs=inputs)
        written.append(_write(locks / f"{spec.lock}.txt", lock_text(report, spec.exclude, header)))
    build = _dryrun_tool(root, [BUILD_BACKEND])
    header = LOCK_HEADER.format(inputs=BUILD_BACKEND)
    written.append(_write(locks / f"{BUILD_LOCK}.txt", lock_text(build, (), header)))
    return written


def _dryrun_tool(root: Path, requirements: Sequence[str], *options: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    command = [*argv, *options, "--report", "-", *requirements]
    report: dict[str, Any] = json.loads(run_tool(command, cwd=root))
    return report


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embedfleet.testing.images", description=__doc__
    )
    parser.add_argument("command", nargs="?", default="build", choices=("build", "lock"))
    parser.add_argument(
        "--images",
        default=",".join(DEFAULT_IMAGES),
        help=f"comma-separated, of {', '.join(SPECS)} (default: %(default)s)",
    )
    parser.add_argument(
        "--print",
        default="manifest",
        choices=("manifest", "paths"),
        help="what to print: the manifest as JSON, or the archives' paths one per line",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            for path in write_locks():
                _log(f"wrote {path.relative_to(REPO_ROOT)}")
            return 0
        images = ensure_images(name for name in args.images.split(",") if name)
    except (ImagesError, KeyError) as error:
        _log(f"error: {error}")
        return 1
    for image in images:
        state = f"built in {image.seconds:.0f} s" if image.built else "reused"
        size = image.archive.stat().st_size / 2**20
        _log(f"{image.ref}: {state}, {size:.0f} MiB archive")
    if args.print == "paths":
        print("\n".join(str(image.archive) for image in images))
    else:
        print(json.dumps(manifest(images), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
