"""Prompt templating and tokenization with HF `tokenizers`, kept off the event loop.

`encode_batch` releases the GIL and fans out over its own thread pool, so a request's texts go to it
in one call from a worker thread; only tiny requests run inline, where the thread hop would cost
more than the work (see docs/gateway.md for the measurement). Requests of many characters run on a
lane (thread) of their own, so however long they take they never hold up the others. Before
anything is tokenized, a long text is cut to the window that decides its tokens (window.py): with
`truncate` it is cut there, without it is refused there, so no text is ever tokenized whole merely
to be cut or rejected. Prompt-template rerankers (Qwen3-Reranker) get each pair rendered in their
judging frame (common.judge_prompt): the fixed prefix and suffix tokens around the instruction,
query and document, tokenized apart as the model card does, so truncation only ever cuts the pair.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, TypeVar

from tokenizers import Encoding, Tokenizer

from embedfleet.common import judge_prompt
from embedfleet.common.modeldir import ModelDir, ModelDirError
from embedfleet.gateway.errors import ApiError, invalid
from embedfleet.gateway.long_inputs import special_ends
from embedfleet.gateway.window import Window, first_window_chars, window

Side = Literal["left", "right"]
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Batch:
    """Token ids per input, in input order; `type_ids` only for (query, document) pairs."""

    ids: list[list[int]]
    type_ids: list[list[int]] | None = None
    #: special tokens leading and trailing each input (texts tokenized whole, for splitting)
    ends: list[tuple[int, int]] | None = None

    @property
    def lengths(self) -> list[int]:
        return [len(s) for s in self.ids]

    @property
    def total(self) -> int:
        return sum(len(s) for s in self.ids)


def too_long(index: int, length: int, limit: int, param: str, at_least: bool = False) -> ApiError:
    count = f"at least {length}" if at_least else str(length)
    split = ', or "split_long_inputs": true to embed it in windows' if param == "input" else ""
    return invalid(
        f"Input {index} has {count} tokens, more than this model's limit of {limit}. "
        f'Shorten it, pass "truncate": true to cut it{split}.',
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
    def __init__(
        self,
        model: ModelDir,
        max_tokens: int,
        threads: int,
        inline_chars: int,
        large_chars: int = 65536,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.inline_chars = inline_chars
        self.large_chars = large_chars
        self._plain = model.tokenizer()
        # Separate instances because truncation is tokenizer state, and threads share them.
        self._cutting: dict[Side, Tokenizer] = {}
        for side in ("left", "right"):
            tok = model.tokenizer()
            tok.enable_truncation(max_tokens, strategy="longest_first", direction=side)
            self._cutting[side] = tok
        self._first_chars = first_window_chars(self._plain, max_tokens + 1)
        self._frame: tuple[list[int], list[int]] = ([], [])
        if model.head == "yes_no":
            self._frame = (self._special_free(judge_prompt.PREFIX),
                           self._special_free(judge_prompt.SUFFIX))  # fmt: skip
            if len(self._frame[0]) + len(self._frame[1]) >= max_tokens:
                raise ModelDirError(
                    f"max input tokens {max_tokens} leave no room inside the judging prompt"
                )
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="tokenize")
        self._large = ThreadPoolExecutor(1, thread_name_prefix="tokenize-large")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._large.shutdown(wait=False, cancel_futures=True)

    def _window(self, text: str, side: Side) -> Window:
        # One more than the limit: a cut text then certainly overflows it, special tokens or not.
        return window(self._plain, text, self.max_tokens + 1, side, self._first_chars)

    def _encode_texts(self, texts: list[str], truncate: bool, side: Side) -> list[Encoding]:
        """Window every text, refuse what overflows (truncate off), tokenize the rest."""
        windows = [self._window(t, side) for t in texts]
        self._refuse_cut(windows, truncate, "input")
        encodings: list[Encoding] = self._tokenizer(truncate, side).encode_batch(
            [w.text for w in windows]
        )
        return encodings

    def _encode_whole(self, texts: list[str], truncate: bool, side: Side) -> list[Encoding]:
        """Every text tokenized whole, however long: its windows are cut from the tokens."""
        encodings: list[Encoding] = self._plain.encode_batch(texts)
        return encodings

    def _encode_pairs(
        self, pairs: list[tuple[str, str]], truncate: bool, side: Side
    ) -> list[Encoding]:
        windows = [(self._window(a, side), self._window(b, side)) for a, b in pairs]
        self._refuse_cut([a if a.cut else b for a, b in windows], truncate, "documents")
        fitted = [self._fit_pair(a, b, *w) for (a, b), w in zip(pairs, windows, strict=True)]
        encodings: list[Encoding] = self._tokenizer(truncate, side).encode_batch(fitted)
        return encodings

    def _fit_pair(self, a: str, b: str, wa: Window, wb: Window) -> tuple[str, str]:
        """Longest-first truncation gives the odd token to the longer side, so a side may be cut
        only while it stays the longer one: when its exact tokens outnumber the other whole
        side's. Both sides over the limit leave their order unknown: tokenized whole."""
        if wa.cut == wb.cut:
            return a, b
        if wa.cut:
            other = self._content_tokens(b)
            return (wa.text if wa.exact_tokens > other else a), b
        other = self._content_tokens(a)
        return a, (wb.text if wb.exact_tokens > other else b)

    def _special_free(self, text: str) -> list[int]:
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def _encode_judged(
        self, items: tuple[list[tuple[str, str]], str], truncate: bool, side: Side
    ) -> list[list[int]]:
        pairs, instruction = items
        prefix, suffix = self._frame
        room = self.max_tokens - len(prefix) - len(suffix)
        bodies = [judge_prompt.body(instruction, q, d) for q, d in pairs]
        windows = [self._window(b, side) for b in bodies]
        for i, w in enumerate(windows):
            if w.cut and not truncate:
                frame = len(prefix) + len(suffix)
                raise too_long(i, w.exact_tokens + frame, self.max_tokens, "documents", True)
        encodings = self._plain.encode_batch([w.text for w in windows], add_special_tokens=False)
        out: list[list[int]] = []
        for i, enc in enumerate(encodings):
            ids = enc.ids
            if len(ids) > room:
                if not truncate:
                    frame = len(prefix) + len(suffix)
                    raise too_long(i, len(ids) + frame, self.max_tokens, "documents")
                ids = cut(ids, room, side)
            out.append([*prefix, *ids, *suffix])
        return out

    def _content_tokens(self, text: str) -> int:
        (encoding,) = self._plain.encode_batch([text], add_special_tokens=False)  # GIL released
        return len(encoding.ids)

    def _refuse_cut(self, windows: Sequence[Window], truncate: bool, param: str) -> None:
        if truncate:
            return
        for i, w in enumerate(windows):
            if w.cut:
                raise too_long(i, w.exact_tokens, self.max_tokens, param, at_least=True)

    async def _run(
        self, encode: Callable[[T, bool, Side], R], items: T, chars: int,
        truncate: bool, side: Side,
    ) -> R:  # fmt: skip
        if chars < self.inline_chars:
            return encode(items, truncate, side)
        pool = self._large if chars >= self.large_chars else self._pool
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, encode, items, truncate, side)

    def _tokenizer(self, truncate: bool, side: Side) -> Tokenizer:
        return self._cutting[side] if truncate else self._plain

    def _check(self, encodings: list[Encoding], truncate: bool, param: str) -> None:
        if truncate:
            return
        for i, enc in enumerate(encodings):
            if len(enc) > self.max_tokens:  # len(enc.ids) would build the id list to count it
                raise too_long(i, len(enc), self.max_tokens, param)

    async def texts(
        self, texts: Sequence[str], input_type: str | None, truncate: bool, side: Side
    ) -> Batch:
        prompt = prompt_for(self.model, input_type)
        items = [prompt + t for t in texts] if prompt else list(texts)
        chars = sum(len(t) for t in items)
        encodings = await self._run(self._encode_texts, items, chars, truncate, side)
        self._check(encodings, truncate, "input")
        return Batch(ids=[e.ids for e in encodings])

    async def whole_texts(self, texts: Sequence[str], input_type: str | None) -> Batch:
        """Texts tokenized whole, with each one's special ends, for splitting into windows."""
        prompt = prompt_for(self.model, input_type)
        items = [prompt + t for t in texts] if prompt else list(texts)
        chars = sum(len(t) for t in items)
        encodings = await self._run(self._encode_whole, items, chars, False, "right")
        return Batch(
            ids=[e.ids for e in encodings],
            ends=[special_ends(e.special_tokens_mask) for e in encodings],
        )

    async def pairs(self, pairs: Sequence[tuple[str, str]], truncate: bool, side: Side) -> Batch:
        chars = sum(len(a) + len(b) for a, b in pairs)
        encodings = await self._run(self._encode_pairs, list(pairs), chars, truncate, side)
        self._check(encodings, truncate, "documents")
        return Batch(ids=[e.ids for e in encodings], type_ids=[e.type_ids for e in encodings])

    async def judged_pairs(
        self,
        pairs: Sequence[tuple[str, str]],
        instruction: str | None,
        truncate: bool,
        side: Side,
    ) -> Batch:
        """(query, document) pairs in a yes/no reranker's judging prompt, one sequence each."""
        task = instruction or judge_prompt.DEFAULT_INSTRUCTION
        chars = sum(len(a) + len(b) for a, b in pairs) + len(task) * len(pairs)
        ids = await self._run(self._encode_judged, (list(pairs), task), chars, truncate, side)
        return Batch(ids=ids)

    def token_ids(
        self, seqs: Sequence[Sequence[int]], truncate: bool, side: Side, split: bool = False
    ) -> Batch:
        """Checked token-id inputs; over-long ones are cut (truncate), kept whole for splitting
        into windows (split: token ids carry no special tokens), else refused."""
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
            if len(seq) > self.max_tokens and not split:
                if not truncate:
                    raise too_long(i, len(seq), self.max_tokens, "input")
                out.append(cut(seq, self.max_tokens, side))
            else:
                out.append(list(seq))
        return Batch(ids=out, ends=[(0, 0)] * len(out) if split else None)
