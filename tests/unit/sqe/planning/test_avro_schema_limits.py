"""A manifest's Avro header schema is checked before pyiceberg decodes by it (``sqe.planning.avro_limits``).

The writer of a table chooses the schema in each manifest list's and manifest's header, and pyiceberg builds its
reader from it. Each case starts from the schema pyiceberg writes for a manifest list, then changes one type."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    write_manifest,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, TimestampNanoType, TimestamptzNanoType
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from sqe.errors import ManifestLimitError
from sqe.planning.avro_limits import MAX_AVRO_SCHEMA_BYTES, BoundedManifestIO, ManifestBounds

if TYPE_CHECKING:
    from pathlib import Path
from tests.helpers.avro import avro_container, avro_long


def _schema(fields: Callable[[list[dict[str, Any]]], None]) -> bytes:
    """pyiceberg's own manifest list schema (format v2), its fields changed by ``fields``."""
    avro = AvroSchemaConversion().iceberg_to_avro(MANIFEST_LIST_FILE_SCHEMAS[2], schema_name="manifest_file")
    fields(avro["fields"])
    return json.dumps(avro).encode()


def _empty_partition_summaries(fields: list[dict[str, Any]]) -> None:
    """Every field null but ``content``; ``partitions`` a list of records holding one null: each takes no bytes."""
    for field in fields:
        if field["name"] == "partitions":
            summary = {
                "type": "record",
                "name": "r508",
                "fields": [{"name": "contains_null", "field-id": 509, "type": "null"}],
            }
            field["type"] = {"type": "array", "element-id": 508, "items": summary}
        elif field["name"] != "content":
            field["type"] = "null"  # pyiceberg reads it as Iceberg's unknown type, promoted to any: no bytes


# One manifest list record: content 0, then a list stated to hold 300000 summaries, then its end.
ENDLESS = avro_long(0) + avro_long(300_000) + avro_long(0)


def test_a_list_of_items_that_take_no_bytes_is_refused_before_it_is_decoded() -> None:
    # Found by fuzzing: a 1.4 KiB manifest list whose partition summaries take no bytes each (a record of one
    # null) and a stated count of 10^8 of them made pyiceberg build 10^8 records (46 s, then MemoryError): any
    # count from a few bytes, so one file could stop every planner and catalog that read the table.
    data = avro_container(b"null", ENDLESS, schema=_schema(_empty_partition_summaries))
    with pytest.raises(ManifestLimitError) as raised:
        ManifestBounds().checked("s3://b/snap.avro", data)
    assert str(raised.value) == (
        "cannot plan this scan: a manifest list or manifest of the table states records, or list or map items, "
        "that take no bytes (a stated count of them is read without end)"
    )


def _empty_records(fields: list[dict[str, Any]]) -> None:
    """Every field null, but those pyiceberg reads by a default when they are missing (content, partitions)."""
    fields[:] = [dict(field, type="null") for field in fields if field["name"] not in ("content", "partitions")]


def test_records_that_take_no_bytes_are_refused_before_they_are_decoded() -> None:
    # Found while fuzzing: a 935-byte manifest list whose records take no bytes and whose block states 10^8 of
    # them ran over 120 s (10^6 took 2.3 s): pyiceberg reads a block's stated count of records.
    data = avro_container(b"null", b"", schema=_schema(_empty_records))
    with pytest.raises(ManifestLimitError, match="states records, or list or map items, that take no bytes"):
        ManifestBounds().checked("s3://b/snap.avro", data)


def _replace(name: str, avro_type: object) -> Callable[[list[dict[str, Any]]], None]:
    def change(fields: list[dict[str, Any]]) -> None:
        next(field for field in fields if field["name"] == name)["type"] = avro_type

    return change


def _pairs(key: str, value: object) -> dict[str, Any]:
    """An Iceberg map of non-string keys as Avro writes it: an array of key-value records."""
    entry = {
        "type": "record",
        "name": "k1_v2",
        "fields": [{"name": "key", "type": key, "field-id": 1}, {"name": "value", "type": value, "field-id": 2}],
    }
    return {"type": "array", "logicalType": "map", "items": entry}


UNREADABLE: dict[str, tuple[bytes, str]] = {
    # found by fuzzing: pyiceberg's schema conversion failed on each, most untyped (TypeError, KeyError,
    # RecursionError: planning reported an internal error, not the table's fault)
    "a union of two types": (_schema(_replace("manifest_length", ["int", "long"])), "is not an Iceberg schema"),
    "a field without an id": (
        json.dumps({"type": "record", "name": "r", "fields": [{"name": "a", "type": "int"}]}).encode(),
        "is not an Iceberg schema",
    ),
    "not a record": (b"[1, 2]", "is not an Iceberg schema"),
    "deeply nested": (b"[" * 100_000 + b"]" * 100_000, "is not an Iceberg schema"),  # RecursionError
    "not UTF-8": (b'{"type": "record", "name": "\xff"}', "is not an Iceberg schema"),
    "a fixed(0) list": (
        _schema(
            _replace(
                "key_metadata", {"type": "array", "element-id": 9, "items": {"type": "fixed", "name": "f", "size": 0}}
            )
        ),
        "take no bytes",
    ),
    # pyiceberg's map reader has no generic path for integer keys: it raised AttributeError reading one
    "an int-keyed map of strings": (_schema(_replace("key_metadata", _pairs("int", "string"))), "integer keys"),
    "an int-keyed map of optional longs": (
        _schema(_replace("key_metadata", _pairs("int", ["null", "long"]))),
        "integer keys",
    ),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_a_schema_pyiceberg_cannot_read_safely_is_refused(case: str) -> None:
    schema, why = UNREADABLE[case]
    with pytest.raises(ManifestLimitError, match=why):
        ManifestBounds().checked("s3://b/snap.avro", avro_container(b"null", ENDLESS, schema=schema))


def test_the_schemas_pyiceberg_writes_for_every_format_version_pass() -> None:
    conversion = AvroSchemaConversion()
    schemas = [conversion.iceberg_to_avro(s, schema_name="manifest_file") for s in MANIFEST_LIST_FILE_SCHEMAS.values()]
    schemas += [conversion.iceberg_to_avro(s, schema_name="manifest_entry") for s in MANIFEST_ENTRY_SCHEMAS.values()]
    for avro in schemas:
        data = avro_container(b"null", schema=json.dumps(avro).encode())
        assert ManifestBounds().checked("s3://b/snap.avro", data) == data


def test_a_schema_past_its_limit_is_refused_before_it_is_parsed() -> None:
    # Found while fuzzing: pyiceberg parses a header's schema whole, into objects about twenty times its size
    # (4.9 MB took 97 MB and 0.7 s), and a header may fill a 64 MiB manifest (MAX_MANIFEST_BYTES).
    def padded(fields: list[dict[str, Any]]) -> None:
        fields[0]["doc"] = "x" * MAX_AVRO_SCHEMA_BYTES

    with pytest.raises(ManifestLimitError) as raised:
        ManifestBounds().checked("s3://b/snap.avro", avro_container(b"null", schema=_schema(padded)))
    assert str(raised.value).endswith(
        f"states an Avro schema of more than {MAX_AVRO_SCHEMA_BYTES} bytes (MAX_AVRO_SCHEMA_BYTES)"
    )


def test_a_manifest_partitioned_by_nanosecond_timestamps_is_read(tmp_path: Path) -> None:
    # Found by review: Iceberg writes timestamp_ns and timestamptz_ns partition values as Avro longs of logical
    # type timestamp-nanos (format v3; Java, and pyiceberg's own manifest writer), which pyiceberg 0.12 did not
    # convert back: such a table was refused as "not an Iceberg schema".
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "ts", TimestampNanoType(), required=False),
        NestedField(3, "tz", TimestamptzNanoType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(2, 1000, IdentityTransform(), "ts"), PartitionField(3, 1001, IdentityTransform(), "tz")
    )
    io = PyArrowFileIO()
    output = io.new_output(str(tmp_path / "m.avro"))
    with write_manifest(
        format_version=2, spec=spec, schema=schema, output_file=output, snapshot_id=1, avro_compression="deflate"
    ) as writer:
        data_file = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path="s3://b/t/data/x.parquet",
            file_format=FileFormat.PARQUET,
            partition=Record(1_700_000_000_000_000_123, -5),
            record_count=1,
            file_size_in_bytes=10,
        )
        data_file.spec_id = 0
        writer.add_entry(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=1, data_file=data_file))
    manifest = writer.to_manifest_file()
    entries = manifest.fetch_manifest_entry(BoundedManifestIO(io, ManifestBounds()))
    assert [entry.data_file.partition for entry in entries] == [Record(1_700_000_000_000_000_123, -5)]
