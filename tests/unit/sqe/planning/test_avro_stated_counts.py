"""Avro has no end marker: what a manifest list or manifest states about its own records is checked.

A manifest cut at a block boundary, or a block stating fewer records than it holds, used to decode fewer records
without any error: a plan then silently missed data files (or delete files). Now a block's records must take
all of its bytes (``sqe.planning.pyiceberg_patches.EndCheckedBlock``), a block of no records must hold nothing
and be the last (``sqe.planning.avro_limits``), and a manifest's entries must be those its manifest-list entry
counts, when it counts them (``sqe.planning.manifests.check_entry_counts``). Real files written by pyiceberg,
then corrupted on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyiceberg.avro.file as avro_file
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import ManifestFile, read_manifest_list
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from sqe.errors import ManifestLimitError, QueryError
from sqe.planning import pyiceberg_patches
from sqe.planning.avro_decoder import MisstatedAvroError, bounded_decoder
from sqe.planning.avro_limits import UNDECODABLE, UNDECODED, BoundedManifestIO, ManifestBounds, bounded_table
from sqe.planning.manifests import PlanningManifest
from tests.helpers.avro import reblocked
from tests.unit.sqe.iceberg_local import NUMBERS_SCHEMA, local_catalog, numbers_batch

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyiceberg.table import Table

    from sqe.session import Session
    from tests.unit.sqe.iceberg_local import LocalProvider

FILES = 3  # one data file per row (a 1-byte target size): one manifest of three entries, one block each


def _table(tmp_path: Path, appends: int = 1) -> Table:
    catalog = local_catalog(tmp_path, "wh")
    catalog.create_namespace("ns")
    properties = {"write.avro.compression-codec": "null", "write.target-file-size-bytes": "1"}
    table = catalog.create_table("ns.t", schema=NUMBERS_SCHEMA, properties=properties)
    for start in range(0, appends * FILES, FILES):
        table.append(pa.Table.from_batches(numbers_batch(start, FILES).to_batches(max_chunksize=1)))
    return table


def _local(location: str) -> Path:
    return Path(location.removeprefix("file://"))


def _manifest(table: Table) -> ManifestFile:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    [manifest] = snapshot.manifests(table.io)
    return manifest


def _rewrite(location: str, change: Callable[[list[tuple[int, bytes]]], list[tuple[int, bytes]]]) -> None:
    path = _local(location)
    path.write_bytes(reblocked(path.read_bytes(), change))


def _reads(manifest: ManifestFile) -> dict[str, object]:
    """Each way SQE reads a manifest's entries: pyiceberg's (the catalog's planning, commits, metadata tables)
    and planning's kept reader."""
    io = BoundedManifestIO(PyArrowFileIO(), ManifestBounds())
    return {
        "pyiceberg": lambda: manifest.fetch_manifest_entry(io),
        "planning": lambda: PlanningManifest(*manifest._data).fetch_manifest_entry(io),
    }


@pytest.mark.parametrize("reader", ["pyiceberg", "planning"])
def test_a_manifest_cut_at_a_block_boundary_is_refused(tmp_path: Path, reader: str) -> None:
    # Before: the two entries left decoded without error, and the plan missed the third data file.
    table = _table(tmp_path)
    manifest = _manifest(table)
    assert manifest.added_files_count == FILES and len(_reads(manifest)[reader]()) == FILES  # type: ignore[operator]
    _rewrite(manifest.manifest_path, lambda blocks: blocks[:-1])
    with pytest.raises(MisstatedAvroError) as raised:
        _reads(manifest)[reader]()  # type: ignore[operator]
    assert str(raised.value) == f"a manifest holds {FILES - 1} ADDED entries, its manifest list states {FILES}"
    assert isinstance(raised.value, UNDECODABLE)  # planning's "does not decode" (engine QueryError, catalog 422)


def test_a_plan_of_a_table_whose_manifest_lost_a_block_is_refused(tmp_path: Path) -> None:
    table = _table(tmp_path)
    assert len(list(bounded_table(table, "cannot plan").scan().plan_files())) == FILES
    _rewrite(_manifest(table).manifest_path, lambda blocks: blocks[1:])
    with pytest.raises(MisstatedAvroError):
        list(bounded_table(table, "cannot plan").scan().plan_files())


def test_optimize_of_a_table_whose_manifest_lost_a_block_is_a_query_error(
    write_provider: LocalProvider, session_factory: Callable[..., Session]
) -> None:
    # Found by review: OPTIMIZE plans its bins with pyiceberg's own planner, outside the scan's error translation,
    # so the refusal came out as a raw MisstatedAvroError (an EOFError or ResolveError likewise).
    properties = {"write.avro.compression-codec": "null", "write.target-file-size-bytes": "1"}
    table = write_provider.catalogs["wh"].create_table("ns.t", schema=NUMBERS_SCHEMA, properties=properties)
    table.append(pa.Table.from_batches(numbers_batch(0, FILES).to_batches(max_chunksize=1)))
    _rewrite(_manifest(table).manifest_path, lambda blocks: blocks[:-1])
    with pytest.raises(QueryError) as raised:
        session_factory(write_provider).sql("OPTIMIZE wh.ns.t")
    assert str(raised.value) == (
        f"cannot plan OPTIMIZE of wh.ns.t: {UNDECODED}: "
        f"a manifest holds {FILES - 1} ADDED entries, its manifest list states {FILES}"
    )


@pytest.mark.parametrize(
    ("field", "stated"),
    [(7, "files"), (8, "files"), (10, "rows"), (11, "rows")],
    ids=["added-files", "existing-files", "added-rows", "existing-rows"],
)
def test_each_status_count_of_the_manifest_list_is_checked(tmp_path: Path, field: int, stated: str) -> None:
    manifest = _manifest(_table(tmp_path))
    miscounted = ManifestFile(*manifest._data)
    miscounted._data[field] += 1  # the manifest list's count, one off
    for read in _reads(miscounted).values():
        with pytest.raises(MisstatedAvroError, match=f"its manifest list states {manifest._data[field] + 1}$"):
            read()  # type: ignore[operator]


@pytest.mark.parametrize("field", [9, 12], ids=["deleted-files", "deleted-rows"])
def test_the_deleted_counts_of_the_manifest_list_are_not_held_against_the_manifest(tmp_path: Path, field: int) -> None:
    # Found by review: a manifest whose manifest-list entry overstated its DELETED entries was refused, though a
    # plan reads none of them. Real writers state such counts: iceberg-rust (JanKaul/iceberg-rust#409) adds each
    # rewrite's removals to the deleted counts it was handed and writes no DELETED entries (a live table: two
    # entries, "deleted=62"); Spark, Trino and pyiceberg read those tables. A manifest cut at a block boundary
    # still fails on the live entries it lost (the tests above).
    manifest = _manifest(_table(tmp_path))
    overstated = ManifestFile(*manifest._data)
    overstated._data[field] = manifest._data[field] + 62
    for read in _reads(overstated).values():
        assert len(read()) == FILES  # type: ignore[operator,arg-type]


def test_the_counts_of_a_manifest_written_under_format_v1_are_not_checked(tmp_path: Path) -> None:
    # v1 makes the counts optional and v1 writers misstate them (ClickHouse writes the table's total as every
    # manifest's existing count); a manifest written under v1 has sequence number 0, one written since v2 above 0.
    manifest = _manifest(_table(tmp_path))
    miscounted = ManifestFile(*manifest._data)
    miscounted._data[8] += 40  # existing files
    miscounted._data[4] = 0  # sequence number: written under v1
    for read in _reads(miscounted).values():
        assert len(read()) == FILES  # type: ignore[operator,arg-type]


def test_a_manifest_list_without_counts_is_not_checked(tmp_path: Path) -> None:
    # Format v1 manifest lists may omit the counts: then only what decodes can be read (fail-safe when stated).
    table = _table(tmp_path)
    manifest = _manifest(table)
    _rewrite(manifest.manifest_path, lambda blocks: blocks[:-1])
    uncounted = ManifestFile(*manifest._data)
    for field in range(7, 13):
        uncounted._data[field] = None
    for read in _reads(uncounted).values():
        assert len(read()) == FILES - 1  # type: ignore[operator,arg-type]


def test_a_block_stating_fewer_records_than_it_holds_is_refused(tmp_path: Path) -> None:
    # Before: a manifest list of two manifests whose one block said 1 read as one manifest, and the plan missed
    # the other's data files; nothing counts a manifest list's records.
    table = _table(tmp_path, appends=2)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    io = BoundedManifestIO(PyArrowFileIO(), ManifestBounds())
    assert len(list(read_manifest_list(io.new_input(snapshot.manifest_list)))) == 2
    _rewrite(snapshot.manifest_list, lambda blocks: [(1, data) for _count, data in blocks])
    with pytest.raises(MisstatedAvroError, match="an Avro block holds more bytes than its stated records take"):
        list(read_manifest_list(io.new_input(snapshot.manifest_list)))


EMPTY_BLOCKS = {
    # pyiceberg stops reading at a block of no records (or fewer): the blocks after it were dropped
    "no-records-then-more": lambda blocks: [(0, b""), *blocks],
    "negative-then-more": lambda blocks: [(-1, b""), *blocks],
    "negative-last": lambda blocks: [*blocks, (-1, b"")],
    # and never decodes its bytes
    "no-records-holding-bytes": lambda blocks: [*blocks[:-1], (0, blocks[-1][1])],
}


@pytest.mark.parametrize("case", list(EMPTY_BLOCKS))
def test_a_block_of_no_records_holding_bytes_or_before_others_is_refused(tmp_path: Path, case: str) -> None:
    table = _table(tmp_path)
    manifest = _manifest(table)
    _rewrite(manifest.manifest_path, EMPTY_BLOCKS[case])
    with pytest.raises(ManifestLimitError) as raised:
        ManifestBounds().checked("s3://b/m.avro", _local(manifest.manifest_path).read_bytes())
    assert str(raised.value).endswith("a manifest list or manifest of the table is not an Avro container file")


def test_a_last_block_of_no_records_and_no_bytes_still_reads(tmp_path: Path) -> None:
    # pyiceberg writes one for a snapshot of no manifests (a manifest list block of no records).
    table = _table(tmp_path)
    manifest = _manifest(table)
    _rewrite(manifest.manifest_path, lambda blocks: [*blocks, (0, b"")])
    for read in _reads(manifest).values():
        assert len(read()) == FILES  # type: ignore[operator,arg-type]


def test_install_puts_every_patch_in_place_once() -> None:
    pyiceberg_patches.install()
    patched = (avro_file.new_decoder, avro_file.Block, AvroSchemaConversion._convert_logical_type)
    fetch = ManifestFile.fetch_manifest_entry
    pyiceberg_patches.install()  # again: nothing changes, nothing is wrapped twice
    assert (avro_file.new_decoder, avro_file.Block, AvroSchemaConversion._convert_logical_type) == patched
    assert ManifestFile.fetch_manifest_entry is fetch
    assert avro_file.new_decoder is bounded_decoder and avro_file.Block is pyiceberg_patches.EndCheckedBlock
    assert pyiceberg_patches.installed()


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        (avro_file, "new_decoder"),
        (avro_file, "Block"),
        (AvroSchemaConversion, "_convert_logical_type"),
        (ManifestFile, "fetch_manifest_entry"),
    ],
)
def test_install_refuses_a_pyiceberg_without_an_internal_it_patches(
    monkeypatch: pytest.MonkeyPatch, owner: object, name: str
) -> None:
    # pyiceberg's internals, as a release that moved one would have them (monkeypatch restores them after).
    from pyiceberg.avro.decoder import new_decoder

    monkeypatch.setattr(avro_file, "new_decoder", new_decoder)  # pyiceberg's own: nothing installed yet
    monkeypatch.delattr(owner, name)
    with pytest.raises(ImportError, match="SQE cannot check its Avro reads"):
        pyiceberg_patches.install()
    if name != "new_decoder":
        assert avro_file.new_decoder is new_decoder  # checked before anything is changed
