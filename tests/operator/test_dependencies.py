"""The operator's pyproject declares exactly the distributions its own modules import, so its image
never depends on what another package happens to pull in."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions

from .helpers import REPO

OPERATOR = REPO / "operator"


def imported_modules() -> set[str]:
    """Absolute module names the operator's sources import, the standard library's left out."""
    names: set[str] = set()
    for path in (OPERATOR / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return {n for n in names if n.split(".")[0] not in sys.stdlib_module_names | {"__future__"}}


def distributions(module: str) -> set[str]:
    parts = module.split(".")
    if parts[0] == "embedfleet":  # one namespace, one distribution per component
        return set() if parts[1] == "operator" else {f"embedfleet-{parts[1]}"}
    return {canonical(d) for d in packages_distributions()[parts[0]]}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_import_is_declared_and_every_declaration_imported() -> None:
    project = tomllib.loads((OPERATOR / "pyproject.toml").read_text())["project"]
    declared = {
        canonical(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in project["dependencies"]
    }
    imported = set().union(*(distributions(m) for m in imported_modules()))
    assert imported == declared
