"""The package layout: nothing under ``sqe`` imports ``workers``, and no import cycle between packages.

Imports are read with ``ast`` (no module is executed). A package here is the first two dotted levels below the
top (``sqe.credentials``, ``sqe.distributed``, ``workers``); imports under ``if TYPE_CHECKING:`` count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("sqe", "sqe_catalog", "workers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module_name(path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.add(node.module)
    return {name for name in found if name.split(".")[0] in TOPS}


def _product_modules() -> dict[str, set[str]]:
    return {
        _module_name(path): _imports(path)
        for top in TOPS
        for path in sorted((ROOT / top).rglob("*.py"))
        if "_proto" not in path.parts or path.name == "__init__.py"
    }


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2]) if module.startswith("sqe.") else module.split(".")[0]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_engine_module_imports_the_worker_service() -> None:
    offenders = {
        module: sorted(name for name in imports if name.split(".")[0] == "workers")
        for module, imports in _product_modules().items()
        if module.split(".")[0] == "sqe"
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_the_worker_wire_protocol_lives_in_the_engine() -> None:
    modules = _product_modules()
    assert "sqe.distributed.protocol.ticket" in modules and "workers.ticket" not in modules
    assert not any(module.startswith("workers._proto") for module in modules)


def test_no_import_cycle_between_the_distributed_packages_and_the_worker() -> None:
    graph: dict[str, set[str]] = {}
    for module, imports in _product_modules().items():
        source = _package(module)
        graph.setdefault(source, set()).update(_package(name) for name in imports if _package(name) != source)
    cycles = _cycles(graph)
    touching = [c for c in cycles if any(p in ("sqe.distributed", "workers", "sqe.credentials") for p in c)]
    assert touching == [], f"package import cycles: {cycles}"
