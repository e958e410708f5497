"""Running fragments: the registry Cancel and RefreshCredentials reach them through, the streaming loop, counters.

A fragment reads its file tasks with the engine's own ``LocalExecutor`` (bounded reader threads and queue) and
applies read-restrictions with the same function as local scans, so a worker's rows equal a local scan's. The
stream is a generator gRPC pulls as the client consumes: when the client is slow, gRPC flow control stops the
pulls, the executor's queue fills and the reader threads wait, so memory stays bounded.

Row positions: every batch names the ticket task it comes from and how many of that task's rows were sent
before it. Each task is read by its own single-file executor run (one reader thread, batches in file order;
pyarrow's scanner yields a file's batches in order), and the row filter and restrictions are row-wise and use
the ticket's salt, so a task's output row sequence is the same on every attempt and every worker. That is what
lets the coordinator forward batches as they arrive and, after a failure, skip what it already forwarded.
Up to ``max_files_in_flight`` tasks are open at once, read in turn.

Partial aggregation (``ScanTicket.partial_aggregate``): the same restricted batches are streamed into a private
DuckDB connection (``sqe.distributed.protocol.partial``) and only its partial rows are sent, without positions.

The user's WHERE (``ScanTicket.user_filter``) runs on the masked values: in the reader threads after the
restrictions, before batches are conformed and sent (it is row-wise and deterministic, so a task's output row
sequence, and with it the row positions, is still the same on every attempt), or in the partial aggregate's
DuckDB query.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import threading
from collections import deque
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import pyarrow as pa

from sqe._counters import Counters
from sqe.credentials import CredentialSet
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import DuplicateFragmentError, InvalidTicketError, WorkerBusyError
from sqe.distributed.protocol.ipc import BatchFrame, batch_frames, encode_batch, encode_schema, plain_offsets
from sqe.distributed.protocol.partial import (
    PartialAggregate,
    PartialInterrupt,
    checked_partial_schema,
    run_partial,
)
from sqe.distributed.protocol.ticket import DecodedTicket, WireTableId
from sqe.errors import QueryResourceError
from sqe.execution.local import BatchTransform, LocalExecutor, QueryCancelledError, ScanMetrics
from sqe.execution.stream import conform_batch
from sqe.planning.planner import build_read_spec, restricted_arrow_schema, restriction_transform
from sqe.planning.user_filter import Mask, UserFilter, UserFilterMismatch, filtering
from workers.fileio import FragmentFileIO

_PROGRESS_SECONDS = 0.25  # how often a partial-aggregate fragment looks for finished files to report

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection as Database
    from pyiceberg.table import FileScanTask

    from sqe.planning.planner import ReadSpec
    from workers.databases import AggregateDatabases


@dataclass
class WorkerStats(Counters):
    """Counters since start. Access key ids are kept only as SHA-256 digests, to count distinct sets used."""

    fragments_started: int = 0
    fragments_completed: int = 0
    fragments_failed: int = 0  # ended by an error (credential_expired_failures counts one kind of them)
    fragments_cancelled: int = 0  # by the coordinator, its client or the RPC's end
    batches_sent: int = 0
    rows_sent: int = 0
    ipc_bytes_sent: int = 0  # Arrow IPC bytes of the batches sent
    files_read: int = 0
    file_bytes_read: int = 0
    refreshes_accepted: int = 0  # credential pushes taken by at least one running fragment
    refreshes_refused: int = 0
    credential_expired_failures: int = 0
    rewrites_started: int = 0  # compaction rewrites (the Rewrite RPC)
    rewrites_completed: int = 0
    rewrite_files_written: int = 0
    _key_digests: set[str] = field(default_factory=set, repr=False)

    def credential_used(self, cred: CredentialSet) -> None:
        digest = hashlib.sha256(cred.access_key_id.encode()).hexdigest()
        with self._lock:
            self._key_digests.add(digest)

    def to_proto(self, running: int) -> pb.StatsResponse:
        counters = self.snapshot()
        with self._lock:
            used = len(self._key_digests)
        return pb.StatsResponse(fragments_running=running, credential_sets_used=used, **counters)


@dataclass(frozen=True)
class _FragmentSource:
    """What ``LocalExecutor`` reads (its ``FileScanSource``): the ticket's tasks with the worker's ReadSpec."""

    tasks: tuple[FileScanTask, ...]
    read: ReadSpec
    ident: str


class _ScopedTicket(Protocol):
    @property
    def query_id(self) -> str: ...

    @property
    def fragment_id(self) -> str: ...

    @property
    def table(self) -> WireTableId: ...


TicketT = TypeVar("TicketT", bound=_ScopedTicket)
FileIOT = TypeVar("FileIOT", bound=FragmentFileIO)


class RunningCall(Generic[TicketT, FileIOT]):
    """One registered call (a scan fragment or a rewrite): its ticket, FileIO and cancel flag."""

    def __init__(self, ticket: TicketT, io: FileIOT, cancel: threading.Event) -> None:
        self.ticket = ticket
        self.io = io
        self.cancel = cancel

    @property
    def fragment_id(self) -> str:
        return self.ticket.fragment_id

    @property
    def query_id(self) -> str:
        return self.ticket.query_id

    def in_scope(self, query_id: str, fragment_id: str, table: WireTableId | None) -> bool:
        """Whether a Cancel/Refresh scope names this call (empty parts match anything; not all empty)."""
        if not (query_id or fragment_id):
            return False
        if query_id and query_id != self.ticket.query_id:
            return False
        if fragment_id and fragment_id != self.ticket.fragment_id:
            return False
        return table is None or table == self.ticket.table


class RunningFragment(RunningCall[DecodedTicket, FragmentFileIO]):
    """One Execute call: its ticket, FileIO, cancel flag and progress."""

    def __init__(self, ticket: DecodedTicket, io: FragmentFileIO, cancel: threading.Event) -> None:
        super().__init__(ticket, io, cancel)
        self.metrics = ScanMetrics()
        self.rows_sent = 0  # rows in the batches streamed so far (read by heartbeats, on another thread)
        try:
            self._read = build_read_spec(ticket.metadata, io, ticket.read_schema, ticket.row_filter)
        except (ValueError, TypeError) as exc:  # the row filter does not bind to the table schema
            raise InvalidTicketError(f"row_filter_json does not fit the table schema ({type(exc).__name__})") from None
        self._schema = restricted_arrow_schema(ticket.read_schema, ticket.output_field_ids, ticket.restrictions)
        # A bad name or an aggregate DuckDB cannot bind fails the ticket before the fragment is registered.
        self._partial_schema = None if ticket.partial is None else checked_partial_schema(ticket.partial, self._schema)
        # A WHERE that does not fit the restricted output fails the ticket too (also when DuckDB will run it).
        self._where = None if ticket.user_filter is None else _compiled(ticket.user_filter, self._schema)

    def stream(
        self,
        executor: LocalExecutor,
        max_message_bytes: int,
        stats: WorkerStats,
        heartbeat_ms: int = 0,
        databases: AggregateDatabases | None = None,
    ) -> Generator[pb.ExecuteResponse | BatchFrame]:
        """Schema, then batches and progress, then ``complete``. Errors propagate to the caller. Batches come as
        ready-serialised frames (the service's serializer sends them as they are). ``heartbeat_ms``: the interval
        the schema message announces (the caller sends the heartbeats, see ``workers.heartbeat``). A partial
        aggregate runs in a database ``databases`` lends it (else the process's shared one)."""
        ticket = self.ticket
        schema = self._schema
        transform = restriction_transform(ticket.restrictions, ticket.read_schema, ticket.output_field_ids, ticket.salt)
        if ticket.partial is not None:  # its DuckDB runs the WHERE (run_partial)
            yield from self._partial_stream(
                ticket.partial, executor, transform, max_message_bytes, stats, heartbeat_ms, databases
            )
            return
        if self._where is not None:  # before the batches are conformed: only the kept rows are converted
            transform = filtering(self._where, first=transform)
        if ticket.plain_offsets:
            schema = plain_offsets(schema)
        yield pb.ExecuteResponse(
            schema=pb.ArrowSchema(ipc=encode_schema(schema), row_positions=True, heartbeat_ms=heartbeat_ms)
        )
        rows = batches = 0
        files_reported = 0
        task_rows = [0] * len(ticket.tasks)
        for index, batch in self._positioned_batches(executor, transform):
            conformed = conform_batch(batch, schema)
            for frame in batch_frames(conformed, max_message_bytes, task_index=index, row_offset=task_rows[index]):
                yield frame
                task_rows[index] += frame.rows
                rows += frame.rows
                self.rows_sent = rows
                batches += 1
                stats.add(batches_sent=1, rows_sent=frame.rows, ipc_bytes_sent=frame.ipc_bytes)
            if self.metrics.files_done != files_reported:
                files_reported = self.metrics.files_done
                yield pb.ExecuteResponse(progress=self._progress(rows))
        yield from self._closing(rows, batches)

    def _partial_stream(
        self,
        partial: PartialAggregate,
        executor: LocalExecutor,
        transform: BatchTransform | None,
        max_message_bytes: int,
        stats: WorkerStats,
        heartbeat_ms: int,
        databases: AggregateDatabases | None,
    ) -> Iterator[pb.ExecuteResponse]:
        """Schema, the fragment's partial rows, ``complete``. The restricted batches (row filter, then masks, as
        in ``stream``) are streamed into DuckDB; the partial rows carry no positions (a retry starts over)."""
        partial_schema = self._partial_schema
        assert partial_schema is not None  # set in __init__ whenever the ticket has a partial aggregate
        schema = pb.ArrowSchema(ipc=encode_schema(partial_schema), row_positions=False, heartbeat_ms=heartbeat_ms)
        yield pb.ExecuteResponse(schema=schema)
        rows = batches = 0
        for batch in self._partial_batches(partial, executor, transform, databases):
            if batch is None:  # a file finished while DuckDB aggregates
                yield pb.ExecuteResponse(progress=self._progress(rows))
                continue
            for data, count in encode_batch(conform_batch(batch, partial_schema), max_message_bytes):
                yield pb.ExecuteResponse(batch=pb.ArrowBatch(ipc=data, num_rows=count))
                rows += count
                self.rows_sent = rows
                batches += 1
                stats.add(batches_sent=1, rows_sent=count, ipc_bytes_sent=len(data))
        yield from self._closing(rows, batches)

    def _closing(self, rows: int, batches: int) -> Iterator[pb.ExecuteResponse]:
        """A stream's last progress message, then ``complete`` with what it sent and read."""
        yield pb.ExecuteResponse(progress=self._progress(rows))
        done = self.metrics.snapshot()
        yield pb.ExecuteResponse(
            complete=pb.Complete(rows=rows, batches=batches, files=done["files_done"], bytes=done["bytes_done"])
        )

    def _partial_batches(
        self,
        partial: PartialAggregate,
        executor: LocalExecutor,
        transform: BatchTransform | None,
        databases: AggregateDatabases | None,
    ) -> Iterator[pa.RecordBatch | None]:
        """The partial rows, with None each time files finished meanwhile. DuckDB pulls the restricted batches on
        a helper thread, so this (gRPC's) thread can report progress while it aggregates. When the call ends
        early or is cancelled, the cancel flag stops the readers, which ends DuckDB's scan, and DuckDB is
        interrupted: a large GROUP BY past its scan would otherwise finalise and produce every partial row for
        no one, holding its database and a core."""
        out: queue.Queue[pa.RecordBatch | BaseException | None] = queue.Queue(maxsize=2)
        interrupt = PartialInterrupt()

        def put(item: pa.RecordBatch | BaseException | None) -> None:
            while not self.cancel.is_set():
                with contextlib.suppress(queue.Full):
                    out.put(item, timeout=_PROGRESS_SECONDS)
                    return

        def aggregate() -> None:
            try:
                with self._database(databases) as database:  # given back only when DuckDB is done with it
                    batches = self._restricted_batches(executor, transform)
                    where = self.ticket.user_filter
                    for batch in run_partial(partial, self._schema, batches, where, database, interrupt):
                        put(batch)
                put(None)  # done
            except QueryResourceError as exc:
                put(self._over_limits(exc, databases))
            except BaseException as exc:  # handed to the stream, which fails the fragment with its kind
                put(exc)

        helper = threading.Thread(target=aggregate, name=f"sqe-partial-{self.fragment_id}", daemon=True)
        helper.start()
        reported = 0
        try:
            while True:
                if self.cancel.is_set():  # the Cancel RPC: no more rows, even those already handed over
                    raise QueryCancelledError()
                try:
                    item = out.get(timeout=_PROGRESS_SECONDS)
                except queue.Empty:
                    if not helper.is_alive() and out.empty():  # it gave up handing over its end: cancelled
                        raise QueryCancelledError() from None
                    if self.metrics.files_done != reported:
                        reported = self.metrics.files_done
                        yield None
                    continue
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel.set()  # the fragment is over either way: stop whatever still reads
            interrupt.interrupt()  # and whatever DuckDB still computes
            helper.join(timeout=10)

    def _database(self, databases: AggregateDatabases | None) -> contextlib.AbstractContextManager[Database | None]:
        return contextlib.nullcontext() if databases is None else databases.lent(self.cancel)

    def _over_limits(self, exc: QueryResourceError, databases: AggregateDatabases | None) -> QueryResourceError:
        """What the coordinator reports after its ``worker W, fragment F:`` (cut to a few hundred characters): the
        limits and the flags that set them first, DuckDB's reason last."""
        limits = "" if databases is None else f" ({databases.describe()})"
        return QueryResourceError(
            f"partial aggregation ran past its DuckDB limits{limits} on this worker (sqe-worker "
            f"--aggregate-memory-bytes / --aggregate-spill-bytes): {exc}"
        )

    def _restricted_batches(
        self, executor: LocalExecutor, transform: BatchTransform | None
    ) -> Iterator[pa.RecordBatch]:
        """The fragment's restricted batches in the restricted schema; closing this closes the file runs."""
        positioned = self._positioned_batches(executor, transform)
        try:
            for _, batch in positioned:
                yield conform_batch(batch, self._schema)
        finally:
            positioned.close()

    def _positioned_batches(
        self, executor: LocalExecutor, transform: BatchTransform | None
    ) -> Generator[tuple[int, pa.RecordBatch]]:
        """``(task index, batch)``: one single-file executor run per task, up to ``max_files_in_flight`` open at
        once and read in turn (a run's own reader thread keeps reading while the others are read)."""
        tasks = self.ticket.tasks
        waiting = deque(range(len(tasks)))
        open_runs: deque[tuple[int, Iterator[pa.RecordBatch]]] = deque()
        try:
            while waiting or open_runs:
                while waiting and len(open_runs) < executor.max_files_in_flight:
                    index = waiting.popleft()
                    source = _FragmentSource((tasks[index],), self._read, f"{self.fragment_id}.t{index}")
                    run = executor.record_batches(source, cancel=self.cancel, transform=transform, metrics=self.metrics)
                    open_runs.append((index, run))
                index, run = open_runs.popleft()
                batch = next(run, None)
                if batch is None:
                    continue  # this task is done
                yield index, batch
                open_runs.append((index, run))
        finally:
            for _, run in open_runs:  # closing a run stops and joins its reader thread
                close = getattr(run, "close", None)
                if close is not None:
                    close()

    def made_progress(self) -> object:
        """What changes whenever the fragment makes progress: a file opened or finished, a batch read or sent."""
        return (*self.metrics.snapshot().values(), self.rows_sent)

    def heartbeat(self) -> pb.ExecuteResponse:
        """A ``progress`` message sent because the fragment progressed without having anything else to send."""
        return pb.ExecuteResponse(progress=self._progress(self.rows_sent))

    def _progress(self, rows: int) -> pb.Progress:
        done = self.metrics.snapshot()
        return pb.Progress(
            files_done=done["files_done"],
            files_total=self.ticket.files_total,
            bytes_done=done["bytes_done"],
            bytes_total=self.ticket.bytes_total,
            rows_sent=rows,
        )


def _compiled(where: UserFilter, schema: pa.Schema) -> Mask:
    """The ticket's WHERE over the restricted output; one that does not fit it fails the ticket."""
    try:
        return where.mask(schema)
    except UserFilterMismatch as exc:
        raise InvalidTicketError(str(exc)) from None


class Registered(Protocol):
    """What the registry holds: scan fragments and rewrites (both reached by Cancel and RefreshCredentials)."""

    @property
    def cancel(self) -> threading.Event: ...

    @property
    def io(self) -> FragmentFileIO: ...

    @property
    def fragment_id(self) -> str: ...

    def in_scope(self, query_id: str, fragment_id: str, table: WireTableId | None) -> bool: ...


class FragmentRegistry:
    """Fragments running on this worker, by id; bounded so control RPCs always find a free server thread."""

    def __init__(self, max_fragments: int) -> None:
        self._max = max_fragments
        self._lock = threading.Lock()
        self._running: dict[str, Registered] = {}

    def register(self, fragment: Registered) -> None:
        with self._lock:
            if fragment.fragment_id in self._running:
                raise DuplicateFragmentError(f"fragment {fragment.fragment_id} is already running on this worker")
            if len(self._running) >= self._max:
                raise WorkerBusyError(f"this worker already runs {self._max} fragments")
            self._running[fragment.fragment_id] = fragment

    def unregister(self, fragment: Registered) -> None:
        with self._lock:
            if self._running.get(fragment.fragment_id) is fragment:
                del self._running[fragment.fragment_id]

    def select(self, query_id: str, fragment_id: str, table: WireTableId | None = None) -> list[Registered]:
        with self._lock:
            fragments = list(self._running.values())
        return [f for f in fragments if f.in_scope(query_id, fragment_id, table)]

    def cancel_all(self) -> int:
        with self._lock:
            fragments = list(self._running.values())
        for fragment in fragments:
            fragment.cancel.set()
        return len(fragments)

    def __len__(self) -> int:
        with self._lock:
            return len(self._running)
