"""Hive external tables (Parquet) scanned on workers: the same scan tickets as Iceberg tables, synthesized.

Design (no protocol change): a worker already reads Parquet files through pyiceberg given table metadata, a read
schema and ``DataFile`` entries. For an external table the coordinator synthesizes all three:

- **metadata**: a v2 ``TableMetadata`` at the mount's location whose schema is the declared columns (data
  columns, then partition columns) with field ids 1..n, an identity partition spec over the partition columns,
  and a ``schema.name-mapping.default`` property so files written without field ids resolve by column name;
- **tasks**: one ``DataFile`` per file left after partition pruning (done here, on the coordinator, with the
  same pyarrow dataset as local mode): path, size from the listing, record count from the footer, format
  PARQUET, and the hive partition values as the partition record. pyiceberg's column projection fills identity
  partition columns missing from a file from that record, so partition values appear exactly as in local mode;
- **credentials**: the mount's own keys or the ``[storage]`` pair as one set of source ``static``, scoped to the
  mount's location (the ticket codec marks it ``CREDENTIAL_SOURCE_STATIC``).

CSV and JSON mounts stay on the coordinator (pyiceberg reads neither). Tickets hold keys: never logged here.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.dataset as ds
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io.pyarrow import pyarrow_to_schema
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadataV2
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record

from sqe._text import first_line
from sqe.distributed.coordinator.credentials import TableCredentials
from sqe.distributed.coordinator.job import ScanJob
from sqe.errors import QueryError, SQEError
from sqe.execution.stream import QueryContext
from sqe.restrictions import EMPTY_PLAN, RestrictionPlan

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata

    from sqe.catalog.base import TableIdent
    from sqe.credentials import CredentialSet
    from sqe.distributed.coordinator.executor import DistributedExecutor
    from sqe.execution.tvf import FileStream

log = logging.getLogger(__name__)

_NAME_MAPPING = "schema.name-mapping.default"
_FIRST_PARTITION_FIELD_ID = 1000
_ALWAYS_TRUE: BooleanExpression = AlwaysTrue()


class NotDistributableError(QueryError):
    """This mount cannot be scanned on workers (format or column type); the caller reads it locally."""


@dataclass(frozen=True)
class ExternalRead:
    """The read part of a plan (``ScanRun`` reads ``plan.read.projected_schema``, as for Iceberg plans)."""

    projected_schema: Schema = field(repr=False)


@dataclass(frozen=True)
class ExternalScanPlan:
    """What ``ScanRun`` needs for an external table: synthesized metadata, tasks and the static credentials."""

    ident: TableIdent
    metadata: TableMetadata = field(repr=False)
    tasks: tuple[FileScanTask, ...] = field(repr=False)
    read: ExternalRead = field(repr=False)
    arrow_schema: pa.Schema = field(repr=False)
    credentials: TableCredentials = field(repr=False)
    restrictions: RestrictionPlan = EMPTY_PLAN  # external tables carry no read-restrictions
    row_filter: BooleanExpression = _ALWAYS_TRUE  # partitions are pruned here; workers filter nothing

    @property
    def output_field_ids(self) -> frozenset[int]:
        return frozenset(f.field_id for f in self.read.projected_schema.columns)

    def __reduce__(self) -> Any:
        raise TypeError("an external scan plan holds storage credentials and cannot be pickled")


def external_scan_plan(
    ident: TableIdent, location: str, stream: FileStream, credentials: CredentialSet
) -> ExternalScanPlan:
    """The plan for one external-table reference, pruned with the stream's partition filter.

    Raises NotDistributableError for a mount workers cannot read (not Parquet, or a column type without an
    Iceberg equivalent)."""
    source = stream.source
    if source.file_format != "parquet":
        raise NotDistributableError(f"{ident}: only Parquet external tables are scanned on workers")
    partitions = source.partition_schema or pa.schema([])
    arrow_schema = stream.schema
    schema = _iceberg_schema(ident, arrow_schema)
    spec = _identity_spec(schema, partitions.names)
    metadata = _metadata(location, schema, spec)
    tasks = _tasks(ident, stream, partitions)
    scoped = credentials.with_prefix(location.rstrip("/") + "/")
    table_credentials = TableCredentials(ident, None, (), scoped)
    return ExternalScanPlan(ident, metadata, tasks, ExternalRead(schema), arrow_schema, table_credentials)


def _iceberg_schema(ident: TableIdent, arrow_schema: pa.Schema) -> Schema:
    with_ids = pa.schema(
        [f.with_metadata({b"PARQUET:field_id": str(i + 1).encode()}) for i, f in enumerate(arrow_schema)]
    )
    try:
        return pyarrow_to_schema(with_ids)
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise NotDistributableError(f"{ident}: a column type has no Iceberg equivalent ({first_line(exc)})") from None


def _identity_spec(schema: Schema, partition_names: Sequence[str]) -> PartitionSpec:
    fields = [
        PartitionField(
            source_id=schema.find_field(name).field_id,
            field_id=_FIRST_PARTITION_FIELD_ID + i,
            transform=IdentityTransform(),
            name=name,
        )
        for i, name in enumerate(partition_names)
    ]
    return PartitionSpec(*fields, spec_id=0)


def _metadata(location: str, schema: Schema, spec: PartitionSpec) -> TableMetadata:
    mapping = schema.name_mapping.model_dump_json()
    return TableMetadataV2.model_validate(
        {
            "location": location.rstrip("/"),
            "table-uuid": str(uuid.uuid4()),
            "last-updated-ms": int(time.time() * 1000),
            "last-column-id": schema.highest_field_id,
            "schemas": [schema],
            "current-schema-id": schema.schema_id,
            "partition-specs": [spec],
            "default-spec-id": spec.spec_id,
            "last-partition-id": max((f.field_id for f in spec.fields), default=_FIRST_PARTITION_FIELD_ID - 1),
            "properties": {_NAME_MAPPING: mapping},
            "sort-orders": [UNSORTED_SORT_ORDER],
            "default-sort-order-id": UNSORTED_SORT_ORDER.order_id,
        }
    )


def _tasks(ident: TableIdent, stream: FileStream, partitions: pa.Schema) -> tuple[FileScanTask, ...]:
    """One task per file that survives partition pruning (the same fragments the local stream reads); the
    partition record follows the spec's order, which is the partition schema's."""
    source = stream.source
    fragments = list(stream.dataset.get_fragments(filter=source.filter))
    infos = source.filesystem.get_file_info([f.path for f in fragments]) if fragments else []
    locations = dict(zip(source.files, source.locations, strict=True))  # pyarrow path -> s3://bucket/key
    tasks = []
    for fragment, info in zip(fragments, infos, strict=True):
        values = ds.get_partition_keys(fragment.partition_expression)
        record = Record(*(_partition_value(ident, values.get(name)) for name in partitions.names))
        data_file = DataFile.from_args(
            2,
            content=DataFileContent.DATA,
            file_path=locations[fragment.path],
            file_format=FileFormat.PARQUET,
            partition=record,
            record_count=_record_count(ident, fragment),
            file_size_in_bytes=int(info.size or 0),
        )
        data_file.spec_id = 0
        tasks.append(FileScanTask(data_file))
    return tuple(tasks)


def _record_count(ident: TableIdent, fragment: Any) -> int:
    try:
        return int(fragment.metadata.num_rows)
    except (OSError, pa.ArrowException) as exc:
        raise QueryError(f"{ident}: cannot read a Parquet footer: {first_line(exc)}") from None


def _partition_value(ident: TableIdent, value: object) -> object:
    """A hive path value as an Iceberg partition value (identity transform: dates are days since the epoch)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return (value - datetime.date(1970, 1, 1)).days
    raise NotDistributableError(f"{ident}: a partition value of type {type(value).__name__} stays on the coordinator")


class ExternalScanStream:
    """What DuckDB scans for an external table read on workers: a fresh distributed run per open."""

    def __init__(self, plan: ExternalScanPlan, executor: DistributedExecutor, local: FileStream) -> None:
        self.plan = plan
        self.schema: pa.Schema = plan.arrow_schema
        self.local = local  # EXPLAIN's row (files listed/scanned, partition filter) comes from the same pruning
        self._executor = executor
        self.query_id = f"q-{uuid.uuid4().hex[:16]}"
        self._runs = itertools.count(1)  # each open is a run of its own (fragment ids differ); next() is atomic
        log.info("external table %s: %d file(s) scanned on workers (credentials: static)", plan.ident, len(plan.tasks))

    def __repr__(self) -> str:
        return f"ExternalScanStream({self.plan.ident}, files={len(self.plan.tasks)})"

    def __reduce__(self) -> Any:
        raise TypeError("an external scan stream holds storage credentials and cannot be pickled")

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        reader = pa.RecordBatchReader.from_batches(self.schema, self._batches(next(self._runs)))
        return reader.__arrow_c_stream__(requested_schema)

    def _batches(self, run: int) -> Iterator[pa.RecordBatch]:
        context = QueryContext()
        try:
            yield from self._executor.record_batches(ScanJob(self.plan, context, self.query_id, run))
        except SQEError:
            raise
        except Exception as exc:
            raise QueryError(f"distributed scan of {self.plan.ident} failed: {first_line(exc, limit=300)}") from None

    def describe(self) -> dict[str, Any]:
        """The local stream's EXPLAIN row, plus where the files are read. Never a secret."""
        return {**self.local.describe(), "executed_on": "workers"}


def external_scan_stream(
    executor: DistributedExecutor, ident: TableIdent, location: str, stream: FileStream, credentials: CredentialSet
) -> ExternalScanStream | None:
    """A worker-backed stream for the mount, or None when it must be read on the coordinator (CSV/JSON, ...)."""
    try:
        plan = external_scan_plan(ident, location, stream, credentials)
    except NotDistributableError as exc:
        log.info("%s; reading it on the coordinator", exc)
        return None
    return ExternalScanStream(plan, executor, stream)
