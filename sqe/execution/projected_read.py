"""A Parquet data file read as pyiceberg's reader reads it (positional deletes applied, columns projected to the
table's types, missing ones filled), with its rows counted.

pyiceberg's reader (``pyiceberg.io.pyarrow._task_to_record_batches``) scans a file as one fragment and never learns
what a row group yielded: a row group short of the rows it states read short without error, and every later row
took the file position of another, so a positional delete removed the wrong row. This is the same reader, step for
step (the file's schema, the missing columns' partition values, the filter bound to the file, the deletes before
the filter when there are any), with the rows read by :func:`sqe.execution.file_rows.group_batches` after the
footer is held to the manifest entry. The scan's files with deletes or evolved columns read through it, and so do
OPTIMIZE's rewrites (locally and on workers), whose output is committed as the table's rows.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyiceberg
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.expressions.visitors import bind, translate_column_names
from pyiceberg.io import pyarrow as _pyiceberg_arrow
from pyiceberg.io.pyarrow import expression_to_pyarrow, pyarrow_to_schema, schema_to_pyarrow
from pyiceberg.manifest import FileFormat
from pyiceberg.schema import prune_columns
from pyiceberg.types import ListType, MapType
from pyiceberg.utils.concurrent import ExecutorFactory

from sqe.execution.cache import parquet_fragment
from sqe.execution.file_rows import check_file_rows, filtered, group_batches, scan_columns

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.io import FileIO
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.name_mapping import NameMapping

# Private pyiceberg functions this reader calls, with their leading parameters (verified against pyiceberg 0.12);
# _get_column_projection_values's from its second on (the first is the data file).
_PINNED: dict[str, tuple[str, ...]] = {
    "_get_column_projection_values": (
        "projected_schema",
        "table_schema",
        "partition_spec",
        "file_project_field_ids",
    ),
    "_combine_positional_deletes": ("positional_deletes", "start_index", "end_index"),
    "_to_requested_schema": (
        "requested_schema",
        "file_schema",
        "batch",
        "downcast_ns_timestamp_to_us",
        "include_field_ids",
        "projected_missing_fields",
        "allow_timestamp_tz_mismatch",
    ),
    "_read_all_delete_files": ("io", "tasks"),
}


def _pinned(name: str) -> Callable[..., Any]:
    fn = getattr(_pyiceberg_arrow, name, None)
    params = tuple(inspect.signature(fn).parameters) if fn is not None else ()
    first = 1 if name == "_get_column_projection_values" else 0
    if fn is None or params[first : first + len(_PINNED[name])] != _PINNED[name]:
        raise ImportError(
            f"pyiceberg {pyiceberg.__version__} changed pyiceberg.io.pyarrow.{name}; "
            "SQE's counted reader supports pyiceberg 0.12"
        )
    return fn  # type: ignore[no-any-return]


_missing_values = _pinned("_get_column_projection_values")
_kept_positions = _pinned("_combine_positional_deletes")
_to_requested_schema = _pinned("_to_requested_schema")
_read_all_delete_files = _pinned("_read_all_delete_files")

# What pyiceberg opens Parquet files with: coalesced reads of a row group's column chunks, buffered streams.
PARQUET = ds.ParquetFileFormat(pre_buffer=True, buffer_size=8 << 20)
_BATCH_ROWS = 131_072  # the scanner's default, which pyiceberg's reader uses


def parquet_task_batches(
    io: FileIO,
    task: FileScanTask,
    bound_row_filter: BooleanExpression,
    projected_schema: Schema,
    table_schema: Schema,
    projected_field_ids: set[int],
    positional_deletes: list[pa.ChunkedArray] | None,
    case_sensitive: bool,
    name_mapping: NameMapping | None,
    partition_spec: PartitionSpec | None,
    format_version: int,
    *,
    fragment: ds.ParquetFileFragment | None = None,
) -> Iterator[pa.RecordBatch]:
    """pyiceberg's ``_task_to_record_batches`` (same parameters) of a Parquet data file, its rows counted;
    ``fragment``: the file's, when the caller already opened it."""
    if fragment is None:
        fragment = parquet_fragment(io, task.file.file_path, task.file.file_size_in_bytes, PARQUET)
    check_file_rows(fragment.metadata, task.file.record_count)
    physical = fragment.physical_schema
    downcast = format_version <= 2  # pyiceberg's rule: v1 and v2 tables hold microseconds only
    file_schema = pyarrow_to_schema(
        physical,
        name_mapping,
        downcast_ns_timestamp_to_us=downcast,
        format_version=format_version,  # type: ignore[arg-type]  # a TableVersion, read from metadata
    )
    missing = _missing_values(task.file, projected_schema, table_schema, partition_spec, file_schema.field_ids)
    row_filter = _file_filter(bound_row_filter, file_schema, case_sensitive, missing)
    file_project_schema = prune_columns(file_schema, projected_field_ids, select_full_types=False)
    names = [column.name for column in file_project_schema.columns]
    columns, mask = scan_columns(names, row_filter, physical)
    read_schema = pa.schema([physical.field(name) for name in names])
    # Positions count from the file's first row: with deletes every row group is read (as pyiceberg does).
    groups = _groups(fragment, None if positional_deletes else row_filter)
    position = 0
    for _, batch in group_batches(fragment, groups, columns, _BATCH_ROWS):
        start, position = position, position + batch.num_rows
        if positional_deletes:
            batch = batch.take(_kept_positions(positional_deletes, start, position))
        kept = filtered(batch, mask, read_schema)
        if kept.num_rows:
            yield _to_requested_schema(
                projected_schema,
                file_project_schema,
                kept,
                downcast_ns_timestamp_to_us=downcast,
                projected_missing_fields=missing,
                allow_timestamp_tz_mismatch=True,
            )


def _file_filter(
    bound_row_filter: BooleanExpression, file_schema: Schema, case_sensitive: bool, missing: dict[int, Any]
) -> ds.Expression | None:
    """The row filter on the file's own columns (a missing one by its partition value), or None."""
    if isinstance(bound_row_filter, AlwaysTrue):
        return None
    translated = translate_column_names(
        bound_row_filter, file_schema, case_sensitive=case_sensitive, projected_field_values=missing
    )
    return expression_to_pyarrow(bind(file_schema, translated, case_sensitive=case_sensitive), file_schema)


def _groups(fragment: ds.ParquetFileFragment, row_filter: ds.Expression | None) -> list[int]:
    """Every row group, or those whose statistics ``row_filter`` does not rule out (the scanner's pruning)."""
    if row_filter is None:
        return list(range(fragment.metadata.num_row_groups))
    kept = fragment.subset(filter=row_filter, schema=fragment.physical_schema)
    return sorted(group.id for group in kept.row_groups)


def rewrite_rows(metadata: TableMetadata, io: FileIO, deletes_io: FileIO, tasks: Iterable[FileScanTask]) -> pa.Table:
    """Every row of ``tasks`` in the table's current schema, deletes applied: what pyiceberg's
    ``ArrowScan(metadata, io, metadata.schema(), AlwaysTrue()).to_table(tasks)`` reads for OPTIMIZE, with each
    Parquet file's rows counted. ``deletes_io`` reads the delete files (their checked bytes)."""
    tasks = list(tasks)
    schema = metadata.schema()
    deletes = _read_all_delete_files(deletes_io, tasks)
    projected = {
        field_id for field_id in schema.field_ids if not isinstance(schema.find_type(field_id), (MapType, ListType))
    }  # ArrowScan's projected field ids, for a filter that reads nothing
    name_mapping, specs = metadata.name_mapping(), metadata.specs()

    def task_batches(task: FileScanTask) -> list[pa.RecordBatch]:
        arguments = (
            io,
            task,
            AlwaysTrue(),
            schema,
            schema,
            projected,
            deletes.get(task.file.file_path),
            True,
            name_mapping,
            specs.get(task.file.spec_id),
            metadata.format_version,
        )
        if task.file.file_format == FileFormat.PARQUET:
            return list(parquet_task_batches(*arguments))
        return list(_pyiceberg_arrow._task_to_record_batches(*arguments))

    # Files read in parallel, in task order, on pyiceberg's executor (as ArrowScan reads them).
    batches = [batch for read in ExecutorFactory.get_or_create().map(task_batches, tasks) for batch in read]
    if not batches:
        return schema_to_pyarrow(schema, include_field_ids=False).empty_table()
    # As ArrowScan: batches may differ in their string types (large or not), so tables are concatenated.
    return pa.concat_tables((pa.Table.from_batches([batch]) for batch in batches), promote_options="permissive")
