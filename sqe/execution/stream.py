"""The object DuckDB sees for an Iceberg table: every ``__arrow_c_stream__`` call opens a fresh scan.

DuckDB opens a registered stream several times per query (binding, each side of a self-join, re-scans) and
cannot re-read a consumed ``RecordBatchReader``, so each call builds a new reader. Opening is cheap: the reader
is lazy, and no file is touched until DuckDB asks for the first batch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from sqe._text import first_line
from sqe.errors import QueryError, SQEError
from sqe.execution.local import BatchTransform, LocalExecutor, ScanMetrics
from sqe.planning.user_filter import UserFilter, filtering
from sqe.restrictions import new_query_salt

if TYPE_CHECKING:
    from sqe.planning.planner import ScanPlan


@dataclass
class QueryContext:
    """State shared by every scan of one statement execution: cancel flag, first scan error, progress."""

    cancel: threading.Event = field(default_factory=threading.Event)
    metrics: ScanMetrics = field(default_factory=ScanMetrics)
    salt: bytes = field(default_factory=new_query_salt, repr=False)  # sha-256-query-local: one per query
    # A scan of a row-filtered table: its files were pruned with statistics of hidden rows too, so progress shows
    # no file or byte counts (as EXPLAIN withholds them).
    counts_withheld: bool = False
    _error: SQEError | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_error(self, error: SQEError) -> None:
        with self._lock:
            if self._error is None:
                self._error = error

    @property
    def error(self) -> SQEError | None:
        with self._lock:
            return self._error


class ScanStream:
    """Arrow PyCapsule stream producer over one ScanPlan: only row-filtered and masked batches come out."""

    def __init__(self, plan: ScanPlan, executor: LocalExecutor, context: QueryContext) -> None:
        self.plan = plan
        self.schema: pa.Schema = plan.arrow_schema
        self._executor = executor
        self._context = context
        self._restrict = plan.batch_transform(context.salt)
        self._transform = conforming(self._restrict, self.schema)
        self.opened = 0  # how many fresh readers were handed out (tests: a self-join opens several)

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        self.opened += 1
        return self.reader().__arrow_c_stream__(requested_schema)

    def reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.schema, self.batches())

    def batches(self, then: BatchTransform | None = None, where: UserFilter | None = None) -> Iterator[pa.RecordBatch]:
        """A fresh scan's restricted batches, conformed to ``schema``; with ``where`` (a pass-through query's
        simple WHERE) only the rows it keeps; with ``then`` (a pass-through query's projection and its own
        conforming to the result's types) each batch passed through ``then`` instead of being conformed. All of it
        runs in the reader threads, in this order. Closing the iterator stops the scan."""
        try:
            transform = self._transform_for(then, where)
            yield from self._executor.record_batches(
                self.plan, cancel=self._context.cancel, transform=transform, metrics=self._context.metrics
            )
        except SQEError as exc:  # including QueryCancelledError
            self._context.record_error(exc)
            raise
        except Exception as exc:  # e.g. an object-store error: keep the table name, lose the traceback
            error = QueryError(f"reading {self.plan.ident} failed: {first_line(exc)}")
            self._context.record_error(error)
            raise error from None

    def _transform_for(self, then: BatchTransform | None, where: UserFilter | None) -> BatchTransform | None:
        restrict = self._restrict
        if where is not None:  # before conforming: only the kept rows are converted
            restrict = filtering(where.mask(self.schema), first=restrict)
        if then is None:
            return self._transform if where is None else conforming(restrict, self.schema)
        return then if restrict is None else _chained(restrict, then)


def _chained(first: BatchTransform, then: BatchTransform) -> BatchTransform:
    return lambda batch: then(first(batch))


def conforming(transform: BatchTransform | None, schema: pa.Schema) -> BatchTransform:
    """``transform`` then ``conform_batch``: both run in the executor's reader threads, in parallel, so the
    consumer (DuckDB pulling through the GIL) only hands batches on."""
    if transform is None:
        return lambda batch: conform_batch(batch, schema)
    restrict = transform
    return lambda batch: conform_batch(restrict(batch), schema)


def conform_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Batches of different files may differ in string width or carry field ids (or, on a scan worker, be
    dictionary-encoded); consumers need exactly ``schema``."""
    if batch.schema.equals(schema, check_metadata=True):
        return batch
    columns = [
        column if column.type == f.type else column.cast(f.type)
        for column, f in zip(batch.columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
