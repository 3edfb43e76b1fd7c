from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from embedfleet.common import judge_prompt
from embedfleet.common.modeldir import ModelDir, load_model_dir
from embedfleet.gateway.errors import ApiError
from embedfleet.gateway.tokenization import Tokenization, cut, prompt_for
from embedfleet.testing.families import FamilyDirs


@pytest.fixture
def tokenization(minilm: ModelDir) -> Iterator[Tokenization]:
    t = Tokenization(minilm, max_tokens=16, threads=1, inline_chars=10)
    yield t
    t.close()


def test_prompts_by_input_type(minilm: ModelDir) -> None:
    model = dataclasses.replace(
        minilm, prompts={"query": "query: ", "passage": "passage: "}, default_prompt_name="query"
    )
    assert prompt_for(model, "query") == "query: "
    assert prompt_for(model, "document") == "passage: "  # E5-style name
    assert prompt_for(model, None) == "query: "
    assert prompt_for(minilm, "query") == ""  # MiniLM has no prompts


def test_cut_token_ids() -> None:
    assert cut([1, 2, 3, 4], 2, "right") == [1, 2]
    assert cut([1, 2, 3, 4], 2, "left") == [3, 4]


async def test_truncation_keeps_special_tokens(tokenization: Tokenization) -> None:
    text = " ".join(["word"] * 40)
    right = await tokenization.texts([text], None, truncate=True, side="right")
    left = await tokenization.texts([text + " end"], None, truncate=True, side="left")
    plain = tokenization.model.tokenizer().encode(text + " end").ids
    assert len(right.ids[0]) == 16
    assert right.ids[0][0] == plain[0]
    assert right.ids[0][-1] == plain[-1]  # [CLS] ... [SEP]
    assert left.ids[0] == [plain[0], *plain[-15:]]


async def test_too_long_without_truncation_is_a_clear_400(tokenization: Tokenization) -> None:
    with pytest.raises(ApiError) as info:
        await tokenization.texts(["short", "word " * 40], None, truncate=False, side="right")
    assert info.value.status == 400
    assert info.value.code == "context_length_exceeded"
    assert "Input 1 has 42 tokens" in info.value.message


async def test_prompt_is_applied_before_tokenizing(minilm: ModelDir) -> None:
    model = dataclasses.replace(minilm, prompts={"query": "query: "})
    t = Tokenization(model, max_tokens=64, threads=1, inline_chars=0)  # thread path
    try:
        got = await t.texts(["hello"], "query", truncate=False, side="right")
        assert got.ids[0] == minilm.tokenizer().encode("query: hello").ids
    finally:
        t.close()


async def test_pairs_carry_type_ids(tokenization: Tokenization) -> None:
    batch = await tokenization.pairs([("a question", "an answer")], truncate=False, side="right")
    assert batch.type_ids is not None
    assert set(batch.type_ids[0]) == {0, 1}
    assert len(batch.type_ids[0]) == len(batch.ids[0])


def test_token_id_checks(tokenization: Tokenization) -> None:
    assert tokenization.token_ids([[1] * 20], truncate=True, side="left").ids == [[1] * 16]
    with pytest.raises(ApiError, match="outside this model's vocabulary"):
        tokenization.token_ids([[5, -1]], truncate=False, side="right")
    with pytest.raises(ApiError, match="limit of 16"):
        tokenization.token_ids([[1] * 17], truncate=False, side="right")


@pytest.fixture(scope="module")
def judging(family_dirs: FamilyDirs) -> Iterator[Tokenization]:
    model = load_model_dir(family_dirs.get("Qwen3-Reranker-0.6B"))
    t = Tokenization(model, max_tokens=96, threads=1, inline_chars=10)
    yield t
    t.close()


async def test_judged_pairs_sit_in_the_official_frame(judging: Tokenization) -> None:
    tok = judging.model.tokenizer()
    prefix = tok.encode(judge_prompt.PREFIX, add_special_tokens=False).ids
    suffix = tok.encode(judge_prompt.SUFFIX, add_special_tokens=False).ids
    # The frame's special tokens are single ids, not spelled out.
    assert prefix[0] == tok.token_to_id("<|im_start|>")
    assert tok.token_to_id("<think>") in suffix
    batch = await judging.judged_pairs([("a query", "a document")], None, False, "right")
    (ids,) = batch.ids
    body = judge_prompt.body(judge_prompt.DEFAULT_INSTRUCTION, "a query", "a document")
    assert ids == prefix + tok.encode(body, add_special_tokens=False).ids + suffix
    assert batch.type_ids is None
    custom = await judging.judged_pairs([("a query", "a document")], "Find x", False, "right")
    assert tok.decode(custom.ids[0]).count("<Instruct>: Find x\n<Query>: a query") == 1


async def test_judged_pairs_cut_only_the_pair(judging: Tokenization) -> None:
    long = "the river bank " * 200
    with pytest.raises(ApiError, match="limit of 96") as refused:
        await judging.judged_pairs([("q", "short"), ("q", long)], None, False, "right")
    assert refused.value.param == "documents"
    batch = await judging.judged_pairs([("q", long)], None, True, "right")
    (ids,) = batch.ids
    tok = judging.model.tokenizer()
    suffix = tok.encode(judge_prompt.SUFFIX, add_special_tokens=False).ids
    assert len(ids) == 96
    assert ids[-len(suffix) :] == suffix  # the frame survives; the document's end was cut
