"""No product function over 80 lines (issue 39): a longer one is a decision in a constructor or a
step-by-step script that wants splitting."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 80


def _functions(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
    """(qualified name, lines from `def` to its last line) of every function under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            assert child.end_lineno is not None
            yield prefix + child.name, child.end_lineno - child.lineno + 1
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")


def _lengths() -> dict[str, int]:
    out = {}
    for path in sorted(REPO.glob("*/src/**/*.py")):
        if "_pb2" in path.name:  # generated
            continue
        where = path.relative_to(REPO).as_posix()
        for name, lines in _functions(ast.parse(path.read_text()), ""):
            out[f"{where}:{name}"] = lines
    return out


def test_no_product_function_exceeds_the_limit() -> None:
    lengths = _lengths()
    assert len(lengths) > 1000  # the walk found the product's code
    over = {name: lines for name, lines in lengths.items() if lines > LIMIT}
    assert not over, f"functions over {LIMIT} lines: {over}"
