"""No import circle inside the project's packages.

The import graph is read from the sources with ``ast``: every ``import`` and ``from ...
import`` naming a module of the package, at module level or inside a function (an import
deferred into a function to dodge a circle is still a circle), except those only for type
checkers (``if TYPE_CHECKING:``). A circle is a strongly connected component of that graph
with more than one module, or a module importing itself.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

PACKAGES = ("analysis", "pipeline", "workloads")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` (a folder under ``root``) by dotted name."""
    return {module_name(root, p): p for p in sorted((root / package).rglob("*.py"))}


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree``, less those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in _runtime_imports(child))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _runtime_imports(node)


def _base(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from`` import names, relative imports resolved against ``name``."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (its source at ``path``) imports."""
    found: set[str] = set()
    for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
            continue
        base = _base(name, path, node)
        for alias in node.names:
            target = f"{base}.{alias.name}"
            found.add(target if target in known else base)
    return found & known


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    mods = modules(root, package)
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with a circle in them (Tarjan), each sorted."""
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
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle(package: str) -> None:
    graph = import_graph(REPO, package)
    assert len(graph) > 5
    assert circles(graph) == []


def test_findings_and_their_rules_import_one_way() -> None:
    """The findings framework imports no rules; the rule modules import the framework, and
    comm_findings never imports findings."""
    graph = import_graph(REPO, "analysis")
    base, rules = "analysis.outputs.finding_base", "analysis.outputs.findings"
    comm = "analysis.outputs.comm_findings"
    assert base in graph[rules] and base in graph[comm]
    assert rules not in graph[comm] and not graph[base] & {rules, comm}
    # the diff's parts: the command imports them, they never import the command
    parts = [m for m in graph if m.startswith("analysis.outputs.diff_")]
    assert len(parts) >= 4
    assert all("analysis.outputs.diff" not in graph[m] for m in parts)


def test_the_check_finds_a_circle(tmp_path: Path) -> None:
    """On a package made to have one (a deferred import closes it) and a type-only import
    that does not count."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pkg import a\n")
    (pkg / "d.py").write_text("import pkg.d\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert graph["pkg.c"] == set()
    assert circles(graph) == [["pkg.a", "pkg.sub.b"], ["pkg.d"]]


@pytest.mark.parametrize("module", ["analysis.outputs.comm_findings",
                                    "analysis.outputs.findings", "analysis.outputs.diff"])
def test_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
