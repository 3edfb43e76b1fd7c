#!/usr/bin/env python3
"""Packs static binaries into a one-layer image archive (`docker save` format), no daemon.

    image-archive.py --tag localhost/embedfleet/pause:3.10.2 --entrypoint /pause \
        --user 65535:65535 --file build/pause:/pause -o pause.tar

The harness's images hold one static binary each, so a builder buys nothing here: this writes
the archive directly, byte-for-byte reproducible (fixed owners and mtimes), which keeps the node
build's content-addressed cache honest. `ctr images import` reads the result.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path


def _layer(files: list[tuple[Path, str]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for source, target in sorted(files, key=lambda item: item[1]):
            data = source.read_bytes()
            info = tarfile.TarInfo(target.lstrip("/"))
            info.size = len(data)
            info.mode = 0o755
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def write_archive(
    out: Path, tag: str, entrypoint: list[str], user: str, files: list[tuple[Path, str]]
) -> None:
    layer = _layer(files)
    layer_digest = hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": entrypoint, "User": user, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [
            {"created": "1970-01-01T00:00:00Z", "created_by": "hack/node/image-archive.py"}
        ],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [f"{layer_digest}/layer.tar"]}]
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, config_name, config_bytes)
        _add(tar, f"{layer_digest}/layer.tar", layer)
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    tmp.replace(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", required=True, help="image reference, e.g. localhost/x/y:1")
    parser.add_argument("--entrypoint", required=True, action="append", help="repeat per argv item")
    parser.add_argument("--user", default="65534:65534", help="uid:gid the image runs as")
    parser.add_argument(
        "--file", required=True, action="append", help="SOURCE:TARGET, repeat per file"
    )
    parser.add_argument("-o", "--output", required=True, type=Path)
    args = parser.parse_args()
    files = []
    for spec in args.file:
        source, _, target = spec.rpartition(":")
        files.append((Path(source), target))
    write_archive(args.output, args.tag, args.entrypoint, args.user, files)


if __name__ == "__main__":
    main()
