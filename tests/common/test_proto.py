"""The committed gRPC stubs must be what the pinned grpcio-tools generates from the .proto."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "common/src/embedfleet/common/proto"
GENERATED = ["embedfleet_pb2.py", "embedfleet_pb2.pyi", "embedfleet_pb2_grpc.py"]


def test_generated_stubs_are_current(tmp_path: Path) -> None:
    dest = tmp_path / "embedfleet/common/proto"
    dest.mkdir(parents=True)
    shutil.copy(PROTO_DIR / "embedfleet.proto", dest)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{tmp_path}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(dest / "embedfleet.proto"),
        ],
        check=True,
    )
    for name in GENERATED:
        assert (dest / name).read_text() == (PROTO_DIR / name).read_text(), (
            f"{name} is stale: run `make proto` and commit the result"
        )
