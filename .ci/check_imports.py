#!/usr/bin/env python3
"""Import layout check (standard library only): imports flow one way.

Fails (exit 1, listing each problem) when
- any module under ``sqe/`` imports ``workers`` (anywhere: module level, inside a function, or under
  ``if TYPE_CHECKING:``) — the engine never depends on the worker service;
- module-level imports between modules of ``sqe/``, ``sqe_catalog/``, ``sqe_stack/`` and ``workers/`` form a
  cycle, between files or between packages (``sqe.catalog``, ``sqe.credentials``, ... — the first two levels
  under ``sqe``, the top level elsewhere): the layers of the README import one way only. Imports inside
  functions and under ``if TYPE_CHECKING:`` are deferred or never run, so they do not count here.

Generated protobuf modules (``*_pb2*.py``) are skipped.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("sqe", "sqe_catalog", "sqe_stack", "workers")


@dataclass(frozen=True)
class Import:
    target: str  # the imported module, absolute
    line: int
    module_level: bool  # run at import time (not in a function, not under TYPE_CHECKING)
    names: tuple[str, ...] = ()  # ``from target import names``: each may be a submodule


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(node: ast.ImportFrom, module: str, package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(tree: ast.Module, module: str, package: bool) -> Iterator[Import]:
    def walk(nodes: list[ast.stmt], module_level: bool) -> Iterator[Import]:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(alias.name, node.lineno, module_level)
            elif isinstance(node, ast.ImportFrom):
                names = tuple(alias.name for alias in node.names)
                yield Import(_resolve(node, module, package), node.lineno, module_level, names)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(node.body if isinstance(node.body, list) else [], False)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.body, False)
                yield from walk(node.orelse, module_level)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    children = getattr(node, field, None)
                    if isinstance(children, list):
                        yield from walk([c for c in children if isinstance(c, ast.stmt)], module_level)
                        for child in children:
                            if isinstance(child, ast.ExceptHandler | ast.match_case):
                                yield from walk(child.body, module_level)

    yield from walk(tree.body, True)


def collect(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    """(module-level import graph among our modules, violations of 'sqe never imports workers')."""
    files = {
        module_name(root, path): path
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
        if "_pb2" not in path.name
    }
    graph: dict[str, set[str]] = {name: set() for name in files}
    violations: list[str] = []
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for imp in imports_of(tree, name, is_package(path)):
            if name.split(".")[0] == "sqe" and imp.target.split(".")[0] == "workers":
                violations.append(f"{path.relative_to(root)}:{imp.line}: sqe imports {imp.target}")
            if imp.module_level:
                graph[name].update(t for t in _targets(imp, files) if t != name)
    return graph, sorted(set(violations))


def _targets(imp: Import, files: dict[str, Path]) -> set[str]:
    """Our modules an import depends on. ``from pkg import mod`` depends on ``pkg.mod``; ``pkg`` itself (an
    ancestor being imported anyway) counts only when a name is not a submodule, i.e. comes from its __init__."""
    submodules = {f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in files}
    from_init = len(submodules) < len(imp.names) or not imp.names
    return submodules | ({imp.target} if from_init and imp.target in files else set())


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each sorted.

    Only explicit imports are edges: a package's ``__init__`` that re-exports its own submodules is not a cycle
    by itself, but a submodule importing from its package's ``__init__`` (which imports it back) is.
    """
    edges = graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def layer_of(module: str) -> str:
    """The package a module belongs to for layering: ``sqe.catalog.rest`` -> ``sqe.catalog``; ``workers.x`` ->
    ``workers``. A top-level engine module (``sqe.session``) is a layer of its own."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "sqe" else parts[0]


def layer_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    layers: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = layer_of(module)
        layers.setdefault(source, set()).update(t for t in map(layer_of, targets) if t != source and t != "sqe")
    for targets in list(layers.values()):
        for target in targets:
            layers.setdefault(target, set())
    return layers


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    graph, violations = collect(root)
    problems = [
        *violations,
        *("import cycle: " + " <-> ".join(c) for c in cycles(graph)),
        *("package import cycle: " + " <-> ".join(c) for c in cycles(layer_graph(graph))),
    ]
    for problem in problems:
        print(problem)
    if problems:
        print(f"check_imports: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"check_imports: {len(graph)} modules, no workers import from sqe, no cycles between files or packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
