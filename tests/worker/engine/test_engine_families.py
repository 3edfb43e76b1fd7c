"""Random-weight Qwen3 (causal + last token, bidirectional + mean) and a BERT cross-encoder, each
saved by `transformers` and loaded by our loader, against `transformers` itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from embedfleet.common.similarity import min_cosine
from embedfleet.worker.contract import Options
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import RUNTIMES, engine_for, item, random_sequences

LENGTHS = (1, 2, 7, 16, 33, 64, 100, 255)


def qwen3_reference(path: Path, seqs: list[list[int]], bidirectional: bool) -> np.ndarray:
    from transformers import Qwen3Model

    model = Qwen3Model.from_pretrained(str(path), attn_implementation="eager").eval()
    out = []
    with torch.inference_mode():
        for s in seqs:
            ids = torch.tensor([s])
            if bidirectional:
                # A full (all-visible) 4D mask replaces the causal one the model would build.
                mask = {"full_attention": torch.zeros((1, 1, len(s), len(s)))}
                hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state[0]
                out.append(F.normalize(hidden.mean(0), dim=-1))
            else:
                hidden = model(input_ids=ids).last_hidden_state[0]
                out.append(F.normalize(hidden[-1], dim=-1))
    return torch.stack(out).numpy()


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_qwen3_causal_last_token(
    qwen3_causal_dir: Path, dtype: str, monkeypatch: pytest.MonkeyPatch, runtime: str
) -> None:
    engine = engine_for(qwen3_causal_dir, dtype, monkeypatch, runtime)
    assert engine.shape.causal
    assert engine.info.default_pooling == "last_token"
    seqs = random_sequences(engine.info.vocab_size, LENGTHS)
    [got] = engine.run([item(seqs)])
    ref = qwen3_reference(qwen3_causal_dir, seqs, bidirectional=False)
    assert min_cosine(got, ref) >= 0.999
    if dtype == "float32":
        np.testing.assert_allclose(got, ref, atol=1e-3)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_qwen3_bidirectional_mean(
    qwen3_bidir_dir: Path, dtype: str, monkeypatch: pytest.MonkeyPatch, runtime: str
) -> None:
    engine = engine_for(qwen3_bidir_dir, dtype, monkeypatch, runtime)
    assert not engine.shape.causal
    assert engine.info.default_pooling == "mean"
    seqs = random_sequences(engine.info.vocab_size, LENGTHS, seed=1)
    [got] = engine.run([item(seqs)])
    ref = qwen3_reference(qwen3_bidir_dir, seqs, bidirectional=True)
    assert min_cosine(got, ref) >= 0.999
    if dtype == "float32":
        np.testing.assert_allclose(got, ref, atol=1e-3)
    # The flag matters: the same weights run causally give something else.
    causal = TorchEngine(
        EngineConfig(model=str(qwen3_bidir_dir), device="cpu", dtype="float32", bidirectional=False)
    )
    [other] = causal.run([item(seqs[2:])])
    assert min_cosine(other, got[2:]) < 0.999


def cross_encoder_reference(path: Path, pairs: list[tuple[list[int], list[int]]]) -> np.ndarray:
    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(str(path)).eval()
    out = []
    with torch.inference_mode():
        for ids, types in pairs:
            logits = model(
                input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])
            ).logits
            out.append(float(logits[0, 0]))
    return np.array(out, np.float32)


def pairs_for(vocab: int) -> list[tuple[list[int], list[int]]]:
    out = []
    for n, (a, b) in enumerate([(3, 5), (10, 40), (1, 1), (30, 90)]):
        q, d = random_sequences(vocab, (a, b), seed=n)
        ids = [101, *q, 102, *d, 102]
        types = [0] * (a + 2) + [1] * (b + 1)
        out.append((ids, types))
    return out


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_cross_encoder_scores(
    cross_encoder_dir: Path, dtype: str, monkeypatch: pytest.MonkeyPatch, runtime: str
) -> None:
    engine = engine_for(cross_encoder_dir, dtype, monkeypatch, runtime)
    assert engine.info.task == "score"
    assert engine.info.dimensions == 1
    pairs = pairs_for(engine.info.vocab_size)
    ids = np.concatenate([np.asarray(p[0], np.int32) for p in pairs])
    types = np.concatenate([np.asarray(p[1], np.uint8) for p in pairs])
    lengths = np.array([len(p[0]) for p in pairs], np.int32)
    from embedfleet.common.codec import Tokens
    from embedfleet.worker.contract import WorkItem

    tokens = Tokens(ids, lengths, types)
    [scores] = engine.run([WorkItem(tokens)])
    ref = cross_encoder_reference(cross_encoder_dir, pairs)
    assert scores.shape == (len(pairs),)
    np.testing.assert_allclose(scores, ref, atol=1e-3)
    [probs] = engine.run([WorkItem(tokens, Options(activate=True))])
    np.testing.assert_allclose(probs, 1 / (1 + np.exp(-ref)), atol=1e-3)
    # Segment ids reach the model: all-zero types give other scores.
    [flat] = engine.run([WorkItem(Tokens(ids, lengths))])
    assert np.abs(flat - scores).max() > 1e-4
