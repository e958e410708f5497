"""``DistributedScanStream``: what DuckDB sees for a table scanned on workers (a fresh distributed run per open)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from sqe._text import first_line
from sqe.distributed.coordinator.job import ScanJob
from sqe.errors import QueryError, SQEError
from sqe.execution.stream import QueryContext

if TYPE_CHECKING:
    from sqe.distributed.coordinator.executor import DistributedExecutor
    from sqe.distributed.coordinator.job import PartialAggregatePlan
    from sqe.execution.local import BatchTransform
    from sqe.planning.planner import ScanPlan
    from sqe.planning.user_filter import UserFilter


class DistributedScanStream:
    """The distributed twin of ``ScanStream``: each ``__arrow_c_stream__`` call runs a fresh distributed scan.

    Workers apply the read-restrictions (with the query's salt); the coordinator only conforms the schema.
    """

    def __init__(
        self,
        plan: ScanPlan,
        executor: DistributedExecutor,
        context: QueryContext,
        partial: PartialAggregatePlan | None = None,
    ) -> None:
        self.plan = plan
        self.partial = partial  # the workers send partial-aggregate rows of this schema instead of the scan's rows
        self.schema: pa.Schema = plan.arrow_schema if partial is None else partial.schema
        self._executor = executor
        self._context = context
        self.query_id = f"q-{uuid.uuid4().hex[:16]}"
        self._runs = itertools.count(1)  # each open is a run of its own (fragment ids differ); next() is atomic

    def __repr__(self) -> str:
        return f"DistributedScanStream({self.plan.ident}, query_id={self.query_id!r})"

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        return self.reader().__arrow_c_stream__(requested_schema)

    def reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.schema, self._batches(next(self._runs)))

    def batches(self, then: BatchTransform | None = None, where: UserFilter | None = None) -> Iterator[pa.RecordBatch]:
        """A fresh distributed run's batches (restricted on the workers, conformed to ``schema``); with ``where``
        (a pass-through query's simple WHERE) only the rows it keeps, filtered by the workers after the
        restrictions; with ``then`` (the query's projection and result types) each batch passed through it, on
        the consumer's thread, strings and binaries arriving with 32-bit offsets (``then`` casts to its own types:
        nothing converts offsets twice). Closing the iterator ends the run (its fragments are cancelled)."""
        batches = self._batches(next(self._runs), then, where)
        try:
            yield from batches
        finally:
            batches.close()

    def _batches(
        self, run: int, then: BatchTransform | None = None, where: UserFilter | None = None
    ) -> Generator[pa.RecordBatch]:
        """The run's batches (each through ``then``); any failure, ``then``'s included, is one recorded SQEError.
        A partial aggregate's WHERE is its plan's (``ScanJob`` refuses a second one beside it)."""
        job = ScanJob(self.plan, self._context, self.query_id, run, self.partial, where, plain_offsets=then is not None)
        scan = self._executor.record_batches(job)
        try:
            for batch in scan:
                yield batch if then is None else then(batch)
        except SQEError as exc:  # including QueryCancelledError
            self._context.record_error(exc)
            raise
        except Exception as exc:
            error = QueryError(f"distributed scan of {self.plan.ident} failed: {first_line(exc, limit=300)}")
            self._context.record_error(error)
            raise error from None
        finally:
            scan.close()  # at once, not when collected: the run's fragments are cancelled
