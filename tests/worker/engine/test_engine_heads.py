"""The families with their own heads, each from a random-weight checkpoint built on a published
config (testing.families), against `transformers` on padded batches: XLM-R cross-encoders
(bge-reranker), Qwen3-Reranker's yes/no scoring, SPLADE, sequence classifiers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedfleet.common import judge_prompt
from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import load_model_dir
from embedfleet.common.similarity import min_cosine
from embedfleet.testing import families
from embedfleet.testing.families import FamilyDirs
from embedfleet.worker.contract import Options, WorkItem
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import RUNTIMES, cached_engine
from .test_engine_graph_path import assert_graph_path_matches

QUERIES = families.TEXTS[:5]
DOCUMENTS = families.TEXTS[5:]
SCORE_TOLERANCE = 1e-3


def tokens(seqs: list[list[int]], types: list[list[int]] | None = None) -> Tokens:
    ids = np.concatenate([np.asarray(s, np.int32) for s in seqs])
    lengths = np.array([len(s) for s in seqs], np.int32)
    type_ids = None if types is None else np.concatenate([np.asarray(t, np.uint8) for t in types])
    return Tokens(ids, lengths, type_ids)


def engine(path: Path, max_tokens: int = 0, runtime: str = "eager") -> TorchEngine:
    return cached_engine(
        EngineConfig(
            model=str(path),
            device="cpu",
            dtype="float32",
            max_input_tokens=max_tokens,
            cpu_runtime=runtime,
        )
    )


def sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1 / (1 + np.exp(-x)))


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("published", ["bge-reranker-base", "bge-reranker-v2-m3"])
def test_xlmr_cross_encoder_matches_transformers(
    family_dirs: FamilyDirs, published: str, runtime: str
) -> None:
    path = family_dirs.get(published)
    model = load_model_dir(path)
    assert (model.task, model.head, model.model_type) == ("score", "classifier", "xlm-roberta")
    tok = model.tokenizer()
    pairs = [tok.encode(q, d) for q in QUERIES for d in DOCUMENTS]
    seqs, types = [p.ids for p in pairs], [p.type_ids for p in pairs]
    assert seqs[0][0] == 0  # <s> a </s></s> b </s>
    assert seqs[0].count(2) == 3
    eng = engine(path, runtime=runtime)
    assert eng.shape.position_offset == 2  # padding_idx + 1
    [raw] = eng.run([WorkItem(tokens(seqs, types))])
    [probs] = eng.run([WorkItem(tokens(seqs, types), Options(activate=True))])
    ref = families.classifier_logits(path, seqs, types)[:, 0]
    assert raw.shape == (len(pairs),)
    assert ref.std() > 10 * SCORE_TOLERANCE  # the scores differ: the comparison means something
    np.testing.assert_allclose(raw, ref, atol=SCORE_TOLERANCE)
    np.testing.assert_allclose(probs, sigmoid(ref), atol=SCORE_TOLERANCE)


def judged(path: Path, instruction: str | None) -> list[list[int]]:
    """The pairs as the gateway renders them: the judging frame's prefix, the user turn and the
    suffix, each tokenized without special tokens."""
    tok = load_model_dir(path).tokenizer()

    def ids(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False).ids)

    asked = instruction or judge_prompt.DEFAULT_INSTRUCTION
    return [
        ids(judge_prompt.PREFIX) + ids(judge_prompt.body(asked, q, d)) + ids(judge_prompt.SUFFIX)
        for q, d in zip(QUERIES, DOCUMENTS, strict=True)
    ]


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("published", ["Qwen3-Reranker-0.6B", "Qwen3-Reranker-8B"])
@pytest.mark.parametrize("instruction", [None, "Given a claim, find documents that refute it"])
def test_qwen3_reranker_matches_the_model_card(
    family_dirs: FamilyDirs, published: str, instruction: str | None, runtime: str
) -> None:
    path = family_dirs.get(published)
    model = load_model_dir(path)
    assert (model.task, model.head) == ("score", "yes_no")
    tied = published.endswith("0.6B")
    assert model.config["tie_word_embeddings"] is tied
    seqs = judged(path, instruction)
    eng = engine(path, 1024, runtime)
    [probs] = eng.run([WorkItem(tokens(seqs), Options(activate=True))])
    pairs = list(zip(QUERIES, DOCUMENTS, strict=True))
    ref = families.qwen3_reranker_scores(path, pairs, instruction)
    assert ref.std() > 10 * SCORE_TOLERANCE
    np.testing.assert_allclose(probs, ref, atol=SCORE_TOLERANCE)
    # Raw scores are the logit difference: sigmoid of it is P(yes).
    [raw] = eng.run([WorkItem(tokens(seqs))])
    np.testing.assert_allclose(sigmoid(raw), ref, atol=SCORE_TOLERANCE)


def test_qwen3_reranker_instruction_changes_scores(family_dirs: FamilyDirs) -> None:
    path = family_dirs.get("Qwen3-Reranker-0.6B")
    plain, custom = judged(path, None), judged(path, "Find passages about weather")
    assert plain != custom
    eng = engine(path, 1024)
    [a] = eng.run([WorkItem(tokens(plain))])
    [b] = eng.run([WorkItem(tokens(custom))])
    assert np.abs(a - b).max() > 10 * SCORE_TOLERANCE


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_splade_matches_transformers_with_mixed_lengths(
    family_dirs: FamilyDirs, runtime: str
) -> None:
    path = family_dirs.get("splade")
    model = load_model_dir(path)
    assert (model.task, model.head) == ("sparse", "splade")
    tok = model.tokenizer()
    # Lengths from 3 tokens to ~20 in one ragged batch: padding must not leak into any row.
    seqs = [tok.encode(t).ids for t in (*families.TEXTS, "hi", "yes no")]
    eng = engine(path, runtime=runtime)
    assert eng.info.dimensions == model.vocab_size
    [got] = eng.run([WorkItem(tokens(seqs))])
    ref = families.splade_vectors(path, seqs)
    assert got.shape == ref.shape == (len(seqs), model.vocab_size)
    assert (got >= 0).all()
    assert min_cosine(got, ref) >= 0.999
    np.testing.assert_allclose(got, ref, atol=SCORE_TOLERANCE)
    # One sequence alone gives its row of the batch: rows are independent.
    [alone] = eng.run([WorkItem(tokens(seqs[-2:-1]))])
    np.testing.assert_allclose(alone[0], got[-2], atol=1e-5)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(("published", "activation"), [("finbert", "softmax"),
                                                       ("go_emotions", "sigmoid")])  # fmt: skip
def test_classifiers_match_transformers(
    family_dirs: FamilyDirs, published: str, activation: str, runtime: str
) -> None:
    path = family_dirs.get(published)
    model = load_model_dir(path)
    assert (model.task, model.head, model.activation) == ("classify", "classifier", activation)
    assert model.labels == tuple(model.config["id2label"][str(i)] for i in range(len(model.labels)))
    tok = model.tokenizer()
    seqs = [tok.encode(t).ids for t in families.TEXTS]
    eng = engine(path, runtime=runtime)
    assert eng.info.dimensions == len(model.labels)
    [raw] = eng.run([WorkItem(tokens(seqs))])
    [scores] = eng.run([WorkItem(tokens(seqs), Options(activate=True))])
    ref = families.classifier_logits(path, seqs)
    assert raw.shape == ref.shape == (len(seqs), len(model.labels))
    assert ref.std(axis=0).mean() > 10 * SCORE_TOLERANCE
    np.testing.assert_allclose(raw, ref, atol=SCORE_TOLERANCE)
    if activation == "softmax":
        want = np.exp(ref) / np.exp(ref).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=1e-5)
    else:
        want = sigmoid(ref)
    np.testing.assert_allclose(scores, want, atol=SCORE_TOLERANCE)


@pytest.mark.parametrize("published", ["bge-reranker-base", "Qwen3-Reranker-8B", "splade",
                                       "go_emotions"])  # fmt: skip
def test_heads_on_the_graph_path_match_eager(family_dirs: FamilyDirs, published: str) -> None:
    """Bucket padding adds a spare sequence slot and tokens; every head must leave real rows
    alone and read its slice of the static outputs (the CUDA recording alone is mocked)."""
    eager = engine(family_dirs.get(published), 512)
    assert_graph_path_matches(eager, texts=7, split=3, first=Options(activate=True))
