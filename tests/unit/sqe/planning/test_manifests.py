"""Planning's manifest reader returns exactly pyiceberg's entries, with one reader setup per manifest schema."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.avro.file import AvroFileHeader
from pyiceberg.avro.reader import Reader
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo, GreaterThanOrEqual
from pyiceberg.manifest import ManifestFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from sqe._lru import LRUCache
from sqe.planning import manifests as planning
from sqe.planning.manifests import ENTRY_READERS, PlanningManifest, planning_manifests

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "tag", StringType(), required=False),
)


@pytest.fixture
def table(tmp_path: Path) -> Table:
    """A partitioned local table with three appends (three manifests) and one delete (a deleted entry)."""
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="tag"))
    created = catalog.create_table("ns.t", schema=SCHEMA, partition_spec=spec)
    for start, tag in ((0, "a"), (10, "b"), (20, "c")):
        ids = pa.array(range(start, start + 10), pa.int64())
        created.append(pa.table({"id": ids, "tag": pa.array([tag] * 10)}))
    created.delete(EqualTo("tag", "b"))
    return catalog.load_table("ns.t")


def _manifests(table: Table) -> list[ManifestFile]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return snapshot.manifests(table.io)


def test_entries_match_pyiceberg_exactly(table: Table) -> None:
    manifests = _manifests(table)
    assert len(manifests) >= 2
    for original, planned in zip(manifests, planning_manifests(manifests), strict=True):
        assert isinstance(planned, PlanningManifest)
        assert planned == original and planned._data == original._data
        for discard in (True, False):
            ours = planned.fetch_manifest_entry(table.io, discard_deleted=discard)
            theirs = original.fetch_manifest_entry(table.io, discard_deleted=discard)
            assert [e._data for e in ours] == [e._data for e in theirs]
            assert [e.data_file.record_count for e in ours] == [e.data_file.record_count for e in theirs]


def test_deleted_entries_are_discarded_like_pyiceberg(table: Table) -> None:
    kept = [e for m in planning_manifests(_manifests(table)) for e in m.fetch_manifest_entry(table.io)]
    every = [
        e
        for m in planning_manifests(_manifests(table))
        for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
    ]
    assert sum(e.data_file.record_count for e in kept) == 20  # tag b's file is deleted
    assert len(every) > len(kept)


def test_one_reader_per_schema_text(table: Table) -> None:
    ENTRY_READERS.clear()
    for manifest in planning_manifests(_manifests(table)):
        manifest.fetch_manifest_entry(table.io)
    assert len(ENTRY_READERS) == 1  # every manifest of this table was written with the same schema and spec


def test_kept_readers_are_bounded(table: Table) -> None:
    readers: LRUCache[str, Reader] = LRUCache(2)
    [manifest] = planning_manifests(_manifests(table))[:1]
    with planning._ManifestAvroFile(table.io.new_input(manifest.manifest_path)) as avro:
        header = avro.header
    for i in range(4):
        meta = dict(header.meta)
        meta["avro.schema"] = meta["avro.schema"] + " " * i  # same schema, a different text
        planning._entry_reader(AvroFileHeader(header.magic, meta, header.sync), readers)
    assert len(readers) == 2


def test_a_header_without_schema_fails_like_pyiceberg() -> None:
    header = AvroFileHeader(b"Obj\x01", {}, b"\x00" * 16)
    with pytest.raises(ValueError, match="No schema found"):
        planning._entry_reader(header, LRUCache(1))


def test_scan_plans_the_same_files_with_and_without_a_filter(table: Table) -> None:
    """pyiceberg's own pruning runs on the planning manifests: the same tasks as its own planner finds."""
    for row_filter in (None, GreaterThanOrEqual("id", 20), EqualTo("tag", "a")):
        scan = table.scan() if row_filter is None else table.scan(row_filter=row_filter)
        snapshot = scan.snapshot()
        assert snapshot is not None
        ours = scan._manifest_planner.plan_files(planning_manifests(snapshot.manifests(scan.io)))
        theirs = table.scan() if row_filter is None else table.scan(row_filter=row_filter)
        assert sorted(t.file.file_path for t in ours) == sorted(t.file.file_path for t in theirs.plan_files())
        assert len(list(ours)) >= 1


def test_cold_runs_resolve_readers_again(table: Table) -> None:
    """clear_process_caches (benchmarks' cold runs) drops the kept readers like every other per-process cache."""
    from sqe.execution.cache import clear_process_caches

    planning_manifests(_manifests(table))[0].fetch_manifest_entry(table.io)
    assert len(ENTRY_READERS) == 1
    clear_process_caches()
    assert len(ENTRY_READERS) == 0


def _table_of(catalog: SqlCatalog, name: str, spec: PartitionSpec, version: str, start: int) -> Table:
    created = catalog.create_table(
        f"ns.{name}", schema=SCHEMA, partition_spec=spec, properties={"format-version": version}
    )
    for offset, tag in ((0, "x"), (5, "y")):
        ids = pa.array(range(start + offset, start + offset + 5), pa.int64())
        created.append(pa.table({"id": ids, "tag": pa.array([f"{name}-{tag}"] * 5)}))
    return catalog.load_table(f"ns.{name}")


@pytest.fixture
def tables(tmp_path: Path) -> list[Table]:
    """Tables sharing the kept readers: same schema and spec in v1 and v2 (partition values and sequence numbers
    differ), the same schema under another spec (another source column and partition field id), and unpartitioned."""
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    by_tag = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="tag"))
    by_id = PartitionSpec(PartitionField(source_id=1, field_id=1001, transform=IdentityTransform(), name="b"))
    return [
        _table_of(catalog, "v2a", by_tag, "2", 0),
        _table_of(catalog, "v2b", by_tag, "2", 100),
        _table_of(catalog, "v1a", by_tag, "1", 200),
        _table_of(catalog, "v1b", by_tag, "1", 300),
        _table_of(catalog, "by_id", by_id, "2", 400),
        _table_of(catalog, "plain", PartitionSpec(), "2", 500),
    ]


def _entries(manifests: list[ManifestFile], table: Table) -> list[tuple[object, ...]]:
    return [
        (m.manifest_path, tuple(e._data), tuple(e.data_file.partition._data), e.data_file.file_path)
        for m in manifests
        for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
    ]


def test_shared_readers_decode_each_tables_manifests_exactly(tables: list[Table]) -> None:
    """Readers are shared by schema text across tables and format versions; every entry (partition values,
    sequence numbers, snapshot ids, paths) is still exactly pyiceberg's own for its table."""
    ENTRY_READERS.clear()
    for _ in range(2):  # the second round reads every manifest with an already-kept reader
        for table in tables:
            expected = _entries(_manifests(table), table)
            assert _entries(planning_manifests(_manifests(table)), table) == expected
            assert {p for _, _, p, _ in expected} != {()} or table.name()[-1] == "plain"
    assert 2 <= len(ENTRY_READERS) <= len(tables)


def test_concurrent_planning_of_several_tables_matches_pyiceberg(tables: list[Table]) -> None:
    ENTRY_READERS.clear()
    expected = {table.name(): _entries(_manifests(table), table) for table in tables}
    failures: list[str] = []
    barrier = threading.Barrier(len(tables))

    def plan(table: Table) -> None:
        barrier.wait()
        for _ in range(5):
            try:
                if _entries(planning_manifests(_manifests(table)), table) != expected[table.name()]:
                    failures.append(f"{table.name()}: other entries")
            except Exception as exc:  # a thread's error must fail the test, not only warn
                failures.append(f"{table.name()}: {exc!r}")

    threads = [threading.Thread(target=plan, args=(table,)) for table in tables]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
