"""Long texts are cut to their window before tokenizing (window.py): the result is exactly what
tokenizing the whole text would give, a 10 MB text is cheap, and a huge request runs on its own
lane without delaying small ones. References are the model's own tokenizer on the whole text."""

from __future__ import annotations

import asyncio
import random
import resource
import time

import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.errors import ApiError
from embedfleet.gateway.tokenization import Side, Tokenization
from embedfleet.gateway.window import exact_tokens, first_window_chars

PIECES = [
    "word", "Tokenization", "naïve", "café", "e\u0301", "日本語", "don't", "...", ",", "!!",
    "x" * 120, "http://example.com/a?b=c", "1234567", "ÆØÅ", "\u00a0", "\t", "\n\n", "  ",
]  # fmt: skip
LIMIT = 16


def _text(rng: random.Random, pieces: int) -> str:
    out = []
    for _ in range(pieces):
        out.append(rng.choice(PIECES))
        out.append(rng.choice([" ", " ", " ", "", "   ", "\n"]))
    return "".join(out)


@pytest.fixture(scope="module")
def small_limit(minilm: ModelDir) -> Tokenization:
    # inline_chars=0: the thread path; first window 17 * 19 chars, so most texts here are cut.
    return Tokenization(minilm, max_tokens=LIMIT, threads=1, inline_chars=0)


def test_exact_tokens_skips_the_two_words_at_the_cut() -> None:
    words = [None, 0, 0, 1, 2, 3, 3, None]
    assert exact_tokens(words, "right") == 3  # words 0 and 1; 2 and 3 touch the end
    assert exact_tokens(words, "left") == 3  # words 2 and 3; 0 and 1 touch the start
    assert exact_tokens([None, None], "right") == 0


def test_the_first_window_fits_the_longest_tokens(minilm: ModelDir) -> None:
    assert first_window_chars(minilm.tokenizer(), 10) == 10 * (18 + 1)  # MiniLM's longest: 18


@pytest.mark.parametrize("side", ["right", "left"])
async def test_a_cut_text_tokenizes_as_the_whole_text(
    small_limit: Tokenization, minilm: ModelDir, side: Side
) -> None:
    rng = random.Random(f"window-{side}")
    reference = minilm.tokenizer()
    reference.enable_truncation(LIMIT, strategy="longest_first", direction=side)
    plain = minilm.tokenizer()
    texts = [_text(rng, rng.randrange(1, 800)) for _ in range(200)]
    got = await small_limit.texts(texts, None, truncate=True, side=side)
    for text, ids in zip(texts, got.ids, strict=True):
        assert ids == reference.encode(text).ids, text[:80]
    for text in texts[:60]:
        whole = len(plain.encode(text).ids)
        if whole > LIMIT:
            with pytest.raises(ApiError) as info:
                await small_limit.texts([text], None, truncate=False, side=side)
            assert info.value.code == "context_length_exceeded"
        else:
            ok = await small_limit.texts([text], None, truncate=False, side=side)
            assert ok.ids[0] == plain.encode(text).ids


async def test_cut_pairs_tokenize_as_the_whole_pairs(
    small_limit: Tokenization, minilm: ModelDir
) -> None:
    rng = random.Random("pairs")
    reference = minilm.tokenizer()
    reference.enable_truncation(LIMIT, strategy="longest_first", direction="right")
    pairs = [
        (_text(rng, rng.randrange(1, 300)), _text(rng, rng.randrange(1, 900))) for _ in range(24)
    ]
    got = await small_limit.pairs(pairs, truncate=True, side="right")
    assert got.type_ids is not None
    for (a, b), ids, types in zip(pairs, got.ids, got.type_ids, strict=True):
        want = reference.encode(a, b)
        assert (ids, types) == (want.ids, want.type_ids)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def test_ten_megabytes_are_cut_quickly_and_small_requests_keep_their_lane(
    minilm: ModelDir,
) -> None:
    tok = Tokenization(minilm, max_tokens=256, threads=2, inline_chars=256)
    try:
        words = [
            "The",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
            "the",
            "lazy",
            "dog",
            "at",
            "dawn",
        ]
        big = " ".join(words[i % len(words)] for i in range(2_000_000))[: 10 << 20]
        reference = minilm.tokenizer()
        reference.enable_truncation(256, strategy="longest_first", direction="right")
        want = reference.encode(big[:20_000]).ids  # 256 tokens come from the first ~1,300
        peak = _rss_mib()
        start = time.perf_counter()
        got = await tok.texts([big], None, truncate=True, side="right")
        elapsed = time.perf_counter() - start
        assert got.ids[0] == want
        with pytest.raises(ApiError, match=r"at least \d+ tokens, more than this model.s limit"):
            await tok.texts([big], None, truncate=False, side="right")
        # Tokenizing it whole took 32 s and 1.4 GB here; cut first, milliseconds.
        assert elapsed < 1.0, elapsed
        assert _rss_mib() - peak < 100
        # A text no window can shorten (one 10 MB "word": a single [UNK]) is tokenized whole, on
        # the large-request lane; four of them queue there while small requests go on.
        hard = "x" * (10 << 20)
        small = "a short query about embeddings and vectors " * 7  # 301 chars: the thread pool
        heavy = [asyncio.ensure_future(tok.texts([hard], None, True, "right")) for _ in range(4)]
        await asyncio.sleep(0.05)
        waits = []
        for _ in range(30):
            t = time.perf_counter()
            await tok.texts([small], None, truncate=True, side="right")
            waits.append(time.perf_counter() - t)
            await asyncio.sleep(0.02)
        assert not all(h.done() for h in heavy)  # the small ones ran while the lane was busy
        for h in heavy:
            h.cancel()
        worst, grown = max(waits) * 1e3, _rss_mib() - peak
        print(f"10 MB cut in {elapsed * 1e3:.1f} ms; small next to whole-tokenized 10 MB inputs: "
              f"worst {worst:.1f} ms; peak RSS +{grown:.0f} MiB")  # fmt: skip
        # Its own work is under a millisecond; the bound leaves room for the large lane's thread
        # sharing a core (2 shared cores here), but not for queueing behind it (seconds).
        assert max(waits) < 0.5
        assert grown < 800  # one whole 10 MB text at a time (four natural ones took 3 GB before)
    finally:
        tok.close()
