"""Bad input raises InvalidInputError, and the engine keeps working afterwards."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.common.codec import Tokens
from embedfleet.worker.contract import InvalidInputError, Options, WorkItem
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import item


def bad_items(engine: TorchEngine) -> dict[str, WorkItem]:
    limit = engine.info.max_input_tokens
    vocab = engine.info.vocab_size
    return {
        "empty sequence": WorkItem(
            Tokens(np.array([101, 102], np.int32), np.array([2, 0], np.int32))
        ),
        "no sequences": WorkItem(Tokens(np.zeros(0, np.int32), np.zeros(0, np.int32))),
        "too long": item([[101] * (limit + 1)]),
        "past the positions": item([[101] * 600]),
        "id past vocab": item([[101, vocab, 102]]),
        "negative id": item([[101, -1, 102]]),
        "segment id": WorkItem(
            Tokens(
                np.array([101, 102], np.int32), np.array([2], np.int32), np.array([0, 7], np.uint8)
            )
        ),
        "dimensions": item([[101, 102]], Options(dimensions=385)),
    }


@pytest.mark.parametrize(
    "case",
    [
        "empty sequence",
        "no sequences",
        "too long",
        "past the positions",
        "id past vocab",
        "negative id",
        "segment id",
        "dimensions",
    ],
)
def test_bad_input_is_refused_and_engine_recovers(minilm_fp32: TorchEngine, case: str) -> None:
    good = item([[101, 7592, 2088, 102]])
    [before] = minilm_fp32.run([good])
    bad = bad_items(minilm_fp32)[case]
    with pytest.raises(InvalidInputError):
        minilm_fp32.validate(bad)
    # step() guards too (an id past the vocabulary would be a device assert on CUDA).
    with pytest.raises(InvalidInputError):
        minilm_fp32.step([good, bad])
    [after] = minilm_fp32.run([good])
    np.testing.assert_array_equal(before, after)


def test_limit_defaults_to_sentence_transformers_max_seq_length() -> None:
    from embedfleet.worker.engine.config import EngineConfig

    engine = TorchEngine(EngineConfig(device="cpu", dtype="float32"))
    assert engine.info.max_input_tokens == 256
    engine.validate(item([[101] * 256]))
    with pytest.raises(InvalidInputError):
        engine.validate(item([[101] * 257]))


def test_limit_past_the_positions_is_a_config_error() -> None:
    from embedfleet.common.modeldir import ModelDirError
    from embedfleet.worker.engine.config import EngineConfig

    with pytest.raises(ModelDirError):
        TorchEngine(EngineConfig(device="cpu", dtype="float32", max_input_tokens=513))
