"""`embedfleet calibrate` pointed at the Rust gateway: the same calibration file as pointed at the
Python one, both in front of one worker computing MiniLM with torch (the null engine's vectors
are zero past their third dimension, which would leave little to compare)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson
import pytest

from embedfleet.common.modeldir import default_model_path
from embedfleet.gateway import fleet as cli
from embedfleet.gateway.calibrate import BATCH
from embedfleet.gateway.quantization import Calibration, load_calibration, ranges_of
from embedfleet.testing.families import TEXTS

from .conftest import behind_worker
from .pair import TOLERANCE, Pair

#: past calibrate's batch of 64, so the set travels as two requests
CALIBRATION_SET = [f"{i}. {TEXTS[i % len(TEXTS)]}" for i in range(BATCH + 6)]
DIMENSIONS = (384, 128)


@pytest.fixture(scope="module")
def minilm_pair(rust_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    workdir = tmp_path_factory.mktemp("calibrate")
    with behind_worker(default_model_path(), workdir, engine="torch") as pair:
        yield pair


def _calibrate(url: str, workdir: Path) -> Calibration:
    workdir.mkdir()
    texts = workdir / "texts.txt"
    texts.write_text("\n".join(CALIBRATION_SET) + "\n\n")
    out = workdir / "embedfleet_quantization.json"
    dims = ",".join(map(str, DIMENSIONS))
    argv = ["--url", url, "--texts", str(texts), "--dimensions", dims, "--out", str(out)]
    cli.main(["calibrate", *argv])
    return load_calibration(out)


def _embed(pair: Pair, texts: list[str], dims: int) -> npt.NDArray[np.float32]:
    body = {"input": texts, "dimensions": dims}
    reply = pair.rust().request("POST", "/v1/embeddings", content=orjson.dumps(body))
    assert reply.status == 200, reply.body
    return np.asarray([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)


def test_calibrate_writes_the_same_ranges_through_either_gateway(
    minilm_pair: Pair, tmp_path: Path
) -> None:
    python = _calibrate(minilm_pair.python().url(), tmp_path / "python")
    rust = _calibrate(minilm_pair.rust().url(), tmp_path / "rust")
    served = minilm_pair.models()["data"][0]["id"]
    assert python.model == rust.model == served
    assert python.samples == rust.samples == len(CALIBRATION_SET)
    for dims in DIMENSIONS:
        got, want = rust.for_dimensions(dims), python.for_dimensions(dims)
        assert got is not None
        assert want is not None
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE)
        # ... and they are the ranges of what the Rust gateway's clients get.
        batches = [CALIBRATION_SET[:BATCH], CALIBRATION_SET[BATCH:]]
        rows = np.concatenate([_embed(minilm_pair, texts, dims) for texts in batches])
        assert rows.shape == (len(CALIBRATION_SET), dims)
        np.testing.assert_allclose(got, ranges_of(rows), rtol=0, atol=TOLERANCE)
