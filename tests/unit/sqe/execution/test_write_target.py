"""Writes take where data goes from table properties, never which code runs (``sqe.execution.write_target``).

Against a real local Iceberg catalog that, unlike sqe-catalog, lets a writer set any property."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sqe.catalog.base import TableIdent
from sqe.errors import QueryError
from sqe.execution.write_target import writable_table
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

    def new_metadata_location(self, metadata_file_name):
        return f"{self.table_location}/steered-metadata/{metadata_file_name}"
"""


def _table(provider: LocalProvider, name: str, **properties: str) -> Any:
    return provider.catalogs["wh"].create_table(name, schema=SCHEMA, properties=properties)


def _data_files(table: Any) -> list[str]:
    table.refresh()
    return [task.file.file_path for task in table.scan().plan_files()]


def _written_paths(table: Any) -> list[str]:
    """Every data file, manifest and manifest list of the table's current snapshot."""
    table.refresh()
    snapshot = table.current_snapshot()
    manifests = snapshot.manifests(table.io)
    return [snapshot.manifest_list, *(m.manifest_path for m in manifests), *_data_files(table)]


@pytest.fixture()
def steered(write_provider: LocalProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A table whose properties name a location provider class that steers every file it places."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / f"{PROVIDER_MODULE}.py").write_text(PROVIDER_SOURCE)
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.delitem(sys.modules, PROVIDER_MODULE, raising=False)
    return _table(write_provider, "ns.t", **{"write.py-location-provider.impl": f"{PROVIDER_MODULE}.Provider"})


def _unsteered(table: Any) -> bool:
    paths = _written_paths(table)
    return bool(paths) and all("/steered" not in path for path in paths)


def test_a_location_provider_class_named_by_a_property_never_places_data_files(
    write_provider: LocalProvider, session_factory: Any, steered: Any
) -> None:
    # Found by review: pyiceberg imported and instantiated the class the property names, inside the engine (in
    # `sqe serve`, a process holding the reader's secret), and wrote where it said.
    session = session_factory(write_provider)
    session.sql("INSERT INTO ns.t VALUES (1), (2)")
    session.sql("UPDATE ns.t SET id = 3 WHERE id = 2")
    assert sorted(session.sql("SELECT id FROM ns.t").fetchall()) == [(1,), (3,)]
    assert all(path.startswith(steered.location() + "/data/") for path in _data_files(steered))
    assert _unsteered(steered)


def test_optimize_commits_without_the_named_location_provider(
    write_provider: LocalProvider, session_factory: Any, steered: Any
) -> None:
    # Found by review: OPTIMIZE's commit used the table as loaded, so its manifests went where the class said.
    session = session_factory(write_provider)
    session.sql("INSERT INTO ns.t VALUES (1)")
    session.sql("INSERT INTO ns.t VALUES (2)")
    session.sql("OPTIMIZE ns.t")
    assert steered.refresh().current_snapshot().summary.operation.value == "replace"
    assert sorted(session.sql("SELECT id FROM ns.t").fetchall()) == [(1,), (2,)]
    assert _unsteered(steered)


def test_a_commit_retried_after_a_conflict_keeps_the_rules(write_provider: LocalProvider, steered: Any) -> None:
    # Found by review: pyiceberg's retry refreshes the table, which brought the class-naming property back for
    # the manifests it writes again.
    writer = writable_table(write_provider.load_table(TableIdent("wh", ("ns",), "t")))
    steered.append(pa.table({"id": pa.array([1], pa.int64())}))  # a concurrent commit: the next one conflicts
    writer.append(pa.table({"id": pa.array([2], pa.int64())}))
    assert sorted(row["id"] for row in steered.refresh().scan().to_arrow().to_pylist()) == [1, 2]
    latest = steered.current_snapshot()
    assert latest.parent_snapshot_id is not None  # the engine's append landed on top of the concurrent one
    assert "/steered" not in latest.manifest_list
    assert all(
        "/steered" not in m.manifest_path
        for m in latest.manifests(steered.io)
        if m.added_snapshot_id == latest.snapshot_id
    )


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


@pytest.mark.parametrize("prop", ["write.data.path", "write.metadata.path"])
def test_a_path_outside_the_location_is_refused_whichever_property_sets_it(
    write_provider: LocalProvider, session_factory: Any, prop: str
) -> None:
    victim = _table(write_provider, "ns.victim2")
    table = _table(write_provider, "ns.mine2", **{prop: victim.location() + "/files"})
    with pytest.raises(QueryError, match=rf"{prop.replace('.', '[.]')} .* is outside the table location"):
        session_factory(write_provider).sql("INSERT INTO ns.mine2 VALUES (1)")
    assert _data_files(table) == []


@pytest.mark.parametrize("tail", ["/../victim3/data", "/./data", "/x/../../victim3"])
def test_a_path_with_dot_segments_is_refused(write_provider: LocalProvider, session_factory: Any, tail: str) -> None:
    # Found by review: a file system resolves '..' while prefix matching does not, so "<location>/../other"
    # passed the check on a file:// warehouse and wrote into the neighbouring table.
    table = _table(write_provider, "ns.dots")
    _table(write_provider, "ns.victim3")
    table.transaction().set_properties({"write.data.path": table.location() + tail}).commit_transaction()
    with pytest.raises(QueryError, match=r"has a '\.' or '\.\.' segment"):
        session_factory(write_provider).sql("INSERT INTO ns.dots VALUES (1)")
    assert _data_files(table) == []


def _local(location: str) -> Path:
    return Path(location.removeprefix("file://").removeprefix("file:"))


@pytest.mark.parametrize("victim_kind", ["another table's metadata", "a file of the engine's host"])
@pytest.mark.parametrize("statement", ["INSERT INTO ns.b VALUES (1)", "DELETE FROM ns.b WHERE id = 7"])
def test_a_commit_never_deletes_what_the_metadata_log_names(
    write_provider: LocalProvider, session_factory: Any, tmp_path: Path, victim_kind: str, statement: str
) -> None:
    # Found by review: with write.metadata.delete-after-commit.enabled, pyiceberg deleted every metadata-log entry
    # a commit trimmed, through the engine's FileIO; a table's log is whatever its writers put there.
    catalog = write_provider.catalogs["wh"]
    if victim_kind == "another table's metadata":
        victim = _local(str(_table(write_provider, "ns.victim").metadata_location))
    else:
        victim = tmp_path / "engine-host" / "server.toml"
        victim.parent.mkdir()
        victim.write_text("not a table's")
    own = _table(write_provider, "ns.a", **{"write.metadata.delete-after-commit.enabled": "true"})
    document = json.loads(_local(str(own.metadata_location)).read_text())
    document["properties"]["write.metadata.previous-versions-max"] = "1"
    document["metadata-log"] = [{"metadata-file": f"file://{victim}", "timestamp-ms": 1}]
    crafted = _local(str(own.metadata_location)).parent / "00001-crafted.metadata.json"
    crafted.write_text(json.dumps(document))
    catalog.register_table("ns.b", f"file://{crafted}")
    session = session_factory(write_provider)
    session.sql("INSERT INTO ns.b VALUES (7)")  # the log now holds the victim and the registered metadata
    session.sql(statement)
    assert victim.exists()


def test_a_local_optimize_whose_later_bin_fails_deletes_what_the_earlier_bins_wrote(
    write_provider: LocalProvider, session_factory: Any
) -> None:
    # Found by review: the local rewrite wrote bin after bin and nothing caught a failure, so the files of the
    # bins before the failing one stayed in storage, referenced by nothing (the workers' rewrite deletes them),
    # and the failure reached the user as a raw FileNotFoundError.
    from pyiceberg.expressions import AlwaysTrue

    from sqe.execution.compaction import plan_bins

    catalog = write_provider.catalogs["wh"]
    schema = pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.int64())])
    table = catalog.create_table(("ns", "p"), schema=schema)
    with table.update_spec() as spec:
        spec.add_identity("k")
    for key in (1, 2):
        for value in (10, 20):
            table.append(pa.table({"k": [key], "v": [value]}, schema=schema))
    bins = list(plan_bins(table.refresh(), AlwaysTrue(), 128 << 20))
    assert len(bins) == 2
    before = {p for p in Path(table.location().removeprefix("file://")).rglob("*.parquet")}
    Path(bins[-1][0].file.file_path.removeprefix("file://")).unlink()  # the last bin cannot be read
    session = session_factory(write_provider)
    with pytest.raises(QueryError, match=r"OPTIMIZE of wh\.ns\.p failed: .*No such file"):
        session.sql("OPTIMIZE ns.p")  # typed, as a scan's storage failure is (it was a raw FileNotFoundError)
    after = {p for p in Path(table.location().removeprefix("file://")).rglob("*.parquet")}
    assert after <= before  # nothing the first bin wrote is left behind


def test_a_write_reads_manifest_lists_within_the_limits_after_a_refresh(write_provider: LocalProvider) -> None:
    # pyiceberg refreshes the table on a commit conflict and reads the new snapshot's manifest list: through the
    # refreshed table's FileIO, still within the limits, and named as a manifest list.
    from sqe.errors import ManifestLimitError

    table = _table(write_provider, "ns.refreshed")
    writer = writable_table(write_provider.load_table(TableIdent("wh", ("ns",), "refreshed")))
    table.append(pa.table({"id": [1]}, schema=SCHEMA))  # another writer commits meanwhile
    writer.refresh()
    snapshot = writer.current_snapshot()
    assert snapshot is not None
    assert [m.added_files_count for m in snapshot.manifests(writer.io)] == [1]
    Path(snapshot.manifest_list.removeprefix("file://")).write_bytes(b"not an Avro file")
    with pytest.raises(ManifestLimitError) as raised:
        snapshot.manifests(writer.io)
    assert str(raised.value) == (
        "cannot commit to wh.ns.refreshed: a manifest list of the table is not an Avro container file"
    )


def test_a_write_refused_on_its_retry_by_a_manifest_past_the_limits_deletes_its_data_files(
    write_provider: LocalProvider,
) -> None:
    # Found by review: after a conflict pyiceberg refreshes and reads the new head's manifest list; refused there,
    # the commit had not landed (the conflict said so) but its data file stayed, referenced by nothing.
    from sqe.errors import ManifestLimitError
    from sqe.execution.commit import append_rows

    table = _table(write_provider, "ns.retried")
    loaded = write_provider.load_table(TableIdent("wh", ("ns",), "retried"))
    table.append(pa.table({"id": [1]}, schema=SCHEMA))  # a concurrent commit: the engine's first attempt conflicts
    concurrent = table.refresh().current_snapshot()
    assert concurrent is not None
    Path(concurrent.manifest_list.removeprefix("file://")).write_bytes(b"not an Avro file")
    data = Path(table.location().removeprefix("file://")) / "data"
    before = set(data.rglob("*.parquet"))
    with pytest.raises(ManifestLimitError) as raised:
        append_rows(loaded, pa.table({"id": [2]}, schema=SCHEMA))
    # named as the refreshed table's manifest list (the retry's producer kept the CommitIO of the first attempt)
    assert (
        str(raised.value)
        == "cannot commit to wh.ns.retried: a manifest list of the table is not an Avro container file"
    )
    assert set(data.rglob("*.parquet")) == before
    assert table.refresh().current_snapshot() == concurrent
