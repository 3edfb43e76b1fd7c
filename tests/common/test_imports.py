"""The import graph of every embedfleet module, read statically (ast, nothing is imported).

Two rules keep the components apart and a newcomer's reading one-way: no import cycles, anywhere
(imports inside functions count: they still make two modules depend on each other), and a
component imports no other component but `common`. The test harness (`testing`) may import
anything; the benchmarks (`bench`) may import the components they measure and the harness.
The operator's rendering (`operator/render/`) imports only the spec, the names and itself.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("common", "worker", "fleet", "operator", "bench", "testing")

#: what each component may import besides itself; None: anything
MAY_IMPORT: Mapping[str, frozenset[str] | None] = {
    "common": frozenset(),
    "worker": frozenset({"common"}),
    "fleet": frozenset({"common"}),
    "operator": frozenset({"common"}),
    "bench": frozenset({"common", "worker", "fleet", "operator", "testing"}),
    "testing": None,
}

Graph = dict[str, set[str]]


def module_files() -> dict[str, Path]:
    """Module name -> file, for every .py under <component>/src/embedfleet/."""
    found = {}
    for component in COMPONENTS:
        root = REPO / component / "src"
        for path in sorted((root / "embedfleet" / component).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(module: str, is_package: bool, tree: ast.AST) -> Iterator[str]:
    """Every module name an import statement in `tree` names, relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            # `from package import name` imports a submodule when `name` is one
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(files: Mapping[str, Path]) -> Graph:
    """Edges between embedfleet modules only; a name that is no module is dropped."""
    graph: Graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        graph[module] = {
            name for name in _imported(module, is_package, tree) if name in files and name != module
        }
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def component(module: str) -> str:
    return module.split(".")[1]


def forbidden_imports(graph: Graph) -> list[str]:
    """`a -> b` for every import of one component by another that MAY_IMPORT does not allow."""
    found = []
    for module, targets in sorted(graph.items()):
        allowed = MAY_IMPORT[component(module)]
        if allowed is None:
            continue
        for target in sorted(targets):
            other = component(target)
            if other != component(module) and other not in allowed:
                found.append(f"{module} -> {target}")
    return found


GRAPH = import_graph(module_files())


def test_the_walk_sees_every_component_and_its_edges() -> None:
    """Guards the guard: an empty or edgeless graph would pass the two rules below."""
    assert {component(m) for m in GRAPH} == set(COMPONENTS)
    assert "embedfleet.common.codec" in GRAPH["embedfleet.worker.server"]
    # an import inside a function counts
    assert "embedfleet.worker.warmup" in GRAPH["embedfleet.bench.worker"]
    relative = ast.parse("def f():\n    from ..b import c\n    from . import d\n")
    assert set(_imported("p.q.a", False, relative)) == {"p.b", "p.b.c", "p.q", "p.q.d"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    found = cycles(GRAPH)
    assert not found, "import cycles:\n" + "\n".join("  " + " <-> ".join(c) for c in found)


def test_components_import_only_common() -> None:
    found = forbidden_imports(GRAPH)
    assert not found, "imports across components:\n" + "\n".join("  " + f for f in found)


def test_the_operators_rendering_stays_pure() -> None:
    """operator/render/ turns specs into objects: it reads the spec and the names in manifests.py,
    and nothing that talks to a cluster (no kube client, informer, reconciler, no third party)."""
    files = module_files()
    render = [m for m in files if m.startswith("embedfleet.operator.render")]
    assert len(render) >= 7
    allowed = {"embedfleet.operator.manifests", "embedfleet.operator.spec"}
    for module in render:
        outside = {t for t in GRAPH[module] if not t.startswith("embedfleet.operator.render")}
        assert outside <= allowed, f"{module} imports {sorted(outside - allowed)}"
        tree = ast.parse(files[module].read_text())
        roots = {
            name.split(".")[0]
            for name in _imported(module, files[module].name == "__init__.py", tree)
        }
        assert roots <= {"embedfleet", "__future__", *sys.stdlib_module_names}, module
