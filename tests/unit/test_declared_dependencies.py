"""What the packages import is declared in pyproject.toml: every third-party module imported at run time (module level
or inside a function) belongs to a core dependency, or for ``sqe_stack`` to the ``stack`` extra it asks for."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OWN = frozenset({"sqe", "sqe_catalog", "sqe_stack", "workers"})
# Packages whose imports may also come from these extras (sqe_stack is reached only with `pip install 'sqe[stack]'`).
EXTRAS = {"sqe": (), "sqe_catalog": (), "workers": (), "sqe_stack": ("stack",)}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normalized(re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0])


def _declared(extras: tuple[str, ...]) -> set[str]:
    with (REPO / "pyproject.toml").open("rb") as fh:
        project = tomllib.load(fh)["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return {_requirement_name(r) for r in requirements}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(nodes: list[ast.stmt]) -> Iterator[tuple[str, int]]:
    """Top-level module names imported outside ``if TYPE_CHECKING:`` (type-only imports are the dev extra's)."""
    for node in nodes:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _runtime_imports(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name.split(".")[0], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], node.lineno
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield from _runtime_imports([child])
            elif isinstance(child, ast.ExceptHandler | ast.match_case):
                yield from _runtime_imports(child.body)


def test_every_third_party_import_is_a_declared_dependency() -> None:
    providers = importlib.metadata.packages_distributions()
    problems = []
    for package, extras in EXTRAS.items():
        declared = _declared(extras)
        for path in sorted((REPO / package).rglob("*.py")):
            if "_pb2" in path.name:
                continue  # generated
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for module, line in _runtime_imports(tree.body):
                if module in sys.stdlib_module_names or module in OWN or module == "__future__":
                    continue
                distributions = {_normalized(d) for d in providers.get(module, [module])}
                if not distributions & declared:
                    where = path.relative_to(REPO)
                    problems.append(f"{where}:{line}: {module} (from {sorted(distributions)}) is not declared")
    assert not problems, "\n".join(problems)


def test_the_helpers_find_nested_imports_and_skip_type_only_ones() -> None:
    source = (
        "import a.b\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import hidden\nelse:\n    import shown\n"
        "def f():\n    try:\n        import nested\n    except ImportError:\n        from handled import x\n"
        "from . import relative\n"
    )
    names = [name for name, _ in _runtime_imports(ast.parse(source).body)]
    assert names == ["a", "typing", "shown", "nested", "handled"]
    assert _requirement_name("pyiceberg[pyarrow,sql-sqlite]>=0.12,<0.13") == "pyiceberg"
    assert _requirement_name("Python_Multipart>=0.0.9") == "python-multipart"
