"""Writes take where data goes from table properties, never which code runs (``sqe.execution.write_target``).

Against a real local Iceberg catalog that, unlike sqe-catalog, lets a writer set any property."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sqe.errors import QueryError
from tests.unit.sqe.iceberg_local import LocalProvider

SCHEMA = pa.schema([("id", pa.int64())])
PROVIDER_MODULE = "sqe_test_location_provider"
# A provider that steers data files into "steered/" (the in-process SqlCatalog also uses it for its metadata
# files, as a REST catalog would on its side: only the engine's data-file writes must not follow it).
PROVIDER_SOURCE = """
from pyiceberg.table.locations import SimpleLocationProvider

class Provider(SimpleLocationProvider):
    def new_data_location(self, data_file_name, partition_key=None):
        return f"{self.table_location}/steered/{data_file_name}"
"""


def _table(provider: LocalProvider, name: str, **properties: str) -> Any:
    return provider.catalogs["wh"].create_table(name, schema=SCHEMA, properties=properties)


def _data_files(table: Any) -> list[str]:
    table.refresh()
    return [task.file.file_path for task in table.scan().plan_files()]


def test_a_location_provider_class_named_by_a_property_never_places_data_files(
    write_provider: LocalProvider, session_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by review: pyiceberg imported and instantiated the class the property names, inside the engine (in
    # `sqe serve`, a process holding the reader's secret), and wrote where it said.
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / f"{PROVIDER_MODULE}.py").write_text(PROVIDER_SOURCE)
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.delitem(sys.modules, PROVIDER_MODULE, raising=False)
    table = _table(write_provider, "ns.t", **{"write.py-location-provider.impl": f"{PROVIDER_MODULE}.Provider"})
    session = session_factory(write_provider)
    session.sql("INSERT INTO ns.t VALUES (1), (2)")
    session.sql("UPDATE ns.t SET id = 3 WHERE id = 2")
    assert sorted(session.sql("SELECT id FROM ns.t").fetchall()) == [(1,), (3,)]
    assert all(path.startswith(table.location() + "/data/") for path in _data_files(table))


def test_a_data_path_inside_the_table_location_is_followed(write_provider: LocalProvider, session_factory: Any) -> None:
    table = _table(write_provider, "ns.inside")
    table.transaction().set_properties({"write.data.path": f"{table.location()}/elsewhere"}).commit_transaction()
    session_factory(write_provider).sql("INSERT INTO ns.inside VALUES (1)")
    assert [path.rsplit("/", 2)[-2] for path in _data_files(table)] == ["elsewhere"]


def test_a_data_path_outside_the_table_location_is_refused_without_a_vended_credential(
    write_provider: LocalProvider, session_factory: Any
) -> None:
    # Found by review: write.data.path sent new files into another table's directory with SQE's own key.
    victim = _table(write_provider, "ns.victim")
    table = _table(write_provider, "ns.mine", **{"write.data.path": victim.location() + "/data"})
    session = session_factory(write_provider)
    with pytest.raises(QueryError, match=r"write\.data\.path .* is outside the table location"):
        session.sql("INSERT INTO ns.mine VALUES (1)")
    assert _data_files(table) == [] and _data_files(victim) == []
    assert not any(Path(victim.location().removeprefix("file://"), "data").glob("*"))
