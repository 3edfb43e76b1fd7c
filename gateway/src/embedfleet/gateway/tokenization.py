"""Prompt templating and tokenization with HF `tokenizers`, kept off the event loop.

`encode_batch` releases the GIL and fans out over its own thread pool, so a request's texts go to it
in one call from a worker thread; only tiny requests run inline, where the thread hop would cost
more than the work (see docs/gateway.md for the measurement).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from tokenizers import Encoding, Tokenizer

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.errors import ApiError, invalid

Side = Literal["left", "right"]


@dataclass(frozen=True, slots=True)
class Batch:
    """Token ids per input, in input order; `type_ids` only for (query, document) pairs."""

    ids: list[list[int]]
    type_ids: list[list[int]] | None = None

    @property
    def lengths(self) -> list[int]:
        return [len(s) for s in self.ids]

    @property
    def total(self) -> int:
        return sum(len(s) for s in self.ids)


def too_long(index: int, length: int, limit: int, param: str) -> ApiError:
    return invalid(
        f"Input {index} has {length} tokens, more than this model's limit of {limit}. "
        'Shorten it, or pass "truncate": true to cut it.',
        param=param,
        code="context_length_exceeded",
    )


def prompt_for(model: ModelDir, input_type: str | None) -> str:
    """The sentence-transformers prompt for `input_type`, or the model's default prompt."""
    if input_type is None:
        name = model.default_prompt_name
        return model.prompts.get(name, "") if name else ""
    if input_type == "document" and "document" not in model.prompts:
        # Some models name their document prompt "passage" (E5-style).
        return model.prompts.get("passage", "")
    return model.prompts.get(input_type, "")


def cut(ids: Sequence[int], limit: int, side: Side) -> list[int]:
    """Token-id inputs have no special tokens added, so truncation is a plain slice."""
    return list(ids[-limit:]) if side == "left" else list(ids[:limit])


class Tokenization:
    def __init__(self, model: ModelDir, max_tokens: int, threads: int, inline_chars: int) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.inline_chars = inline_chars
        self._plain = model.tokenizer()
        # Separate instances because truncation is tokenizer state, and threads share them.
        self._cutting: dict[Side, Tokenizer] = {}
        for side in ("left", "right"):
            tok = model.tokenizer()
            tok.enable_truncation(max_tokens, strategy="longest_first", direction=side)
            self._cutting[side] = tok
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="tokenize")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(
        self, tok: Tokenizer, items: list[str] | list[tuple[str, str]], chars: int
    ) -> list[Encoding]:
        if chars < self.inline_chars:
            return tok.encode_batch(items)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, tok.encode_batch, items)

    def _tokenizer(self, truncate: bool, side: Side) -> Tokenizer:
        return self._cutting[side] if truncate else self._plain

    def _check(self, encodings: list[Encoding], truncate: bool, param: str) -> None:
        if truncate:
            return
        for i, enc in enumerate(encodings):
            if len(enc.ids) > self.max_tokens:
                raise too_long(i, len(enc.ids), self.max_tokens, param)

    async def texts(
        self, texts: Sequence[str], input_type: str | None, truncate: bool, side: Side
    ) -> Batch:
        prompt = prompt_for(self.model, input_type)
        items = [prompt + t for t in texts] if prompt else list(texts)
        chars = sum(len(t) for t in items)
        encodings = await self._run(self._tokenizer(truncate, side), items, chars)
        self._check(encodings, truncate, "input")
        return Batch(ids=[e.ids for e in encodings])

    async def pairs(self, pairs: Sequence[tuple[str, str]], truncate: bool, side: Side) -> Batch:
        chars = sum(len(a) + len(b) for a, b in pairs)
        encodings = await self._run(self._tokenizer(truncate, side), list(pairs), chars)
        self._check(encodings, truncate, "documents")
        return Batch(ids=[e.ids for e in encodings], type_ids=[e.type_ids for e in encodings])

    def token_ids(self, seqs: Sequence[Sequence[int]], truncate: bool, side: Side) -> Batch:
        vocab = self.model.vocab_size
        out: list[list[int]] = []
        for i, seq in enumerate(seqs):
            if not seq:
                raise invalid(f"Input {i} is an empty list of token ids.", param="input")
            if min(seq) < 0 or max(seq) >= vocab:
                raise invalid(
                    f"Input {i} holds a token id outside this model's vocabulary [0, {vocab}).",
                    param="input",
                )
            if len(seq) > self.max_tokens:
                if not truncate:
                    raise too_long(i, len(seq), self.max_tokens, "input")
                out.append(cut(seq, self.max_tokens, side))
            else:
                out.append(list(seq))
        return Batch(ids=out)
