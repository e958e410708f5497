"""One pass of a distributed scan: slot threads run fragments on workers, the caller's thread yields batches.

- **Streaming, no duplicate rows.** A fragment's batches are forwarded to DuckDB as they arrive, so the
  coordinator holds only the batches in flight (``max_queued_batches`` plus one per running fragment), never a
  fragment's output. Workers tag each batch with its ticket task and the task's row offset; a task's output row
  sequence is the same on every attempt (``workers.fragment``), so a fragment that fails after forwarding rows
  is retried on another worker and the retry's rows the coordinator already forwarded are skipped (per task, by
  offset). A failure before the first batch is a plain retry. A stream without positions (a worker that does
  not send them) that fails after forwarding rows fails the query with a ``WorkerError``, as do a retry without
  positions after rows were forwarded and a retry that yields fewer rows for a task than were already
  forwarded: never a duplicated or lost row. A stream that sends more rows for a task than its data file's
  record count (the row filter, masks and deletes only drop rows) is broken before that batch is forwarded.
- **Partial aggregation.** With a ``PartialAggregatePlan`` the tickets carry ``partial_aggregate`` and the
  workers send partial rows without positions: an attempt's batches are held until its ``complete`` arrives
  and only then forwarded, so a failed attempt forwarded nothing and its retry is a plain retry. A stream whose
  schema is not the partial schema the coordinator computed fails the query (``WorkerError``); an attempt of an
  aggregate without GROUP BY that sends other than exactly one partial row failed (it is retried).
- **Credentials.** Each running fragment is registered with the table's lease (``refresh``), which reloads the
  table as the querying user before the usable point and pushes the new set to the workers.
- **Cancel and progress.** Cancelling the query cancels its calls and sends ``Cancel``; per-fragment ``progress``
  messages feed the query's ``ScanMetrics`` (the CLI progress bar).
- **Stalls.** Tickets ask for progress heartbeats (``heartbeat_seconds``); a worker that keeps them sends one after
  each interval in which its fragment progressed with nothing else to send. Its stream, silent for
  ``stall_heartbeats`` intervals, is stalled (a wedged read, a hung store): the call is cancelled and the fragment
  retried elsewhere under the usual rules, the worker staying in the scan. Any stream silent for
  ``idle_timeout_seconds`` also gets its worker health-checked (the only check of an older worker's streams).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import pyarrow as pa
import pyarrow.compute as pc

from sqe._text import counted, first_line
from sqe.credentials import StorageSettings
from sqe.distributed.coordinator.client import WorkerClient
from sqe.distributed.coordinator.credentials import TableCredentials, wire_table_id
from sqe.distributed.coordinator.external import ExternalScanPlan
from sqe.distributed.coordinator.failures import AttemptFailure, classify_rpc_error, secret_values, worker_text
from sqe.distributed.coordinator.fragments import Fragment, plan_fragments
from sqe.distributed.coordinator.job import ScanJob
from sqe.distributed.coordinator.refresh import Holder
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidBatchError
from sqe.distributed.protocol.ipc import ReceivedBatch, decode_batch, decode_schema, plain_offsets
from sqe.distributed.protocol.ticket import build_ticket, trim_metadata
from sqe.errors import QueryError, SQEError, WorkerError
from sqe.execution.local import QueryCancelledError, ScanMetrics
from sqe.execution.stream import conform_batch

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata

    from sqe.distributed.coordinator.executor import DistributedExecutor
    from sqe.distributed.coordinator.job import PartialAggregatePlan

log = logging.getLogger(__name__)

# How long a run that ends waits for the workers' answers to its Cancel calls, all together: a live worker answers
# in milliseconds; one that does not answer has its calls cancelled already and is not waited for.
_CANCEL_WAIT_SECONDS = 1.0


@dataclass
class _FragmentState:
    fragment: Fragment
    attempts: int = 0
    failed_on: set[str] = field(default_factory=set)
    last_failure: str = ""
    forwarded: dict[int, int] = field(default_factory=dict)  # task index -> leading rows already handed to DuckDB
    forwarded_rows: int = 0
    unpositioned: bool = False  # rows were forwarded from a stream without positions: they cannot be skipped


class _StreamBroken(Exception):
    """A stream that contradicts its own positions: the attempt fails (what was forwarded stays exact)."""


class _WrongPartialSchema(Exception):
    """A partial-aggregate stream whose schema is not the one the coordinator computed: the query fails."""


class _CannotResume(Exception):
    """A retry without row positions of a fragment that already forwarded rows: the query fails (its rows could
    not be told from those already forwarded)."""


@dataclass
class _Attempt:
    """One run of a fragment on a worker; owned by the slot thread that started it."""

    fragment_id: str
    worker: str
    call: Any = None
    waiting_since: float | None = None  # set while the slot thread waits for the next message
    timed_out: bool = False
    # With heartbeats (the worker confirmed them in its schema message): the silence after which it is stalled.
    silence_limit: float | None = None
    stalled: bool = False
    health_checked: float = 0.0  # when a health check last found the worker answering during this silence
    health_pending: bool = False  # a health check is on its way (answered on a gRPC thread)
    files_done: int = 0
    bytes_done: int = 0
    received: dict[int, int] = field(default_factory=dict)  # task index -> rows this attempt sent
    rows_received: int = 0
    held: list[pa.RecordBatch] = field(default_factory=list)  # partial rows, forwarded once the attempt completes


def _health_answered(attempt: _Attempt, check: Any) -> None:
    """An idle health check's answer (on a gRPC thread). Unanswered: the call ends (and is retried elsewhere).
    Answered: the worker is alive, just slow (a slow store, a paced worker), and is checked again after another
    idle_timeout_seconds; the silence itself goes on (waiting_since stays): it is what the stall limit measures."""
    try:
        check.result()
    except grpc.FutureCancelledError:
        pass  # a cancelled check says nothing of the worker
    except grpc.RpcError:
        attempt.timed_out = True
        if attempt.call is not None:
            attempt.call.cancel()
    else:
        attempt.health_checked = time.monotonic()
    attempt.health_pending = False


class ScanRun:
    """One pass over a plan: slot threads run fragments on workers, the caller's thread yields committed batches."""

    def __init__(self, executor: DistributedExecutor, job: ScanJob) -> None:
        self._executor = executor
        plan, partial = job.plan, job.partial
        self._job = job
        # A partial aggregate's rows have their own schema: plain offsets apply to scanned rows only.
        self._plain_offsets = job.plain_offsets and partial is None
        self._out_schema = partial.schema if partial is not None else plan.arrow_schema
        if self._plain_offsets:
            self._out_schema = plain_offsets(self._out_schema)  # as the workers send it: nothing to convert
        self._options = executor.options
        self._plan = plan
        self._partial = partial
        self._context = job.context
        self._metrics: ScanMetrics = job.context.metrics
        self._fragments = plan_fragments(
            plan.tasks,
            slots=len(executor.clients) * self._options.slots_per_worker,
            max_files=self._options.max_files_per_fragment,
            max_bytes=self._options.max_bytes_per_fragment,
        )
        self._pending: list[_FragmentState] = [_FragmentState(f) for f in self._fragments]
        self._committed = 0
        self._live_workers = {c.address for c in executor.clients}
        self._running: dict[str, _Attempt] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._error: SQEError | None = None
        # Batches, then None once the last fragment committed (after all of its batches): the consumer ends at
        # once instead of waiting out a poll interval.
        self._output: queue.Queue[pa.RecordBatch | None] = queue.Queue(self._options.max_queued_batches)
        self._credentials: TableCredentials | None = None
        self._metadata_json = b""
        self._watched_at = 0.0  # when the consumer last looked for silent streams

    def _table_metadata(self) -> TableMetadata:
        """An Iceberg table's loaded metadata, or an external table's synthesized one."""
        plan = self._plan
        return plan.metadata if isinstance(plan, ExternalScanPlan) else plan.loaded.table.metadata

    # -- consumer ----------------------------------------------------------------------------------------

    def batches(self) -> Generator[pa.RecordBatch]:
        if self._context.cancel.is_set():
            raise QueryCancelledError()
        self._metrics.add(scans_opened=1, files_total=len(self._plan.tasks))
        if not self._fragments:
            return
        self._credentials = self._executor.table_credentials(self._plan)
        self._metadata_json = trim_metadata(self._table_metadata())
        threads = [
            threading.Thread(target=self._slot, args=(client,), name=f"sqe-fragment-{client.address}", daemon=True)
            for client in self._executor.clients
            for _ in range(self._options.slots_per_worker)
        ]
        for thread in threads:
            thread.start()
        try:
            yield from self._consume()
        finally:
            self._shutdown(threads)

    def _consume(self) -> Iterator[pa.RecordBatch]:
        while True:
            if self._context.cancel.is_set():
                raise QueryCancelledError()
            with self._cond:
                if self._error is not None:
                    raise self._error
                finished = self._committed == len(self._fragments)
            try:
                batch = self._output.get(timeout=self._options.poll_seconds)
            except queue.Empty:
                if finished:
                    return
                self._watch_idle()
                continue
            self._watch_now_and_then()  # one stalled stream among busy ones is found too
            if batch is None:  # every fragment committed and every batch was taken
                with self._cond:
                    if self._error is not None:
                        raise self._error
                return
            self._metrics.add(batches_in_flight=-1)
            yield batch

    def _shutdown(self, threads: Sequence[threading.Thread]) -> None:
        self._stop.set()
        with self._cond:
            running = list(self._running.values())
            self._cond.notify_all()
        for attempt in running:
            if attempt.call is not None:
                attempt.call.cancel()
        # The worker may not notice a cancelled call at once: say so explicitly, to all at once, waiting a moment
        # for the answers but never a worker's full RPC timeout (a frozen one would hold up the caller's thread).
        sent = [self._send_cancel(attempt) for attempt in running]
        deadline = time.monotonic() + min(_CANCEL_WAIT_SECONDS, self._options.rpc_timeout_seconds)
        for future in sent:
            with contextlib.suppress(grpc.RpcError, grpc.FutureTimeoutError, grpc.FutureCancelledError):
                future.result(timeout=max(0.0, deadline - time.monotonic()))
        while True:
            try:
                if self._output.get_nowait() is not None:
                    self._metrics.add(batches_in_flight=-1)
            except queue.Empty:
                break
        for thread in threads:
            thread.join(timeout=self._options.poll_seconds)

    def _send_cancel(self, attempt: _Attempt) -> Any:
        """The Cancel call under way (a future); a dead worker has nothing left to cancel."""
        client = self._executor.client_for(attempt.worker)
        request = pb.CancelRequest(query_id=self._job.query_id, fragment_id=attempt.fragment_id)
        return client.cancel(request, timeout=self._options.rpc_timeout_seconds)

    def _watch_now_and_then(self) -> None:
        if time.monotonic() - self._watched_at >= self._options.poll_seconds:
            self._watch_idle()

    def _watch_idle(self) -> None:
        """A heartbeat stream silent past its limit is stalled: its call ends. A stream silent for
        idle_timeout_seconds: health-check its worker; an unanswered check ends the call. The check runs on
        gRPC's threads: this (the caller's) thread goes on handing out batches and noticing a cancel meanwhile."""
        now = self._watched_at = time.monotonic()
        with self._cond:
            waiting = [a for a in self._running.values() if a.waiting_since is not None]
        silent: list[_Attempt] = []
        for attempt in waiting:
            since = attempt.waiting_since
            if since is None:  # a message arrived meanwhile
                continue
            if attempt.silence_limit is not None and now - since > attempt.silence_limit:
                attempt.stalled = True
                if attempt.call is not None:
                    attempt.call.cancel()
            elif (
                not attempt.health_pending
                and now - max(since, attempt.health_checked) > self._options.idle_timeout_seconds
            ):
                silent.append(attempt)  # is the worker there at all?
        for attempt in silent:
            attempt.health_pending = True
            client = self._executor.client_for(attempt.worker)
            check = client.health_future(timeout=self._options.rpc_timeout_seconds)
            check.add_done_callback(functools.partial(_health_answered, attempt))

    # -- slot threads -------------------------------------------------------------------------------------

    def _slot(self, client: WorkerClient) -> None:
        try:
            while not self._stop.is_set():
                state = self._take(client.address)
                if state is None:
                    return
                if not self._run_fragment(client, state):
                    return
        except BaseException as exc:  # a bug here must fail the query, not hang it
            self._fail(
                exc if isinstance(exc, SQEError) else WorkerError(f"coordinator error: {first_line(exc, limit=300)}")
            )

    def _take(self, worker: str) -> _FragmentState | None:
        """The largest waiting fragment this worker has not failed, or None when the scan is over."""
        with self._cond:
            while not self._stop.is_set() and self._error is None:
                if worker not in self._live_workers:
                    return None
                state = self._pick(worker)
                if state is not None:
                    self._pending.remove(state)
                    return state
                if self._committed == len(self._fragments):
                    return None
                self._cond.wait(timeout=self._options.poll_seconds * 4)
            return None

    def _pick(self, worker: str) -> _FragmentState | None:
        for state in self._pending:
            others = self._live_workers - state.failed_on - {worker}
            if worker not in state.failed_on or not others:
                return state
        return None

    def _run_fragment(self, client: WorkerClient, state: _FragmentState) -> bool:
        """Run one attempt; False when this worker is gone and its slot should stop."""
        state.attempts += 1
        job = self._job
        attempt = _Attempt(f"{job.query_id}.{job.run}.f{state.fragment.index}.a{state.attempts}", client.address)
        holder = Holder(client.address, job.query_id, attempt.fragment_id)
        retried = state.attempts > 1
        resumed = retried and state.forwarded_rows > 0
        self._executor.stats.add(fragments_started=1, fragments_retried=int(retried), fragments_resumed=int(resumed))
        with self._cond:
            self._running[attempt.fragment_id] = attempt
        try:
            failure = self._execute(client, state, attempt, holder)
        finally:
            with self._cond:
                self._running.pop(attempt.fragment_id, None)
            if self._credentials is not None and self._credentials.lease is not None:
                self._executor.refresher.unregister(self._credentials.lease, holder)
        if failure is None:
            self._commit(state, attempt)
            return True
        self._uncount(attempt)
        return self._handle_failure(client.address, state, failure)

    def _execute(
        self, client: WorkerClient, state: _FragmentState, attempt: _Attempt, holder: Holder
    ) -> AttemptFailure | None:
        ticket, generation = self._ticket(state.fragment, attempt, holder)
        for observer in self._executor.ticket_observers:
            observer(client.address, ticket)
        where = f"worker {client.address}, fragment {attempt.fragment_id}"
        try:
            attempt.call = client.execute(ticket)
            if self._stop.is_set():
                attempt.call.cancel()
            complete = self._receive(state, attempt, generation, holder)
        except grpc.RpcError as exc:
            if self._stop.is_set():
                return AttemptFailure("cancelled")
            if attempt.stalled:
                self._send_cancel(attempt)  # the call's end reaches the worker; say it again, explicitly
                return AttemptFailure(f"{where}: stalled, no progress for {attempt.silence_limit:g} s")
            secrets = self._secrets_sent(client, ticket)
            return classify_rpc_error(exc, client.address, attempt.fragment_id, attempt.timed_out, secrets)
        except (_StreamBroken, InvalidBatchError) as exc:  # nothing of the bad message was forwarded
            attempt.call.cancel()
            return AttemptFailure(self._worker_said(client, ticket, f"{where}: {exc}"))
        except (_WrongPartialSchema, _CannotResume) as exc:
            attempt.call.cancel()
            message = self._worker_said(client, ticket, f"{where}: {exc}")
            return AttemptFailure(message, fatal=WorkerError(message))
        if complete is None:
            return AttemptFailure(f"{where}: stream ended early")
        if complete.rows != attempt.rows_received:
            return AttemptFailure(
                f"{where}: worker reported {counted(complete.rows, 'row')}, sent {attempt.rows_received}"
            )
        if self._partial is not None and not self._partial.spec.group_by and attempt.rows_received != 1:
            # Without GROUP BY a fragment's partial is exactly one row (count 0 over no rows): none would drop the
            # fragment from the merged answer, two would count it twice.
            return AttemptFailure(f"{where}: {counted(attempt.rows_received, 'partial row')} for an aggregate of one")
        if self._partial is not None:
            overcount = _partial_overcount(self._partial, attempt.held, state.fragment.records)
            if overcount:
                return AttemptFailure(f"{where}: {overcount}")
        return self._check_repeatable(state, attempt, where)

    def _worker_said(self, client: WorkerClient, ticket: pb.ScanTicket, text: str) -> str:
        """A failure's text that quotes what the worker sent (its schema's names and types, Arrow's message about
        its batch), as errors and logs repeat it: scrubbed like the worker's own error text."""
        return worker_text(text, self._secrets_sent(client, ticket))

    def _secrets_sent(self, client: WorkerClient, ticket: pb.ScanTicket) -> frozenset[str]:
        """What this worker was given and must not quote back: the ticket's keys, the table's current (pushed)
        keys and the coordinator's token."""
        table = self._credentials.secret_values() if self._credentials is not None else frozenset()
        return secret_values(ticket.credentials) | table | client.secret_values()

    def _check_repeatable(self, state: _FragmentState, attempt: _Attempt, where: str) -> AttemptFailure | None:
        """A retry must reproduce at least every row it skipped: otherwise its output differs from the first
        attempt's and the rows already forwarded may not be the ones it would have sent."""
        for index, forwarded in state.forwarded.items():
            sent = attempt.received.get(index, 0)
            if sent < forwarded:
                message = (
                    f"{where}: task {index} gave {counted(sent, 'row')} on attempt {state.attempts}, fewer than the "
                    f"{forwarded} already forwarded; the fragment's output is not repeatable, failing the query "
                    "rather than returning wrong rows"
                )
                return AttemptFailure(message, fatal=WorkerError(message))
        return None

    def _receive(self, state: _FragmentState, attempt: _Attempt, generation: int, holder: Holder) -> pb.Complete | None:
        """Read one attempt's stream, forwarding its batches; its ``complete``, or None if the stream (or the
        query) ended first."""
        schema: pa.Schema | None = None
        positioned = False
        stream = iter(attempt.call)
        while True:
            attempt.waiting_since = time.monotonic()
            try:
                message = next(stream)
            except StopIteration:
                return None
            finally:
                attempt.waiting_since = None
            if isinstance(message, ReceivedBatch):  # the common case, parsed without protobuf
                if not self._forward_batch(state, attempt, schema, positioned, message):
                    return None  # the query is over
                continue
            kind = message.WhichOneof("payload")
            if kind == "schema":
                schema = decode_schema(message.schema.ipc)
                positioned = message.schema.row_positions
                if message.schema.heartbeat_ms:  # the worker keeps heartbeats: silence now means a stall
                    attempt.silence_limit = message.schema.heartbeat_ms / 1000.0 * self._options.stall_heartbeats
                self._check_partial_schema(schema)
                if not positioned and self._partial is None and state.forwarded_rows:
                    # Checked before any batch: a check at the stream's end comes after its rows were forwarded.
                    raise _CannotResume(
                        f"the retry sends no row positions but {state.forwarded_rows} rows of this fragment were "
                        "already forwarded; failing rather than duplicating rows"
                    )
                self._catch_up(holder, generation)
            elif kind == "batch":
                if not self._forward_batch(state, attempt, schema, positioned, message.batch):
                    return None  # the query is over
            elif kind == "progress":
                self._count(attempt, message.progress.files_done, message.progress.bytes_done)
            elif kind == "complete":
                if schema is None:  # a stream always starts with its schema: this one read nothing at all
                    raise _StreamBroken("the stream completed without sending its schema")
                complete: pb.Complete = message.complete
                self._count(attempt, complete.files, complete.bytes)
                return complete

    def _forward_batch(
        self,
        state: _FragmentState,
        attempt: _Attempt,
        schema: pa.Schema | None,
        positioned: bool,
        message: pb.ArrowBatch | ReceivedBatch,
    ) -> bool:
        """Decode and forward one batch message (a partial aggregate's is held until ``complete``: it has no
        positions to skip by); False if the query is over."""
        if schema is None:  # a broken stream, as one that completes without its schema: retried elsewhere
            raise _StreamBroken("a batch arrived before the schema")
        batch = decode_batch(message.ipc, schema)
        if self._partial is not None:
            attempt.held.append(batch)
            attempt.rows_received += batch.num_rows
            return True
        if positioned:
            return self._forward_positioned(state, attempt, message, batch)
        return self._forward_unpositioned(state, attempt, batch)

    def _check_partial_schema(self, schema: pa.Schema) -> None:
        if self._partial is not None and not schema.equals(self._partial.schema):
            raise _WrongPartialSchema(
                f"the worker's partial-aggregate schema ({_names_and_types(schema)}) is not the expected "
                f"({_names_and_types(self._partial.schema)})"
            )

    def _forward_positioned(
        self, state: _FragmentState, attempt: _Attempt, message: pb.ArrowBatch | ReceivedBatch, batch: pa.RecordBatch
    ) -> bool:
        """Forward the rows of ``batch`` not forwarded by an earlier attempt; False if the query is over."""
        index, offset = message.task_index, message.row_offset
        if not 0 <= index < state.fragment.files:
            raise _StreamBroken(f"a batch names task {index} of a {state.fragment.files}-task ticket")
        if offset != attempt.received.get(index, 0):
            raise _StreamBroken(f"task {index}: a batch at row {offset} after {attempt.received.get(index, 0)} rows")
        end = offset + batch.num_rows
        records = state.fragment.tasks[index].file.record_count
        if end > records:  # row filters, masks and deletes only ever drop rows: these are not the task's rows
            raise _StreamBroken(f"task {index}: a batch ends at row {end}, past the {records} records of its file")
        attempt.received[index] = end
        attempt.rows_received += batch.num_rows
        skip = min(batch.num_rows, max(0, state.forwarded.get(index, 0) - offset))
        if skip:
            self._executor.stats.add(rows_skipped=skip)
        if skip == batch.num_rows:
            return True
        if not self._put(attempt, batch.slice(skip) if skip else batch):
            return False
        state.forwarded[index] = end
        state.forwarded_rows += batch.num_rows - skip
        return True

    def _forward_unpositioned(self, state: _FragmentState, attempt: _Attempt, batch: pa.RecordBatch) -> bool:
        records, rows = state.fragment.records, attempt.rows_received + batch.num_rows
        if rows > records:  # as in _forward_positioned, for the whole fragment
            raise _StreamBroken(f"{rows} rows, past the {records} records of its files")
        attempt.rows_received += batch.num_rows
        state.unpositioned = True  # set first: a failure during the put must not be retried
        if not self._put(attempt, batch):
            return False
        state.forwarded_rows += batch.num_rows
        return True

    def _put(self, attempt: _Attempt, batch: pa.RecordBatch) -> bool:
        """Hand one batch to the consumer (blocking while its queue is full); False once the query is over."""
        out = conform_worker_batch(batch, self._out_schema)
        self._metrics.add(batches_in_flight=1, batches_produced=1, rows_produced=out.num_rows)
        while not self._stop.is_set():
            try:
                self._output.put(out, timeout=self._options.poll_seconds)
            except queue.Full:
                continue
            self._executor.stats.add(batches_forwarded=1, rows_forwarded=out.num_rows)
            for observer in self._executor.batch_observers:
                observer(attempt.worker, attempt.fragment_id, out.num_rows)
            return True
        self._metrics.add(batches_in_flight=-1)
        return False

    def _catch_up(self, holder: Holder, generation: int) -> None:
        """The worker knows the fragment now: if a refresh happened since its ticket was built, push it again."""
        table = self._credentials
        if table is None or table.lease is None:
            return
        credentials, current = self._executor.refresher.current(table.lease)
        if current != generation:
            self._executor.pusher.push_to_fragment(holder, table.ident, credentials)

    def _ticket(self, fragment: Fragment, attempt: _Attempt, holder: Holder) -> tuple[pb.ScanTicket, int]:
        table = self._credentials
        assert table is not None
        generation = 0
        vended = table.vended
        if table.lease is not None:
            vended, generation = self._executor.refresher.register(table.lease, holder)
        credentials = table.for_fragment(fragment, vended)
        plan = self._plan
        policy = self._executor.policy
        ticket = build_ticket(
            query_id=self._job.query_id,
            fragment_id=attempt.fragment_id,
            table=wire_table_id(plan.ident),
            metadata=self._table_metadata(),
            metadata_json=self._metadata_json,
            read_schema=plan.read.projected_schema,
            output_field_ids=plan.output_field_ids,
            tasks=fragment.tasks,
            credentials=credentials,
            restrictions=plan.restrictions,
            salt=self._context.salt,
            row_filter=plan.row_filter,
            storage=StorageSettings(policy.endpoint, policy.region, policy.path_style),
            pace_ms_per_file=self._options.pace_ms_per_file,
            partial=self._partial.spec if self._partial is not None else None,
            user_filter=self._job.user_filter,
            plain_offsets=self._plain_offsets,
        )
        ticket.heartbeat_ms = round(self._options.heartbeat_seconds * 1000)
        return ticket, generation

    # -- outcomes -------------------------------------------------------------------------------------------

    def _commit(self, state: _FragmentState, attempt: _Attempt) -> None:
        """The fragment completed (its batches were forwarded as they came; partial rows are forwarded now)."""
        held, attempt.held = attempt.held, []
        for batch in held:
            if not self._put(attempt, batch):
                return  # the query is over
        self._count(attempt, state.fragment.files, state.fragment.nbytes)
        self._executor.stats.add(fragments_completed=1)
        with self._cond:
            self._committed += 1
            last = self._committed == len(self._fragments)
            self._cond.notify_all()
        if last:
            self._wake_consumer()

    def _wake_consumer(self) -> None:
        """Queue the end marker behind the last batch (blocking while the queue is full, until the query stops)."""
        while not self._stop.is_set():
            try:
                self._output.put(None, timeout=self._options.poll_seconds)
            except queue.Full:
                continue
            return

    def _count(self, attempt: _Attempt, files_done: int, bytes_done: int) -> None:
        """Progress of one attempt, as deltas on the query's metrics (files and bytes done, per fragment)."""
        files_delta = max(0, files_done - attempt.files_done)
        bytes_delta = max(0, bytes_done - attempt.bytes_done)
        if files_delta or bytes_delta:
            attempt.files_done += files_delta
            attempt.bytes_done += bytes_delta
            self._metrics.add(files_done=files_delta, bytes_done=bytes_delta)

    def _uncount(self, attempt: _Attempt) -> None:
        """A failed attempt's progress is taken back: its fragment starts over."""
        if attempt.files_done or attempt.bytes_done:
            self._metrics.add(files_done=-attempt.files_done, bytes_done=-attempt.bytes_done)

    def _handle_failure(self, worker: str, state: _FragmentState, failure: AttemptFailure) -> bool:
        if self._stop.is_set():
            return False
        if failure.fatal is not None:
            self._fail(failure.fatal)
            return False
        if failure.busy:
            state.attempts -= 1  # not the fragment's fault
            self._requeue(state)
            time.sleep(self._options.busy_retry_seconds)
            return True
        if state.unpositioned:
            self._fail(
                WorkerError(
                    f"a fragment of {self._plan.ident} failed after streaming "
                    f"{counted(state.forwarded_rows, 'row')} from a worker that sends no row positions; failing "
                    f"rather than duplicating rows (last: {failure.message})"
                )
            )
            return False
        log.warning("fragment of %s will be retried: %s", self._plan.ident, failure.message)
        state.failed_on.add(worker)
        state.last_failure = failure.message
        with self._cond:
            if failure.worker_dead:
                self._live_workers.discard(worker)
            if state.attempts >= self._options.max_attempts:
                self._fail_locked(
                    WorkerError(
                        f"a fragment of {self._plan.ident} failed {counted(state.attempts, 'time')}, giving up "
                        f"(last: {failure.message})"
                    )
                )
                return False
            if not self._live_workers:
                self._fail_locked(WorkerError(f"no worker left to scan {self._plan.ident} (last: {failure.message})"))
                return False
        self._requeue(state)
        return not failure.worker_dead

    def _requeue(self, state: _FragmentState) -> None:
        with self._cond:
            self._pending.append(state)
            self._pending.sort(key=lambda s: -s.fragment.nbytes)
            self._cond.notify_all()

    def _fail(self, error: SQEError) -> None:
        with self._cond:
            self._fail_locked(error)

    def _fail_locked(self, error: SQEError) -> None:
        if self._error is None:
            self._error = error
        self._cond.notify_all()


def _partial_overcount(partial: PartialAggregatePlan, held: Sequence[pa.RecordBatch], records: int) -> str:
    """Why a fragment's partial rows count more rows than its files hold ("" when they do not): a group is at least
    one row, and a count adds up to the fragment's rows at most (the row filter, masks, deletes and the WHERE only
    drop rows), so more would inflate the merged answer. Without GROUP BY the one row over no rows is allowed."""
    groups = len(partial.spec.group_by)
    rows = sum(batch.num_rows for batch in held)
    if groups and rows > records:
        return f"{counted(rows, 'partial row')}, past the {records} records of its files"
    for index, (function, _column) in enumerate(partial.spec.aggregates):
        if function not in ("count_star", "count"):
            continue
        total = 0
        for batch in held:
            column = batch.column(groups + index)
            if column.null_count == len(column):
                continue
            lowest = pc.min(column).as_py()
            total += int(pc.sum(column.cast(pa.decimal128(38, 0))).as_py())  # exact, whatever the worker sent
            if lowest is None or lowest < 0:
                return f"a partial count below zero ({function} #{index})"
        if total > records:
            return f"partial counts of {total} rows ({function} #{index}), past the {records} records of its files"
    return ""


def _names_and_types(schema: pa.Schema) -> str:
    return ", ".join(f"{field.name} {field.type}" for field in schema)[:500]


def conform_worker_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Worker batches in the scan's Arrow schema (the same shape the local path hands DuckDB)."""
    if batch.schema.names != schema.names:
        if len(set(batch.schema.names)) != batch.num_columns:  # which of two same-named columns is the scan's?
            raise InvalidBatchError("a worker's batch names a column twice")
        missing = [name for name in schema.names if name not in batch.schema.names]
        if missing:
            raise QueryError(f"a worker returned batches without the column(s) {', '.join(missing)}")
        batch = batch.select(schema.names)
    try:
        return conform_batch(batch, schema)
    except (pa.ArrowException, ValueError):
        # Arrow's message names the worker's types, and with them any struct field name it chose: not repeated.
        raise InvalidBatchError("a worker's batch does not convert to the scan's schema") from None
