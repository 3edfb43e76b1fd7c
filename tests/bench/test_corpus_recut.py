"""The benchmark corpus recut by another model's tokenizer: the same lengths, in its tokens."""

from __future__ import annotations

from embedfleet.bench.corpus import Corpus
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.testing import families

T = families.TEXTS
#: the test families' texts, each passage starting at another one of them
PROSE = [" ".join(T[i:] + T[:i]) for i in range(len(T))]


def minilm_corpus() -> Corpus:
    tok = load_model_dir(default_model_path()).tokenizer()
    return Corpus("test", "", dict.fromkeys((12, 24), PROSE)).for_tokenizer(tok)


def test_a_byte_level_tokenizer_gets_passages_of_its_own_lengths() -> None:
    """A small byte-level vocabulary makes about three tokens of each WordPiece, as the decoder
    families' test tokenizer does of the corpus's prose."""
    base = minilm_corpus()
    tok = families.bpe_tokenizer(300)
    recut = base.for_tokenizer(tok)
    for n, texts in recut.texts.items():
        assert texts
        for text in texts:
            assert len(tok.encode(text).ids) == n
            assert any(p.startswith(text) for p in base.texts[n])  # the same passages, recut
    assert recut.texts != base.texts
    assert recut.sha256 != base.sha256


def test_recutting_by_the_corpus_own_tokenizer_changes_nothing() -> None:
    base = minilm_corpus()
    tok = load_model_dir(default_model_path()).tokenizer()
    assert base.for_tokenizer(tok).texts == base.texts
