"""The docs read as a reference: no paragraph runs past 200 words. Figures with dates live in
docs/benchmarks/ and history in CHANGELOG.md, so neither is held to this."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 200
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def paragraphs(text: str) -> list[str]:
    """Prose paragraphs of a markdown page: blank-line separated, each list item its own,
    with fenced code blocks, tables, headings and HTML comments left out."""
    out: list[str] = []
    current: list[str] = []
    fence = False

    def close() -> None:
        if current:
            out.append(" ".join(current))
            current.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            close()
            fence = not fence
            continue
        if fence or stripped.startswith(("|", "<!--")):
            close()
            continue
        if not stripped or stripped.startswith("#") or _ITEM.match(line):
            close()
        if stripped and not stripped.startswith("#"):
            current.append(_ITEM.sub("", stripped))
    close()
    return out


def words(paragraph: str) -> int:
    return len(paragraph.split())


def test_paragraphs_split_on_blank_lines_items_and_blocks() -> None:
    text = "one two\nthree\n\n- four\n- five six\n```\nseven eight\n```\n| a | b |\n# nine\nten"
    assert [words(p) for p in paragraphs(text)] == [3, 1, 2, 1]


def test_no_paragraph_runs_past_the_limit() -> None:
    long = [
        f"{page.relative_to(ROOT)}: {words(p)} words: {p[:80]}..."
        for page in pages()
        for p in paragraphs(page.read_text())
        if words(p) > LIMIT
    ]
    assert not long, "split these into short paragraphs (or move figures to docs/benchmarks):\n" + (
        "\n".join(long)
    )
