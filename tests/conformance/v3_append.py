"""Appending rows to a format-version 3 table from the conformance harness (pyiceberg 0.12 writes only v1/v2).

One append is one Parquet data file (pyarrow, nanosecond columns kept at full precision), one v3 data manifest
and one v3 manifest list (Avro, through pyiceberg's own Avro writer), committed as ``add-snapshot`` +
``set-snapshot-ref`` through the catalog's REST commit endpoint. Row lineage follows the Iceberg v3 spec: the
snapshot's ``first-row-id`` is the table's ``next-row-id`` and ``added-rows`` counts the rows it assigns ids to;
the new manifest's ``first_row_id`` (manifest list field 520) is the snapshot's ``first-row-id``; the data file's
own ``first_row_id`` (field 142) stays null, so readers inherit it from the manifest. Column statistics are exact:
value and null counts for every top-level primitive column, lower/upper bounds only for integer and temporal
columns (computed from the Arrow values themselves, never through a datetime, so nanoseconds stay exact); the spec
lets a writer omit the others.
"""

from __future__ import annotations

import io
import uuid
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.conversions import to_bytes
from pyiceberg.io import OutputFile
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import (
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestListWriter,
    ManifestWriterV2,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetSnapshotRefUpdate,
)
from pyiceberg.typedef import Record, TableVersion
from pyiceberg.types import (
    DateType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
)

__all__ = ["append_v3"]

V3: TableVersion = 3
_AVRO_CODEC: AvroCompressionCodec = "deflate"
# Types whose Arrow values are the Iceberg bound's integer directly (days, micros or nanos since the epoch).
_BOUNDED_TYPES = (
    IntegerType,
    LongType,
    DateType,
    TimestampType,
    TimestamptzType,
    TimestampNanoType,
    TimestamptzNanoType,
)


class ManifestWriterV3(ManifestWriterV2):
    """A v3 data manifest: the v3 ``data_file`` struct in the file; fields the in-memory (v2) entry lacks, such as
    ``first_row_id``, are written as null (an added file inherits its first row id from the manifest)."""

    @property
    def version(self) -> TableVersion:
        return V3


class ManifestListWriterV3(ManifestListWriter):
    """A v3 manifest list: assigns the commit's sequence number and each new data manifest's ``first_row_id``."""

    def __init__(
        self,
        output_file: OutputFile,
        snapshot_id: int,
        parent_snapshot_id: int | None,
        sequence_number: int,
        first_row_id: int,
    ) -> None:
        super().__init__(
            format_version=V3,
            output_file=output_file,
            meta={
                "snapshot-id": str(snapshot_id),
                "parent-snapshot-id": str(parent_snapshot_id) if parent_snapshot_id is not None else "null",
                "sequence-number": str(sequence_number),
                "first-row-id": str(first_row_id),
                "format-version": str(V3),
                "avro.codec": _AVRO_CODEC,
            },
        )
        self._snapshot_id = snapshot_id
        self._sequence_number = sequence_number
        self._next_row_id = first_row_id

    def __enter__(self) -> ManifestListWriterV3:
        # The base class writes from v2-shaped records; v3 records carry first_row_id (field 520).
        schema = MANIFEST_LIST_FILE_SCHEMAS[V3]
        self._writer = AvroOutputFile[ManifestFile](
            output_file=self._output_file,
            record_schema=schema,
            file_schema=schema,
            schema_name="manifest_file",
            metadata=self._meta,
        )
        self._writer.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc_value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._writer.__exit__(exc_type, exc_value, traceback)

    def prepare_manifest(self, manifest_file: ManifestFile) -> ManifestFile:
        if manifest_file.added_snapshot_id != self._snapshot_id:
            raise ValueError("this writer only lists manifests written by its own snapshot")
        first_row_id = self._next_row_id
        # Rows that get ids from this manifest: its added and existing data files (none carry their own ids).
        self._next_row_id += manifest_file.added_rows_count + manifest_file.existing_rows_count
        fields = {field.name: getattr(manifest_file, field.name) for field in MANIFEST_LIST_FILE_SCHEMAS[2].fields}
        if fields["sequence_number"] == UNASSIGNED_SEQ:
            fields["sequence_number"] = self._sequence_number
        if fields["min_sequence_number"] == UNASSIGNED_SEQ:
            fields["min_sequence_number"] = self._sequence_number
        return ManifestFile.from_args(_table_format_version=V3, **fields, first_row_id=first_row_id)

    @property
    def assigned_rows(self) -> int:
        """How many row ids the listed manifests were given (the snapshot's ``added-rows``)."""
        return self._next_row_id - int(self._meta["first-row-id"])


def _column_statistics(schema: Schema, data: pa.Table) -> dict[str, dict[int, Any]]:
    value_counts: dict[int, int] = {}
    null_counts: dict[int, int] = {}
    lower: dict[int, bytes] = {}
    upper: dict[int, bytes] = {}
    for field in schema.fields:
        if not isinstance(field.field_type, PrimitiveType):
            continue
        column = data.column(field.name)
        value_counts[field.field_id] = len(column)
        null_counts[field.field_id] = column.null_count
        if isinstance(field.field_type, _BOUNDED_TYPES) and column.null_count < len(column):
            _add_bounds(field, column, lower, upper)
    return {
        "value_counts": value_counts,
        "null_value_counts": null_counts,
        "lower_bounds": lower,
        "upper_bounds": upper,
    }


def _add_bounds(field: NestedField, column: pa.ChunkedArray, lower: dict[int, bytes], upper: dict[int, bytes]) -> None:
    physical = pa.int32() if pa.types.is_date32(column.type) or pa.types.is_int32(column.type) else pa.int64()
    extremes = pc.min_max(column.cast(physical))
    lower[field.field_id] = to_bytes(field.field_type, extremes["min"].as_py())
    upper[field.field_id] = to_bytes(field.field_type, extremes["max"].as_py())


def _parquet_bytes(schema: Schema, data: pa.Table) -> bytes:
    """The rows as Parquet with Iceberg field ids; nanosecond timestamps are stored as nanoseconds."""
    buffer = io.BytesIO()
    pq.write_table(data.cast(schema_to_pyarrow(schema)), buffer, version="2.6", coerce_timestamps=None)
    return buffer.getvalue()


def _write(table: Table, location: str, payload: bytes) -> None:
    with table.io.new_output(location).create(overwrite=False) as stream:
        stream.write(payload)


def _data_file(table: Table, data: pa.Table) -> DataFile:
    schema = table.schema()
    location = f"{table.location()}/data/{uuid.uuid4()}.parquet"
    payload = _parquet_bytes(schema, data)
    _write(table, location, payload)
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=data.num_rows,
        file_size_in_bytes=len(payload),
        **_column_statistics(schema, data),
    )
    data_file.spec_id = table.spec().spec_id
    return data_file


def _manifest(table: Table, snapshot_id: int, data_file: DataFile) -> ManifestFile:
    output = table.io.new_output(f"{table.location()}/metadata/{uuid.uuid4()}-m0.avro")
    with ManifestWriterV3(table.spec(), table.schema(), output, snapshot_id, _AVRO_CODEC) as writer:
        writer.add(
            ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, data_file=data_file)
        )
    return writer.to_manifest_file()


def append_v3(table: Table, data: pa.Table) -> Snapshot:
    """Append ``data`` to the v3 ``table`` as one new snapshot on ``main``; returns the committed snapshot."""
    metadata = table.metadata
    if metadata.format_version != V3 or metadata.next_row_id is None:
        raise ValueError(f"append_v3 needs a format-version 3 table with next-row-id, got v{metadata.format_version}")
    if table.spec().fields:
        raise ValueError("append_v3 writes unpartitioned tables only")
    if table.current_snapshot() is not None:
        raise ValueError("append_v3 writes a table's first snapshot only (no manifests to carry over)")
    snapshot_id = uuid.uuid4().int & ((1 << 63) - 1)
    sequence_number = metadata.last_sequence_number + 1
    new_manifest = _manifest(table, snapshot_id, _data_file(table, data))
    list_location = f"{table.location()}/metadata/snap-{snapshot_id}-1-{uuid.uuid4()}.avro"
    output = table.io.new_output(list_location)
    with ManifestListWriterV3(output, snapshot_id, None, sequence_number, metadata.next_row_id) as manifest_list:
        manifest_list.add_manifests([new_manifest])
    summary = Summary(
        Operation.APPEND,
        **{
            "added-data-files": "1",
            "added-records": str(data.num_rows),
            "total-data-files": "1",
            "total-records": str(data.num_rows),
            "total-delete-files": "0",
            "total-position-deletes": "0",
            "total-equality-deletes": "0",
        },
    )
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=None,
        sequence_number=sequence_number,
        manifest_list=list_location,
        summary=summary,
        schema_id=table.schema().schema_id,
        first_row_id=metadata.next_row_id,
        added_rows=manifest_list.assigned_rows,
    )
    table.catalog.commit_table(
        table,
        requirements=(
            AssertTableUUID(uuid=metadata.table_uuid),
            AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=None),
        ),
        updates=(
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(ref_name=MAIN_BRANCH, type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id),
        ),
    )
    return snapshot
