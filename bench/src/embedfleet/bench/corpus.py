"""The benchmark corpus: real prose cut into passages of exact token lengths.

Source: Debian bookworm's `python3.11-doc` package, the CPython 3.11 documentation, whose reST
sources (`html/_sources/**/*.rst.txt`) are prose written by people, the kind of text embedding
services index (technical documentation). It is fetched with `apt-get download` (a plain file, no
root, no install), so every developer machine and CI reaches it, and the package version pins the
text. Code samples, directives and markup are stripped; the remaining paragraphs, in sorted file
order, are concatenated and cut into passages whose MiniLM token count (with [CLS] and [SEP]) is
exactly the requested length. Same package version + same tokenizer -> byte-identical corpus
(the build prints its sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from embedfleet.common.modeldir import default_model_path, load_model_dir

DEB_PACKAGE = "python3.11-doc"
#: the reST trees that are mostly prose (the C API and "what's new" pages are mostly lists)
SOURCE_TREES = ("tutorial", "howto", "faq", "library", "reference", "using")
#: passage lengths in tokens including [CLS]/[SEP], and how many of each the suites draw from
DEFAULT_COUNTS = {32: 64, 128: 256, 512: 256}
CORPUS_FORMAT = 1


def cache_dir() -> Path:
    return Path(os.environ.get("EMBEDFLEET_CACHE") or Path.home() / ".cache" / "embedfleet")


# --- reST -> paragraphs (pure) -----------------------------------------------------------------

_ROLE = re.compile(r":[a-zA-Z:+-]+:`!?~?([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``([^`]*)``")
_LINK = re.compile(r"`([^`<]*?)\s*<[^>]*>`_+")
_BACKTICK = re.compile(r"`([^`]*)`_*")
_EMPH = re.compile(r"\*{1,2}([^*\s][^*]*?)\*{1,2}")
_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+.:_])\1{2,}\s*$")
_SPACES = re.compile(r"\s+")


def _inline(text: str) -> str:
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _BACKTICK.sub(r"\1", text)
    text = _EMPH.sub(r"\1", text)
    return _SPACES.sub(" ", text).strip()


def _is_prose(paragraph: str) -> bool:
    words = paragraph.split()
    if len(words) < 20:
        return False
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    return letters / len(paragraph) > 0.85


def paragraphs(rst: str) -> list[str]:
    """Prose paragraphs of one reST file: no directives, code blocks, titles, tables or lists."""
    out: list[str] = []
    current: list[str] = []
    skip_indent: int | None = None  # inside a directive or literal block: skip deeper lines

    def flush() -> None:
        if current:
            text = _inline(" ".join(current))
            if _is_prose(text):
                out.append(text)
            current.clear()

    for raw in rst.splitlines():
        line = raw.rstrip()
        indent = len(line) - len(line.lstrip())
        if skip_indent is not None:
            if not line or indent > skip_indent:
                continue
            skip_indent = None
        if not line:
            flush()
            continue
        stripped = line.strip()
        if stripped.startswith(".."):
            flush()
            skip_indent = indent
            continue
        if _UNDERLINE.match(stripped) or stripped.startswith(("|", "+-", "* ", "- ", "#. ")):
            current.clear()  # a title (the line above it), a table or a list item
            continue
        if indent > 0 and not current:
            continue  # block quotes and definition bodies start indented: not running prose
        if stripped.endswith("::"):
            current.append(stripped[:-1] if not stripped.endswith(" ::") else stripped[:-3])
            flush()
            skip_indent = indent
            continue
        current.append(stripped)
    flush()
    return out


# --- paragraphs -> passages of exact token counts (pure given a tokenizer) -----------------------


def _exact_passage(tok: Tokenizer, text: str, length: int) -> str | None:
    """The longest prefix of `text` (cut at a word end) that encodes to exactly `length` tokens."""
    enc = tok.encode(text, add_special_tokens=True)
    # BERT adds [CLS] before and [SEP] after, Qwen3-Embedding one <|endoftext|> after.
    mask = enc.special_tokens_mask
    lead = next((i for i, special in enumerate(mask) if not special), 0)
    content = length - (len(tok.encode("", add_special_tokens=True).ids))
    if len(enc.ids) < length:
        return None
    # offsets of the content tokens (after `lead` special ones); try cutting after token
    # content, then one or two earlier, since a cut inside a word re-tokenizes differently.
    for back in range(0, 8):
        end_token = lead + content - 1 - back
        end = enc.offsets[end_token][1]
        candidate = text[:end].rstrip()
        n = len(tok.encode(candidate, add_special_tokens=True).ids)
        if n == length:
            return candidate
    return None


def passages(tok: Tokenizer, paras: Sequence[str], counts: dict[int, int]) -> dict[int, list[str]]:
    """Cut consecutive paragraphs into non-overlapping passages, shortest lengths first.

    Each passage starts at a paragraph start, so it reads like a chunk a RAG indexer would make.
    """
    result: dict[int, list[str]] = {n: [] for n in counts}
    stream = iter(paras)
    for length in sorted(counts):
        while len(result[length]) < counts[length]:
            buffer = ""
            for para in stream:
                buffer = f"{buffer} {para}".strip()
                # ~4 chars a token is plenty of margin before paying for an encode
                if len(buffer) >= length * 4 and len(tok.encode(buffer).ids) >= length:
                    break
            else:
                raise RuntimeError(f"corpus source exhausted at {length}-token passages")
            passage = _exact_passage(tok, buffer, length)
            if passage is not None:
                result[length].append(passage)
    return result


# --- I/O shell ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    source: str
    sha256: str
    texts: dict[int, list[str]]

    def take(self, length: int, n: int, offset: int = 0) -> list[str]:
        """`n` passages of `length` tokens, cycling if asked for more than there are."""
        pool = self.texts[length]
        return [pool[(offset + i) % len(pool)] for i in range(n)]

    def of_length(self, length: int, tokenizer: Tokenizer | None = None) -> list[str]:
        """The passages of exactly `length` tokens: the corpus's own for its lengths, else its
        next longer ones cut down (`cut_to`). The tokenizer is loaded only for a cut."""
        if length in self.texts:
            return self.texts[length]
        longer = sorted(n for n in self.texts if n > length)
        if not longer:
            raise ValueError(f"no corpus passages of {length} tokens or more: {sorted(self.texts)}")
        tok = tokenizer or load_model_dir(default_model_path()).tokenizer()
        return cut_to(tok, self.texts[longer[0]], length)

    def for_tokenizer(self, tok: Tokenizer) -> Corpus:
        """The same passages at the same lengths counted in `tok`'s tokens: each cut down where
        `tok` makes more tokens of it (a byte-level BPE makes about three times a WordPiece's),
        left out where it makes fewer. Idempotent for the tokenizer the corpus was cut with."""
        texts = {n: cut_to(tok, pool, n) for n, pool in self.texts.items()}
        return Corpus(self.source, _digest(texts), texts)


def _digest(texts: dict[int, list[str]]) -> str:
    blob = json.dumps({str(k): v for k, v in sorted(texts.items())}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def cut_to(tok: Tokenizer, texts: Sequence[str], length: int) -> list[str]:
    """Each of `texts` cut at a word end to exactly `length` tokens; a text no cut fits is left
    out (a word of several tokens straddling every candidate cut)."""
    cut = (_exact_passage(tok, text, length) for text in texts)
    out = [text for text in cut if text]
    if not out:
        raise ValueError(f"none of {len(texts)} passages cuts to {length} tokens")
    return out


def _fetch_deb(work: Path) -> tuple[Path, str]:
    """Download and unpack the package; returns (unpacked root, exact version)."""
    cmd = ["apt-get", "download", DEB_PACKAGE]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False)
    if proc.returncode != 0 and os.geteuid() == 0:
        # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, check=False)
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"apt-get download {DEB_PACKAGE} failed: {proc.stderr.strip()}")
    (deb,) = work.glob(f"{DEB_PACKAGE}_*.deb")
    version = deb.name.split("_")[1]
    root = work / "root"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root, version


def _source_files(root: Path) -> Iterator[Path]:
    base = root / "usr" / "share" / "doc" / "python3.11" / "html" / "_sources"
    for tree in SOURCE_TREES:
        yield from sorted((base / tree).rglob("*.rst.txt"))


def build(tokenizer: Tokenizer, counts: dict[int, int] | None = None) -> Corpus:
    counts = counts or DEFAULT_COUNTS
    with tempfile.TemporaryDirectory(prefix="embedfleet-corpus-") as tmp:
        root, version = _fetch_deb(Path(tmp))
        paras = [p for f in _source_files(root) for p in paragraphs(f.read_text(errors="replace"))]
    texts = passages(tokenizer, paras, counts)
    return Corpus(source=f"debian:{DEB_PACKAGE}={version}", sha256=_digest(texts), texts=texts)


def corpus_path() -> Path:
    return cache_dir() / "corpus" / f"corpus-v{CORPUS_FORMAT}.json"


def save(corpus: Corpus, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, object] = {"source": corpus.source, "sha256": corpus.sha256}
    doc["format"] = CORPUS_FORMAT
    doc["texts"] = {str(k): v for k, v in sorted(corpus.texts.items())}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False))
    tmp.replace(path)


def load(path: Path | None = None, tokenizer: Tokenizer | None = None) -> Corpus:
    """The cached corpus, built first if absent (needs `apt-get download` to work)."""
    path = path or corpus_path()
    if not path.is_file():
        tok = tokenizer or load_model_dir(default_model_path()).tokenizer()
        save(build(tok), path)
    doc = json.loads(path.read_text())
    return Corpus(
        source=doc["source"],
        sha256=doc["sha256"],
        texts={int(k): list(v) for k, v in doc["texts"].items()},
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embedfleet.bench corpus", description="(Re)build the benchmark corpus."
    )
    parser.add_argument("--out", type=Path, default=None, help="where to write the corpus JSON")
    args = parser.parse_args(argv)
    tok = load_model_dir(default_model_path()).tokenizer()
    corpus = build(tok)
    out = args.out or corpus_path()
    save(corpus, out)
    sizes = ", ".join(f"{len(v)}x{k}" for k, v in sorted(corpus.texts.items()))
    print(f"corpus {corpus.source}: {sizes} tokens; sha256 {corpus.sha256}; wrote {out}")
    return 0
