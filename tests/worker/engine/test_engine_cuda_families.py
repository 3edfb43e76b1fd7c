"""The encoder families on CUDA (marked gpu: skipped where there is no CUDA device): bf16, graphs
captured lazily and replayed, against sentence-transformers; MPNet eager with its reason."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.common.similarity import min_cosine
from embedfleet.testing import families
from embedfleet.testing.families import FamilyDirs
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import item
from .test_engine_encoders import sequences

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family", ["distilbert", "modernbert", "bert-dense"])
def test_graph_replays_match_eager_and_the_reference(family_dirs: FamilyDirs, family: str) -> None:
    path = family_dirs.get(family)
    seqs = sequences(path)
    want = families.st_embeddings(path, seqs)
    engine = TorchEngine(EngineConfig(model=str(path), device="cuda", cuda_graphs="lazy"))
    assert engine.backend.graph_safe, engine.graphs_off_reason
    runs = [engine.run([item(seqs)])[0] for _ in range(3)]  # eager, capture, replay
    counters = engine.counters()
    assert (counters.captures, counters.replays, counters.rejects) == (1, 1, 0)
    for got in runs:
        assert min_cosine(got, want) >= 0.999
    assert min_cosine(runs[2], runs[0]) >= 0.999


def test_mpnet_runs_eager_on_cuda_and_says_why(family_dirs: FamilyDirs) -> None:
    path = family_dirs.get("mpnet")
    seqs = sequences(path)
    engine = TorchEngine(EngineConfig(model=str(path), device="cuda", cuda_graphs="lazy"))
    assert "attention bias" in engine.graphs_off_reason
    got = np.concatenate([engine.run([item(seqs)])[0] for _ in range(2)])
    assert min_cosine(got, np.concatenate([families.st_embeddings(path, seqs)] * 2)) >= 0.999
    with pytest.raises(Exception, match="attention bias"):
        TorchEngine(EngineConfig(model=str(path), device="cuda", cuda_graphs="eager"))
