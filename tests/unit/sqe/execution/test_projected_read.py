"""SQE's counted copy of pyiceberg's Parquet reader (``sqe.execution.projected_read``) yields what pyiceberg's own
reader (``pyiceberg.io.pyarrow._task_to_record_batches``, the oracle) yields for the same file and arguments.

The copy calls pyiceberg's private helpers step for step; their signatures are pinned at import, but a pyiceberg
release may change what a step does (or add one) without changing a signature. These cases run both readers over
real Parquet files: schema evolution (promoted, renamed, reordered, added columns with and without an initial
default), name mapping, nested types, nanosecond timestamps on v2 and v3 tables, a partition-only column,
positional deletes, NaN filters, pruned row groups, files of no rows: any drift fails here, never misreads.
"""

from __future__ import annotations

import decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNaN,
    IsNull,
    LessThan,
    Not,
    NotEqualTo,
    NotNaN,
    Or,
)
from pyiceberg.expressions.visitors import bind
from pyiceberg.io.pyarrow import PyArrowFileIO, _task_to_record_batches
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
)

from sqe.execution.projected_read import parquet_task_batches

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table.name_mapping import NameMapping

ROWS, GROUP_ROWS = 5_000, 700
DELETED = [0, 1, 699, 700, 2500, 4999]


def _id(field: pa.Field, field_id: int) -> pa.Field:
    return field.with_metadata({b"PARQUET:field_id": str(field_id).encode()})


def _write(path: Path, table: pa.Table, **options: Any) -> str:
    pq.write_table(table, path, row_group_size=GROUP_ROWS, **options)
    return str(path)


def _task(path: str, partition: Record | None = None) -> FileScanTask:
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition or Record(),
        record_count=pq.read_metadata(path).num_rows,
        file_size_in_bytes=Path(path).stat().st_size,
    )
    data_file.spec_id = 0
    return FileScanTask(data_file)


def _comparable(table: pa.Table | None) -> Any:
    """The rows (timestamps as integers: nanoseconds do not convert to datetime) and the schema with metadata."""
    if table is None:
        return None
    columns = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in table.columns]
    return table.schema, repr(pa.table(columns, names=table.column_names).to_pylist())


def _read(reader: Any, task: FileScanTask, row_filter: BooleanExpression, schema: Schema, **case: Any) -> Any:
    bound = row_filter if isinstance(row_filter, AlwaysTrue) else bind(schema, row_filter, case_sensitive=True)
    projected = {i for i in schema.field_ids if not isinstance(schema.find_type(i), (ListType, MapType))}
    arguments = (PyArrowFileIO(), task, bound, schema, schema, projected, case.get("deletes"), True)
    name_mapping: NameMapping | None = case.get("name_mapping")
    batches = list(reader(*arguments, name_mapping, case.get("spec"), case.get("format_version", 2)))
    return _comparable(pa.Table.from_batches(batches) if batches else None)


def _same_as_pyiceberg(task: FileScanTask, schema: Schema, filters: list[BooleanExpression], **case: Any) -> None:
    for row_filter in filters:
        for deletes in (None, [pa.chunked_array([pa.array(DELETED, pa.int64())])]):
            expected = _read(_task_to_record_batches, task, row_filter, schema, **case, deletes=deletes)
            actual = _read(parquet_task_batches, task, row_filter, schema, **case, deletes=deletes)
            assert actual == expected, (row_filter, deletes is not None)


def test_an_evolved_schema_reads_as_pyiceberg_reads_it(tmp_path: Path) -> None:
    written = pa.schema(
        [
            _id(pa.field("a", pa.int32()), 1),
            _id(pa.field("b", pa.float32()), 2),
            _id(pa.field("c", pa.decimal128(5, 2)), 3),
            _id(pa.field("d", pa.string()), 4),
            _id(pa.field("dropped", pa.int64()), 9),
        ]
    )
    rows = pa.table(
        {
            "a": pa.array(range(ROWS), pa.int32()),
            "b": pa.array([float("nan") if i % 7 == 0 else i / 2 for i in range(ROWS)], pa.float32()),
            "c": pa.array([decimal.Decimal(i % 1000) / 100 for i in range(ROWS)], pa.decimal128(5, 2)),
            "d": pa.array([None if i % 5 == 0 else f"s{i}" for i in range(ROWS)]),
            "dropped": pa.array(range(ROWS), pa.int64()),
        },
        schema=written,
    )
    path = _write(tmp_path / "evolved.parquet", rows)
    schema = Schema(  # reordered; a, b, c promoted; d renamed; e added; f added with an initial default
        NestedField(5, "e", LongType(), required=False),
        NestedField(4, "renamed", StringType(), required=False),
        NestedField(1, "a", LongType(), required=False),
        NestedField(2, "b", DoubleType(), required=False),
        NestedField(3, "c", DecimalType(10, 2), required=False),
        NestedField(6, "f", IntegerType(), required=False, initial_default=42),
    )
    filters: list[BooleanExpression] = [
        AlwaysTrue(),
        GreaterThan("a", 4200),  # prunes row groups
        And(GreaterThanOrEqual("a", 1400), LessThan("a", 1500)),
        Or(EqualTo("a", 5), EqualTo("a", 4995)),
        Not(LessThan("a", 4000)),
        In("a", {1, 2500, 4999}),
        LessThan("b", 100.0),
        NotEqualTo("b", 3.0),
        IsNaN("b"),
        NotNaN("b"),
        EqualTo("renamed", "s3"),
        IsNull("renamed"),
        IsNull("e"),
        EqualTo("f", 42),
        EqualTo("f", 1),
    ]
    for format_version in (2, 3):
        _same_as_pyiceberg(_task(path), schema, filters, format_version=format_version)


def test_a_file_without_field_ids_reads_by_the_name_mapping_as_pyiceberg_reads_it(tmp_path: Path) -> None:
    rows = pa.table({"a": pa.array(range(ROWS), pa.int32()), "d": [f"s{i}" for i in range(ROWS)]})
    path = _write(tmp_path / "plain.parquet", rows)
    schema = Schema(NestedField(1, "a", LongType(), required=False), NestedField(2, "d", StringType(), required=False))
    filters: list[BooleanExpression] = [AlwaysTrue(), GreaterThan("a", 4200), EqualTo("d", "s3")]
    _same_as_pyiceberg(_task(path), schema, filters, name_mapping=create_mapping_from_schema(schema))


def test_nested_columns_read_as_pyiceberg_reads_them(tmp_path: Path) -> None:
    struct = pa.struct([_id(pa.field("sa", pa.int32()), 11), _id(pa.field("sb", pa.string()), 12)])
    listed = pa.list_(_id(pa.field("element", pa.int64()), 14))
    mapped = pa.map_(_id(pa.field("key", pa.string(), nullable=False), 16), _id(pa.field("value", pa.float64()), 17))
    written = pa.schema(
        [
            _id(pa.field("id", pa.int64()), 1),
            _id(pa.field("s", struct), 10),
            _id(pa.field("l", listed), 13),
            _id(pa.field("m", mapped), 15),
        ]
    )
    rows = pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "s": pa.array([None if i % 11 == 0 else {"sa": i, "sb": None if i % 3 else str(i)} for i in range(ROWS)]),
            "l": pa.array([None if i % 13 == 0 else list(range(i % 4)) for i in range(ROWS)], listed),
            "m": pa.array([None if i % 17 == 0 else [("k", float(i))] * (i % 3) for i in range(ROWS)], mapped),
        },
        schema=written,
    )
    path = _write(tmp_path / "nested.parquet", rows)
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(
            10,
            "s",
            StructType(
                NestedField(11, "sa", LongType(), required=False),
                NestedField(12, "sb", StringType(), required=False),
                NestedField(18, "added", IntegerType(), required=False),
            ),
            required=False,
        ),
        NestedField(13, "l", ListType(14, LongType(), element_required=False), required=False),
        NestedField(15, "m", MapType(16, StringType(), 17, DoubleType(), value_required=False), required=False),
    )
    filters: list[BooleanExpression] = [AlwaysTrue(), GreaterThan("id", 4200), EqualTo("s.sa", 5), IsNull("s.sb")]
    _same_as_pyiceberg(_task(path), schema, filters)


@pytest.mark.parametrize("format_version", [2, 3])
def test_nanosecond_timestamps_read_as_pyiceberg_reads_them(tmp_path: Path, format_version: int) -> None:
    # v1 and v2 tables: downcast to microseconds on read; v3 tables: kept (or refused where the table says us).
    nanos = [i * 1_000_001 for i in range(ROWS)]
    written = pa.schema(
        [
            _id(pa.field("id", pa.int64()), 1),
            _id(pa.field("t", pa.timestamp("ns")), 2),
            _id(pa.field("tz", pa.timestamp("ns", tz="UTC")), 3),
        ]
    )
    rows = pa.table({"id": range(ROWS), "t": nanos, "tz": nanos}, schema=written)
    path = _write(tmp_path / "nanos.parquet", rows, coerce_timestamps=None, version="2.6")
    micros = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "t", TimestampType(), required=False),
        NestedField(3, "tz", TimestamptzType(), required=False),
    )
    filters: list[BooleanExpression] = [AlwaysTrue(), GreaterThan("id", 4200)]
    if format_version == 2:
        _same_as_pyiceberg(_task(path), micros, filters, format_version=2)
        return
    nano = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "t", TimestampNanoType(), required=False),
        NestedField(3, "tz", TimestamptzNanoType(), required=False),
    )
    _same_as_pyiceberg(_task(path), nano, filters, format_version=3)


def test_a_partition_column_absent_from_the_file_reads_as_pyiceberg_reads_it(tmp_path: Path) -> None:
    rows = pa.table({"id": pa.array(range(ROWS), pa.int64())}, schema=pa.schema([_id(pa.field("id", pa.int64()), 1)]))
    path = _write(tmp_path / "partitioned.parquet", rows)
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "region", StringType(), False))
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"))
    filters: list[BooleanExpression] = [
        AlwaysTrue(),
        EqualTo("region", "eu"),
        EqualTo("region", "us"),
        And(EqualTo("region", "eu"), LessThan("id", 10)),
    ]
    _same_as_pyiceberg(_task(path, Record("eu")), schema, filters, spec=spec)


@pytest.mark.parametrize("groups", [0, 1], ids=["no-row-group", "an-empty-row-group"])
def test_a_file_of_no_rows_reads_as_pyiceberg_reads_it(tmp_path: Path, groups: int) -> None:
    written = pa.schema([_id(pa.field("id", pa.int64()), 1)])
    path = tmp_path / "empty.parquet"
    if groups:
        pq.write_table(written.empty_table(), path)
    else:
        pq.ParquetWriter(path, written).close()
    assert pq.read_metadata(path).num_row_groups == groups
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    for row_filter in (AlwaysTrue(), GreaterThan("id", 3)):
        expected = _read(_task_to_record_batches, _task(str(path)), row_filter, schema)
        assert _read(parquet_task_batches, _task(str(path)), row_filter, schema) == expected is None
