"""docs/development.md's module map names every product module, so a newcomer finds the noun.

Each component has a `### <component>` section under `## Module map`. A module is named there by
a backticked path relative to its package (`engine/batch.py`, `upstream/pool`), or by its bare
name where that name is unique in the component (`batch.py`). Generated `*_pb2*` stubs are left
out; a Rust `mod.rs` is its folder's module, and `lib.rs` / `main.rs` are named as `lib`/`main`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "development.md"
PYTHON = ("common", "worker", "fleet", "operator", "bench", "testing")


def python_modules(component: str) -> set[str]:
    package = ROOT / component / "src" / "embedfleet" / component
    return {
        path.relative_to(package).with_suffix("").as_posix()
        for path in package.rglob("*.py")
        if path.name != "__init__.py" and "_pb2" not in path.name
    }


def rust_modules(crate: str) -> set[str]:
    src = ROOT / crate / "src"
    out = set()
    for path in src.rglob("*.rs"):
        name = path.relative_to(src).with_suffix("").as_posix()
        out.add(name.removesuffix("/mod"))
    return out


def sections(text: str) -> dict[str, str]:
    """The module map's `### <component>` sections by component name."""
    start = text.index("## Module map")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end >= 0 else None]
    parts = re.split(r"^### (\w+)[^\n]*$", body, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def named(section: str) -> set[str]:
    """Every backticked token of a section, without a `.py`/`.rs` suffix or a trailing slash."""
    tokens = re.findall(r"`([^`\s]+)`", section)
    return {re.sub(r"(\.py|\.rs|/)$", "", token) for token in tokens}


def missing(modules: set[str], section: str) -> list[str]:
    """The modules no token of `section` names: a token names the one module whose path it
    equals or ends (`kernels/glu` names `engine/kernels/glu`), and none if it fits several."""
    found = set()
    for token in named(section):
        fits = [m for m in modules if m == token or m.endswith("/" + token)]
        if len(fits) == 1:
            found.update(fits)
    return sorted(modules - found)


def test_the_map_rules_read_paths_and_unique_names() -> None:
    section = "- `engine/`: the engine\n  - `batch.py`: batches\n| `api/errors` | catalog |"
    modules = {"engine", "engine/batch", "api/errors", "upstream/batch", "http/pool"}
    assert missing(modules, section) == ["engine/batch", "http/pool", "upstream/batch"]


def test_every_product_module_is_in_the_map() -> None:
    found = sections(DOC.read_text())
    trees = {name: python_modules(name) for name in PYTHON} | {
        "gateway": rust_modules("gateway"),
        "front": rust_modules("worker-front"),
        "logs": rust_modules("crates/logs"),
    }
    assert all(trees.values()), "a product tree moved: update this test's paths"
    absent = {
        f"{component}: {module}"
        for component, modules in trees.items()
        for module in missing(modules, found.get(component, ""))
    }
    assert not absent, (
        "docs/development.md's module map (### <component>) lacks, one line each:\n"
        + "\n".join(sorted(absent))
    )
