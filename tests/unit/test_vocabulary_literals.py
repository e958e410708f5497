"""The wire vocabulary is written once: no module of the packages spells a ``sqe.vocabulary`` string as a literal."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from sqe import vocabulary

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("sqe", "sqe_catalog", "workers", "sqe_stack")
# Too plain to be the vocabulary's whenever it is written ("true" is also every boolean property's value).
TOO_PLAIN = frozenset({vocabulary.VENDED_CREDENTIALS_LEGACY})


def _vocabulary_strings() -> dict[str, str]:
    names = (name for name in dir(vocabulary) if name.isupper())
    values = {getattr(vocabulary, name): name for name in names if isinstance(getattr(vocabulary, name), str)}
    return {value: name for value, name in values.items() if value and value not in TOO_PLAIN}


def _string_literals(tree: ast.AST) -> Iterator[ast.Constant]:
    """String constants, except the arguments of ``Literal[...]`` (a type cannot name a constant)."""
    if isinstance(tree, ast.Subscript) and isinstance(tree.value, ast.Name) and tree.value.id == "Literal":
        return
    if isinstance(tree, ast.Constant) and isinstance(tree.value, str):
        yield tree
    for child in ast.iter_child_nodes(tree):
        yield from _string_literals(child)


def _copies(source: str, known: dict[str, str]) -> list[tuple[int, str]]:
    return [(node.lineno, known[node.value]) for node in _string_literals(ast.parse(source)) if node.value in known]


def test_no_module_writes_a_vocabulary_string_as_a_literal() -> None:
    known = _vocabulary_strings()
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path == REPO / "sqe" / "vocabulary.py" or "_pb2" in path.name:
                continue
            for line, name in _copies(path.read_text(encoding="utf-8"), known):
                found.append(f"{path.relative_to(REPO)}:{line}: use sqe.vocabulary.{name}")
    assert not found, "\n".join(found)


def test_the_scan_sees_literals_but_not_literal_types() -> None:
    source = 'X: Literal["vended-credentials"]\nY = {"s3.access-key-id": 1}\nZ = f"s3.region={1}"\n'
    assert _copies(source, _vocabulary_strings()) == [(2, "S3_ACCESS_KEY_ID")]
