"""Governed locations of the file table functions: every table of every namespace, nested ones too, fail closed;
local paths against file:// table locations as real paths."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import duckdb
import pytest

from sqe.catalog.base import TableIdent
from sqe.config import load_config
from sqe.errors import CatalogUnavailableError, ExternalAccessError
from sqe.execution.external import ExternalSources
from sqe.execution.tvf import GovernedLocations, TvfPolicy, governed_local_paths, resolve_call

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


def _ident(parts: Sequence[str]) -> TableIdent:
    return TableIdent("w", tuple(parts[:-1]), parts[-1])


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


# -- local paths against file:// warehouses ------------------------------------------------------------------


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """``lake/hr/people`` (a governed table's directory, one data file) and ``exports`` beside it."""
    (tmp_path / "lake" / "hr" / "people" / "data").mkdir(parents=True)
    (tmp_path / "lake" / "hr" / "people" / "data" / "f.parquet").write_bytes(b"PAR1")
    (tmp_path / "exports").mkdir()
    return tmp_path / "lake"


def _local_governed(lake: Path, location: str | None = None) -> GovernedLocations:
    catalog = _Catalog(children={(): [("hr",)]}, tables={("hr",): {"people": location or f"file://{lake}/hr/people"}})
    governed = _governed(catalog)
    governed.refresh()
    return governed


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("file:///x/y", {"/x/y"}),
        ("FILE:/x/y", {"/x/y"}),
        ("file://localhost/x/y", {"/x/y"}),
        ("/x/y", {"/x/y"}),
        ("file:///x/a%20b", {"/x/a%20b", "/x/a b"}),
        ("s3://b/x/y", set()),
        ("gs://b/x/y", set()),
    ],
)
def test_local_spellings_of_a_table_location(location: str, expected: set[str]) -> None:
    assert governed_local_paths(location) == expected


@pytest.mark.parametrize("location", ["file://[abc/x", "file://host]/x", "file://[abc]/x", "FILE://[/x"])
def test_a_file_location_that_is_no_url_fails_closed(lake: Path, location: str) -> None:
    """A catalog's answer is untrusted: a location urlsplit refuses is a typed refusal of every file table
    function, never a ValueError, and never a table SQE skips."""
    with pytest.raises(ExternalAccessError, match="cannot check file table function prefixes against the table"):
        governed_local_paths(location)
    with pytest.raises(ExternalAccessError, match=re.escape(f"the table location {location}: ")):
        _local_governed(lake, location)
    config = _config_with_local_prefix(lake.parent / "exports")
    catalog = _Catalog(children={(): [("hr",)]}, tables={("hr",): {"people": location}})
    with pytest.raises(ExternalAccessError, match="cannot check file table function prefixes"):
        ExternalSources(config, catalog, duckdb.connect(), duckdb.connect(), _ident)  # type: ignore[arg-type]


def _config_with_local_prefix(prefix: Path) -> Any:
    """A config whose file table functions may read under ``prefix`` (its catalog is never reached)."""
    overrides = {
        "catalog.uri": "http://127.0.0.1:9",
        "catalog.warehouse": "w",
        "catalog.token": "t",
        "storage.tvf.allowed_local_prefixes": [str(prefix)],
    }
    return load_config(None, overrides=overrides)


@pytest.mark.parametrize("spelling", ["file://{lake}/hr/people", "file:{lake}/hr/people", "{lake}/hr/people/"])
def test_a_local_prefix_over_a_file_warehouse_table_is_refused(lake: Path, spelling: str) -> None:
    governed = _local_governed(lake, spelling.format(lake=lake))
    with pytest.raises(ExternalAccessError, match=r"overlaps the location .* of Iceberg table w\.hr\.people"):
        governed.check_local_prefixes([str(lake)])
    with pytest.raises(ExternalAccessError, match="overlaps the location"):  # inside the table, too
        governed.check_local_prefixes([f"{lake}/hr/people/data"])
    governed.check_local_prefixes([str(lake.parent / "exports"), f"{lake}/hr/people2"])


def test_every_local_file_is_checked_through_symlinks(lake: Path) -> None:
    governed = _local_governed(lake)
    (lake.parent / "exports" / "link").symlink_to(lake / "hr")
    for path in (f"{lake}/hr/people/data/f.parquet", f"{lake.parent}/exports/link/people/data/f.parquet"):
        with pytest.raises(ExternalAccessError, match=r"is inside the location of Iceberg table w\.hr\.people"):
            governed.check_file("read_parquet", path)
    governed.check_file("read_parquet", f"{lake.parent}/exports/f.parquet")


@pytest.mark.parametrize(
    "pattern", ["{lake}/**/*.parquet", "{lake}/hr/people/data/f.parquet", "file://{lake}/hr/people/data/*"]
)
def test_a_local_call_over_a_governed_table_is_refused_before_listing(lake: Path, pattern: str) -> None:
    policy = TvfPolicy((), (str(lake.parent),))
    with pytest.raises(ExternalAccessError, match=r"of Iceberg table w\.hr\.people"):
        resolve_call("read_parquet", "parquet", [pattern.format(lake=lake)], {}, policy, _local_governed(lake), None)


def test_a_session_with_only_local_prefixes_checks_them_at_start(lake: Path) -> None:
    config = _config_with_local_prefix(lake.parent)
    catalog = _Catalog(children={(): [("hr",)]}, tables={("hr",): {"people": f"file://{lake}/hr/people"}})

    def resolve(parts: Sequence[str]) -> TableIdent:
        return TableIdent("w", tuple(parts[:-1]), parts[-1])

    expected = f"prefix {lake.parent} overlaps the location {lake}/hr/people"
    with pytest.raises(ExternalAccessError, match=re.escape(expected)):
        ExternalSources(config, catalog, duckdb.connect(), duckdb.connect(), resolve)  # type: ignore[arg-type]
