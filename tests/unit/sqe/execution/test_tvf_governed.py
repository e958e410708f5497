"""Governed locations of the file table functions: every table of every namespace, nested ones too, fail closed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sqe.catalog.base import TableIdent
from sqe.errors import CatalogUnavailableError, ExternalAccessError
from sqe.execution.tvf import GovernedLocations

Namespace = tuple[str, ...]


class _Catalog:
    """An in-memory catalog: namespaces by parent (``()`` is the top level) and table locations by namespace."""

    def __init__(self, children: dict[Namespace, list[Namespace]], tables: dict[Namespace, dict[str, str]]) -> None:
        self.children = children
        self.tables = tables
        self.failing: set[Namespace] = set()

    def list_namespaces(self, warehouse: str, parent: Namespace | None = None) -> list[Namespace]:
        if (parent or ()) in self.failing:
            raise CatalogUnavailableError(f"cannot reach the catalog for namespaces of {parent}")
        return list(self.children.get(parent or (), []))

    def list_tables(self, warehouse: str, namespace: Namespace | None) -> list[TableIdent]:
        assert namespace, "the walk names every namespace itself"
        return [TableIdent(warehouse, namespace, name) for name in self.tables.get(namespace, {})]

    def load_table(self, ident: TableIdent) -> Any:
        metadata = SimpleNamespace(location=self.tables[ident.namespace][ident.name], properties={})
        return SimpleNamespace(table=SimpleNamespace(metadata=metadata))


def _nested() -> _Catalog:
    return _Catalog(
        children={(): [("top",)], ("top",): [("top", "inner")], ("top", "inner"): [("top", "inner", "deep")]},
        tables={
            ("top",): {"plain": "s3://b/top/plain"},
            ("top", "inner"): {"secret": "s3://b/zone/secret"},
            ("top", "inner", "deep"): {"deeper": "s3://b/zone2/deeper"},
        },
    )


def _governed(catalog: _Catalog) -> GovernedLocations:
    return GovernedLocations(catalog, ("w",))  # type: ignore[arg-type]


def test_tables_of_nested_namespaces_are_governed() -> None:
    governed = _governed(_nested())
    governed.refresh()
    assert governed.locations == {
        "s3://b/top/plain": "w.top.plain",
        "s3://b/zone/secret": "w.top.inner.secret",
        "s3://b/zone2/deeper": "w.top.inner.deep.deeper",
    }
    with pytest.raises(ExternalAccessError, match="overlaps the location s3://b/zone/secret of Iceberg table"):
        governed.check_prefixes(["s3://b/zone"])
    with pytest.raises(ExternalAccessError, match=r"inside the location of Iceberg table w\.top\.inner\.deep\.deeper"):
        governed.check_file("read_parquet", "s3://b/zone2/deeper/data/x.parquet")


def test_a_nested_listing_failure_fails_closed() -> None:
    catalog = _nested()
    catalog.failing.add(("top", "inner"))
    with pytest.raises(ExternalAccessError, match="cannot check file table function prefixes against the tables of w"):
        _governed(catalog).refresh()


def test_a_namespace_named_as_its_own_child_ends_the_walk() -> None:
    catalog = _Catalog(children={(): [("a",)], ("a",): [("a",), ("a", "b")], ("a", "b"): [("a",)]}, tables={})
    governed = _governed(catalog)
    governed.refresh()
    assert governed.locations == {}
