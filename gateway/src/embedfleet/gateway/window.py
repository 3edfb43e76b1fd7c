"""The character window of a long text that decides its first (or last) N tokens.

A 10 MB string cut to 256 tokens needs only its first few kilobytes, but tokenizing it whole costs
tens of seconds and gigabytes. There is no fixed bound on characters per token to cut by (a
WordPiece tokenizer maps a word of any length to one [UNK] and drops whitespace entirely), so the
window is found by trying: tokenize a prefix (right truncation) or suffix (left) of the text and
count the tokens that cannot depend on where it was cut, i.e. all but those of the two pre-tokenizer
words nearest the cut (the cut word itself, and one more for tokenizers whose whitespace splitting
looks ahead). With enough of them, the window's tokens are the text's own; else the window grows
fourfold, up to the whole text. Normalizers and pre-tokenizers are local (per character, split at
whitespace and punctuation), which is what makes the words away from the cut exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tokenizers import Tokenizer

Side = Literal["left", "right"]
GROWTH = 4


@dataclass(frozen=True, slots=True)
class Window:
    text: str
    #: the text was cut: it holds more than the wanted tokens, and `text` yields them exactly
    cut: bool
    #: tokens of `text` known to be the whole text's own (0 when not cut)
    exact_tokens: int = 0


def exact_tokens(word_ids: Sequence[int | None], side: Side) -> int:
    """Tokens not in the two words nearest the cut (the end for right, the start for left)."""
    words = [w for w in word_ids if w is not None]
    if not words:
        return 0
    if side == "right":
        edge = words[-1] - 1
        return sum(1 for w in words if w < edge)
    edge = words[0] + 1
    return sum(1 for w in words if w > edge)


def first_window_chars(tokenizer: Tokenizer, tokens: int) -> int:
    """A first window that holds `tokens` tokens of ordinary text: each token's longest spelling
    in the vocabulary plus one separator."""
    longest = max((len(t) for t in tokenizer.get_vocab()), default=16)
    return tokens * (longest + 1)


def window(tokenizer: Tokenizer, text: str, tokens: int, side: Side, first_chars: int) -> Window:
    """The shortest tried cut of `text` whose first (right) or last (left) `tokens` tokens are
    exactly the whole text's, or the whole text when it has fewer."""
    size = first_chars
    while size < len(text):
        piece = text[:size] if side == "right" else text[-size:]
        # encode_batch, unlike encode, lets go of the GIL while it works.
        (encoding,) = tokenizer.encode_batch([piece], add_special_tokens=False)
        exact = exact_tokens(encoding.word_ids, side)
        if exact >= tokens:
            return Window(piece, True, exact)
        size *= GROWTH
    return Window(text, False)
