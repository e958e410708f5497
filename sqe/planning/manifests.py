"""Manifest reading for planning: pyiceberg's own Avro decoding, with the per-file setup done once per schema.

A cold plan reads one manifest per append, and each read used to pay a fixed setup before decoding a single
entry: parsing the Avro header's schema JSON, converting it to an Iceberg schema and resolving a reader tree
against pyiceberg's manifest-entry read schema. Every manifest a writer produces with the same table schema
and partition spec carries the same schema text, so SQE resolves that reader once per distinct schema text and
reuses it (readers are immutable and hold no per-read state, so threads share them). Decoding itself is
pyiceberg's compiled decoder, each read checked against its buffer's end (``sqe.planning.avro_decoder``): the
entries, their order and every field are exactly what ``ManifestFile.fetch_manifest_entry`` returns.

The manifests handed to pyiceberg's planner are :class:`PlanningManifest` copies of the manifest-list records,
so pyiceberg's partition, metrics and sequence-number pruning and its delete-file matching run as before.

Deletion vectors (format v3) of several data files share one Puffin file, each at its own offset. pyiceberg
tells files apart by path alone, so its delete-file matching kept one of them (the first read) for every data
file of the partition: the others' entries (offset, size, cardinality) were lost to the checks that hold a blob
to its entry. Entries are read as :class:`PlanningDataFile` (told apart by path and content offset), and
:func:`plan_tasks` keeps on each task only the delete files that may apply to its data file: one naming
another data file (``referenced_data_file``, which the spec says all its deletes reference) does not.

Avro has no end marker: a manifest cut at a block boundary decodes fewer entries, without error. Its
manifest-list entry counts them, though (the files and rows of each status; optional in format v1, required
since v2): :func:`counted_entries` refuses a manifest written since v2 (a sequence number above 0) whose live
(added or existing) entries are not those counts,
with :class:`sqe.planning.avro_decoder.MisstatedAvroError` (planning's "does not decode"). Counts a manifest list
lacks are not checked, nor are its DELETED counts: no plan reads those entries, and real writers misstate them
(iceberg-rust adds each rewrite's removals to the counts it was handed, writing no DELETED entries).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyiceberg.avro.file import META_SCHEMA, AvroFile, AvroFileHeader
from pyiceberg.avro.resolver import construct_reader, resolve_reader
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    MANIFEST_ENTRY_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    _inherit_from_manifest,
)
from pyiceberg.table import FileScanTask

from sqe._lru import LRUCache
from sqe.planning.avro_decoder import MisstatedAvroError, bounded_decoder

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from enum import Enum

    from pyiceberg.avro.reader import Reader
    from pyiceberg.io import FileIO
    from pyiceberg.table import DataScan
    from pyiceberg.typedef import StructProtocol

__all__ = [
    "PlanningDataFile",
    "PlanningManifest",
    "check_entry_counts",
    "content_offset",
    "content_size",
    "counted_entries",
    "own_deletes",
    "plan_tasks",
    "planning_manifests",
    "referenced_data_file",
]

_SCHEMA_KEY = "avro.schema"
# pyiceberg reads entries as format v2's (DEFAULT_READ_VERSION); v3's adds a deletion vector's referenced data
# file, content offset and size (all optional, after v2's fields), by which its blob is checked when read.
_ENTRY_READ_SCHEMA = MANIFEST_ENTRY_SCHEMAS[3]
_V3_FIELDS = tuple(field.name for field in DATA_FILE_TYPE[3].fields)
_REFERENCED, _OFFSET, _SIZE = (
    _V3_FIELDS.index(name) for name in ("referenced_data_file", "content_offset", "content_size_in_bytes")
)


class PlanningDataFile(DataFile):
    """pyiceberg's DataFile, told apart by its path and (a deletion vector's) content offset, not its path alone:
    the deletion vectors of several data files lie in one Puffin file, and a set keyed by path kept one."""

    __slots__ = ()

    def __hash__(self) -> int:
        # pyiceberg's own (the path's): sets mixing these and pyiceberg's records (a commit's) still find them
        return hash(self.file_path)

    def __eq__(self, other: object) -> bool:
        # Python asks the subclass first, so ``DataFile == PlanningDataFile`` is this too
        if not isinstance(other, DataFile):
            return False
        return (other.file_path, content_offset(other)) == (self.file_path, content_offset(self))


def content_offset(file: DataFile) -> int | None:
    """A v3 delete-file entry's ``content_offset`` (None when read without the v3 fields, or not stated)."""
    offset = file[_OFFSET] if len(file) == len(_V3_FIELDS) else None
    return offset if isinstance(offset, int) else None


def content_size(file: DataFile) -> int | None:
    """A v3 delete-file entry's ``content_size_in_bytes`` (None when read without the v3 fields, or not stated)."""
    size = file[_SIZE] if len(file) == len(_V3_FIELDS) else None
    return size if isinstance(size, int) else None


def referenced_data_file(file: DataFile) -> str | None:
    """A v3 delete-file entry's ``referenced_data_file``: the one data file all its deletes reference."""
    referenced = file[_REFERENCED] if len(file) == len(_V3_FIELDS) else None
    return referenced if isinstance(referenced, str) else None


# The same record classes (the data file's told apart by content offset too) and enums pyiceberg reads entries into.
_ENTRY_TYPES: dict[int, Callable[..., StructProtocol]] = {-1: ManifestEntry, 2: PlanningDataFile}
_ENTRY_ENUMS: dict[int, Callable[..., Enum]] = {0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent}
_HEADER_READER = construct_reader(META_SCHEMA, {-1: AvroFileHeader})
MAX_KEPT_READERS = 64  # distinct (schema, spec) texts; one table usually has a handful


# Resolved manifest-entry readers by the writer's schema text (the engine's one bounded, thread-safe LRU).
ENTRY_READERS: LRUCache[str, Reader] = LRUCache(MAX_KEPT_READERS)


def _entry_reader(header: AvroFileHeader, kept: LRUCache[str, Reader] = ENTRY_READERS) -> Reader:
    text = header.meta.get(_SCHEMA_KEY)
    if text is None:
        raise ValueError("No schema found in Avro file headers")  # pyiceberg's own message for this
    reader = kept.get(text)
    if reader is None:
        reader = resolve_reader(header.get_schema(), _ENTRY_READ_SCHEMA, _ENTRY_TYPES, _ENTRY_ENUMS)
        kept.put(text, reader)
    return reader


class _ManifestAvroFile(AvroFile[ManifestEntry]):
    """pyiceberg's Avro file reader with the reader tree taken from :data:`ENTRY_READERS`."""

    def __enter__(self) -> _ManifestAvroFile:
        with self.input_file.open() as stream:
            self.decoder = bounded_decoder(stream.read())
        self.header = _HEADER_READER.read(self.decoder)
        self.read_schema = _ENTRY_READ_SCHEMA
        self.reader = _entry_reader(self.header)
        return self


def _stated_counts(manifest: ManifestFile) -> dict[ManifestEntryStatus, tuple[int | None, int | None]]:
    """The files and rows the manifest-list entry states for each live entry status (None: not stated). Not the
    DELETED ones: no plan reads those entries, and writers misstate their counts (iceberg-rust's rewrites keep
    adding to them), which Spark, Trino and pyiceberg never check."""
    return {
        ManifestEntryStatus.ADDED: (manifest.added_files_count, manifest.added_rows_count),
        ManifestEntryStatus.EXISTING: (manifest.existing_files_count, manifest.existing_rows_count),
    }


def check_entry_counts(manifest: ManifestFile, entries: list[ManifestEntry]) -> None:
    """Refuse ``entries`` (all of the manifest's, deleted ones too) unless each live status has as many entries,
    and as many rows in them, as ``manifest`` (its manifest-list entry) states; a count not stated is not
    checked, nor are the counts of a manifest written under format v1 (its sequence number is 0): v1 makes them
    optional, and v1 writers misstate them (ClickHouse writes the table's total as every manifest's existing
    count), which other engines never check."""
    if not manifest.sequence_number:
        return  # written under format v1 (sequence number 0), whose counts are optional and misstated in the wild
    files = dict.fromkeys(ManifestEntryStatus, 0)
    rows = dict.fromkeys(ManifestEntryStatus, 0)
    for entry in entries:
        files[entry.status] += 1
        rows[entry.status] += entry.data_file.record_count
    for status, (stated_files, stated_rows) in _stated_counts(manifest).items():
        if stated_files is not None and stated_files != files[status]:
            raise _miscounted(f"{files[status]} {status.name} entries", stated_files)
        if stated_rows is not None and stated_rows != rows[status]:
            raise _miscounted(f"{rows[status]} rows in its {status.name} entries", stated_rows)


def _miscounted(held: str, stated: int) -> MisstatedAvroError:
    return MisstatedAvroError(f"a manifest holds {held}, its manifest list states {stated}")


def counted_entries(manifest: ManifestFile, entries: list[ManifestEntry], discard_deleted: bool) -> list[ManifestEntry]:
    """``entries`` (all of the manifest's) once :func:`check_entry_counts` passes them; without the deleted ones
    when ``discard_deleted``."""
    check_entry_counts(manifest, entries)
    if not discard_deleted:
        return entries
    return [entry for entry in entries if entry.status != ManifestEntryStatus.DELETED]


class PlanningManifest(ManifestFile):
    """A manifest-list record whose entries are read with a kept reader; otherwise pyiceberg's ManifestFile."""

    def fetch_manifest_entry(self, io: FileIO, discard_deleted: bool = True) -> list[ManifestEntry]:
        with _ManifestAvroFile(io.new_input(self.manifest_path)) as entries:
            return counted_entries(self, [_inherit_from_manifest(entry, self) for entry in entries], discard_deleted)


def planning_manifests(manifests: Iterable[ManifestFile]) -> list[ManifestFile]:
    """The same manifest-list records as :class:`PlanningManifest` (same fields, same order)."""
    return [PlanningManifest(*manifest._data) for manifest in manifests]


def own_deletes(task: FileScanTask) -> FileScanTask:
    """``task`` without the delete files naming another data file (``referenced_data_file``): pyiceberg matches a
    delete file without path bounds to every data file of its partition."""
    path = task.file.file_path
    kept = {d for d in task.delete_files if referenced_data_file(d) in (None, path)}
    if len(kept) == len(task.delete_files):
        return task
    return FileScanTask(task.file, delete_files=kept, residual=task.residual)


def plan_tasks(scan: DataScan) -> tuple[FileScanTask, ...]:
    """pyiceberg's local planning of ``scan`` with manifests read as :func:`planning_manifests` (v3 entries, each
    deletion vector its own delete file), each task holding only the delete files that may apply to it."""
    snapshot = scan.snapshot()
    if snapshot is None:
        return ()
    manifests = planning_manifests(snapshot.manifests(scan.io))
    return tuple(own_deletes(task) for task in scan._manifest_planner.plan_files(manifests))
