"""``sqe.worker.v1`` as a wire protocol under attack, both ways, over loopback gRPC.

As a stranger: calls that never send their request must not tie up the worker's server threads. As the
coordinator reading a hostile or buggy worker (a real ``WorkerService`` behind a wrapper that misbehaves): a
worker's error text never carries the coordinator's keys or token into its errors and logs, and a worker that
sends more rows for a file than the file holds never gets them into the answer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sqe.catalog.base import TableIdent
from sqe.config import load_config
from sqe.credentials import CredentialSet
from sqe.distributed.coordinator.client import WorkerClient
from sqe.distributed.coordinator.executor import CoordinatorStats
from sqe.distributed.coordinator.push import CredentialPusher
from sqe.distributed.coordinator.refresh import Holder, RefreshedSets
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol._proto import worker_pb2_grpc
from sqe.distributed.protocol.ipc import decode_schema, encode_schema
from sqe.errors import WorkerError
from sqe.session import Session
from tests.conftest import WorkerFactory
from tests.e2e.test_distributed import (
    ROWS_PER_FILE,
    Tables,
    TicketLog,
    WorkerPools,
    distributed_session,
    reader_config,  # noqa: F401  (the reader's config fixture)
    tables,  # noqa: F401  (the module's tables)
    worker_factory,  # noqa: F401  (the module-scoped pool fixture)
)
from workers.auth import BearerTokenInterceptor
from workers.service import WorkerService

pytestmark = pytest.mark.e2e

HEALTH = "/sqe.worker.v1.Worker/Health"


# ------------------------------------------------------------------------------------ strangers


def test_calls_that_never_send_their_request_do_not_starve_the_worker(worker_process_factory: WorkerFactory) -> None:
    """A stranger opens more calls than the worker has server threads (max fragments + 4) and never sends a request
    message: the worker refuses each at once, so the coordinator's own calls are still answered."""
    worker = worker_process_factory.start("--max-fragments", "2")
    never = threading.Event()

    def no_request() -> Iterator[bytes]:
        never.wait()  # the call stays open, its request never comes
        yield b""

    held: list[Any] = []
    try:
        for _ in range(12):
            channel = grpc.insecure_channel(worker.address)
            worker._channels.append(channel)
            call = channel.stream_unary(HEALTH, request_serializer=bytes, response_deserializer=bytes)
            held.append(call.future(no_request(), metadata=worker.metadata("a-stranger-without-the-token")))
        # Each stranger's call ends (refused) without sending anything; before, each held a server thread.
        for call in held:
            with pytest.raises(grpc.RpcError) as refused:
                call.result(timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = worker.stub().Health(pb.HealthRequest(), metadata=worker.metadata(), timeout=30)
        assert health.status == pb.HealthResponse.SERVING
    finally:
        never.set()
        for call in held:
            call.cancel()
        worker.stop()


# ------------------------------------------------------------------------- hostile or buggy workers


class _MisbehavingWorker:
    """A real ``WorkerService`` behind a worker that misbehaves in one way (``mode``)."""

    def __init__(self, mode: str) -> None:
        self._service = WorkerService()
        self._mode = mode
        self.quoted: list[str] = []  # the secrets it quoted back
        self._received: list[pb.CredentialSet] = []  # the first set of each push, in order

    def Execute(self, request: pb.ScanTicket, context: Any) -> Iterator[pb.ExecuteResponse]:
        if self._mode == "completes-at-once":  # "done", without a schema or a row
            yield pb.ExecuteResponse(complete=pb.Complete())
            return
        if self._mode == "quotes-the-ticket":
            keys = request.credentials[0]
            self.quoted += [keys.secret_access_key, keys.session_token]
            context.abort(grpc.StatusCode.INTERNAL, f"cannot read {keys.secret_access_key} {keys.session_token}")
        secret = request.credentials[0].secret_access_key if request.credentials else ""
        if self._mode == "names-its-partial-schema-after-its-keys" and request.HasField("partial_aggregate"):
            self.quoted.append(secret)
            named = pa.schema([pa.field(secret, pa.int64())])
            yield pb.ExecuteResponse(schema=pb.ArrowSchema(ipc=encode_schema(named), row_positions=False))
            return
        schema = pa.schema([])
        for message in self._service.Execute(request, context):
            response = (
                message if isinstance(message, pb.ExecuteResponse) else pb.ExecuteResponse.FromString(message.data)
            )
            kind = response.WhichOneof("payload")
            if kind == "schema":
                schema = decode_schema(response.schema.ipc)
            if self._mode == "types-a-column-with-its-keys" and kind in ("schema", "batch"):
                self.quoted.append(secret)
                _type_first_column_with(response, schema, secret)
            if self._mode == "crosses-offsets" and kind == "batch":
                response.batch.ipc = _note_offsets_crossed(response.batch.ipc, schema)
            if self._mode == "inflates-partial-counts" and kind == "batch" and request.HasField("partial_aggregate"):
                response.batch.ipc = _counts_times_a_thousand(response.batch.ipc, schema, request.partial_aggregate)
            if self._mode == "compresses-its-batches" and kind == "batch":
                response.batch.ipc = _zstd(response.batch.ipc, schema)
            if self._mode == "sends-batches-before-its-schema" and kind == "schema":
                continue
            if self._mode == "repeats-its-first-column" and kind in ("schema", "batch"):
                _repeat_first_column(response, schema)
            if self._mode == "sends-rows-twice" and kind == "complete":  # consistent with what it sent
                response.complete.rows *= 2
            if self._mode == "drops-partial-rows" and kind in ("batch", "complete"):
                if kind == "batch":
                    continue  # a partial row never sent, and a complete that agrees
                response.complete.rows = 0
            yield response
            if self._mode == "sends-rows-twice" and kind == "batch":  # each batch again, right after itself
                again = pb.ExecuteResponse()
                again.CopyFrom(response)
                again.batch.row_offset += response.batch.num_rows
                yield again

    def RefreshCredentials(self, request: pb.RefreshRequest, context: Any) -> pb.RefreshResponse:
        self._received.append(request.credentials[0])
        # refuses-quoting-the-first: the keys it got first (a ticket's, an earlier push's), not the ones refused
        keys = self._received[0] if self._mode == "refuses-quoting-the-first" else request.credentials[0]
        self.quoted += [keys.secret_access_key, keys.session_token]
        return pb.RefreshResponse(accepted=False, reason=f"refusing {keys.secret_access_key} {keys.session_token}")

    def __getattr__(self, name: str) -> Any:  # Cancel, Health, Stats, Rewrite: as they are
        return getattr(self._service, name)


def _type_first_column_with(response: pb.ExecuteResponse, schema: pa.Schema, name: str) -> None:
    """The schema or batch message with its first column a struct whose one field is called ``name``."""
    field = pa.field(schema.field(0).name, pa.struct([pa.field(name, pa.int64())]))
    if response.WhichOneof("payload") == "schema":
        response.schema.ipc = encode_schema(schema.set(0, field))
        return
    batch = pa.ipc.read_record_batch(pa.py_buffer(response.batch.ipc), schema)
    column = pa.array([{name: 1}] * batch.num_rows, field.type)
    response.batch.ipc = batch.set_column(0, field, column).serialize().to_pybytes()


def _repeat_first_column(response: pb.ExecuteResponse, schema: pa.Schema) -> None:
    """The schema or batch message with its first column once more at the end, under the same name."""
    if response.WhichOneof("payload") == "schema":
        response.schema.ipc = encode_schema(schema.append(schema.field(0)))
        return
    batch = pa.ipc.read_record_batch(pa.py_buffer(response.batch.ipc), schema)
    response.batch.ipc = batch.append_column(schema.field(0), batch.column(0)).serialize().to_pybytes()


def _counts_times_a_thousand(ipc: bytes, schema: pa.Schema, spec: pb.PartialAggregate) -> bytes:
    """The partial batch with every count column (``a<i>`` after the group-by columns) a thousand times larger."""
    batch = pa.ipc.read_record_batch(pa.py_buffer(ipc), schema)
    groups = len(spec.group_by)
    for i, aggregate in enumerate(spec.aggregates):
        if aggregate.function in (pb.AGGREGATE_FUNCTION_COUNT, pb.AGGREGATE_FUNCTION_COUNT_STAR):
            column = pc.multiply(batch.column(groups + i), 1000)
            batch = batch.set_column(groups + i, schema.field(groups + i), column)
    return batch.serialize().to_pybytes()


def _zstd(ipc: bytes, schema: pa.Schema) -> bytes:
    """The batch message written again with zstd body compression (the same rows)."""
    batch = pa.ipc.read_record_batch(pa.py_buffer(ipc), schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_batch(batch)
    reader = pa.ipc.MessageReader.open_stream(sink.getvalue())
    reader.read_next_message()  # the schema
    return bytes(reader.read_next_message().serialize().to_pybytes())


def _note_offsets_crossed(ipc: bytes, schema: pa.Schema) -> bytes:
    """The batch message with its ``note`` column's second offset one past its third: the first value runs into
    the second's bytes and the second has length -1. The offsets' span is unchanged, so only a check of every
    offset sees it."""
    base = pa.py_buffer(ipc)
    column = pa.ipc.read_record_batch(base, schema).column("note")
    width = 8 if pa.types.is_large_string(column.type) else 4
    start = column.buffers()[1].address - base.address + column.offset * width
    data = bytearray(ipc)
    second = int.from_bytes(data[start + 2 * width : start + 3 * width], "little", signed=True)
    data[start + width : start + 2 * width] = (second + 1).to_bytes(width, "little", signed=True)
    return bytes(data)


def _serve(service: _MisbehavingWorker, token: str) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=[BearerTokenInterceptor(token)])
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    return server, address


@contextlib.contextmanager
def _misbehaving_session(mode: str, config_path: Path, token: str) -> Iterator[Session]:
    """A distributed session whose only worker is a ``_MisbehavingWorker`` in ``mode``, stopped afterwards."""
    server, address = _serve(_MisbehavingWorker(mode), token)
    config = load_config(config_path, env={}, overrides={"coordinator": {"workers": [address], "token": token}})
    try:
        with distributed_session(config) as session:
            yield session
    finally:
        server.stop(grace=None)


def _refusal(mode: str, sql: str, config_path: Path, token: str, *, arrow: bool = True) -> str:
    """The ``WorkerError`` text of ``sql`` on a worker misbehaving in ``mode``, read as Arrow (a pass-through read)
    or through DuckDB; the query must give no answer."""
    got: Any = None
    with _misbehaving_session(mode, config_path, token) as session, pytest.raises(WorkerError) as failed:
        relation = session.sql(sql)
        got = relation.arrow() if arrow else relation.fetchall()
    assert got is None
    return str(failed.value)


def test_a_worker_quoting_the_tickets_keys_never_gets_them_into_errors_or_logs(
    reader_config: Path,  # noqa: F811
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    worker = _MisbehavingWorker("quotes-the-ticket")
    server, address = _serve(worker, worker_factory.token)
    overrides = {"coordinator": {"workers": [address], "token": worker_factory.token}}
    config = load_config(reader_config, env={}, overrides=overrides)
    try:
        with distributed_session(config) as session, pytest.raises(WorkerError) as failed:
            log = TicketLog().attach(session)
            session.sql(f"SELECT id FROM {tables.namespace}.events").fetchall()
    finally:
        server.stop(grace=None)
    secrets = log.secrets()
    assert worker.quoted and set(worker.quoted) <= secrets  # it did quote them
    text = f"{failed.value}\n{caplog.text}"
    assert "cannot read [redacted] [redacted]" in text  # the worker's message, without them
    assert not [s for s in secrets | {worker_factory.token} if s in text]


def test_a_refusal_quoting_the_pushed_keys_is_logged_without_them(
    worker_factory: WorkerPools,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, address = _serve(_MisbehavingWorker("refuses-quoting"), worker_factory.token)
    client = WorkerClient(address, worker_factory.token, tls_ca=None, max_message_bytes=1 << 20)
    pushed = pb.CredentialSet(
        prefix="s3://bucket/t",
        access_key_id="AKIAPUSHEDKEY0001",
        secret_access_key="pushed-secret-value-0123456789",
        session_token="pushed-session-token-0123456789",
        expires_at_ms=1,
    )
    stats = CoordinatorStats()
    caplog.set_level(logging.DEBUG)
    try:
        CredentialPusher({address: client}, stats, 5.0).send(
            address, pb.RefreshRequest(fragment_id="f-1", credentials=[pushed])
        )
    finally:
        client.close()
        server.stop(grace=None)
    assert stats.pushes_refused == 1
    assert "refused pushed credentials: refusing [redacted] [redacted]" in caplog.text
    assert pushed.secret_access_key not in caplog.text and pushed.session_token not in caplog.text


def test_a_refusal_quoting_keys_the_worker_got_before_is_logged_without_them(
    reader_config: Path,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two refreshes push two new sets; the worker refuses the second quoting the first. Before, a refusal was
    scrubbed of the keys it refused only, so the first push's secret and token reached the coordinator's log (as
    would a ticket's keys, quoted in a refusal of the first push)."""
    worker = _MisbehavingWorker("refuses-quoting-the-first")
    server, address = _serve(worker, worker_factory.token)
    overrides = {"coordinator": {"workers": [address], "token": worker_factory.token}}
    config = load_config(reader_config, env={}, overrides=overrides)
    issued: list[CredentialSet] = []

    def rotate() -> RefreshedSets:
        n = len(issued)
        issued.append(CredentialSet("s3://bucket/t", f"AKIAROT{n:04d}", f"secret-{n:04d}-x" * 3, f"token-{n:04d}" * 9))
        return RefreshedSets((issued[-1],), None, "credentials-endpoint")

    caplog.set_level(logging.DEBUG)
    try:
        with distributed_session(config) as session:
            executor = session.distributed_executor
            assert executor is not None
            ident = TableIdent("wh", ("ns",), "t")
            lease = executor.refresher.lease("client:u", ident, rotate().credentials, None, rotate)
            executor.refresher.register(lease, Holder(address, "q", "q.f0"))
            executor.refresher.refresh_now(lease)  # pushes the second set: refused, quoting it
            executor.refresher.refresh_now(lease)  # pushes the third: refused, quoting the second
    finally:
        server.stop(grace=None)
    assert executor.stats.pushes_refused == 2
    assert worker.quoted == [issued[1].secret_access_key, issued[1].session_token] * 2  # it did quote them
    assert caplog.text.count("refused pushed credentials: refusing [redacted] [redacted]") == 2
    assert not [v for c in issued for v in (c.secret_access_key, c.session_token) if v and v in caplog.text]


def test_a_worker_sending_more_rows_than_a_file_holds_never_gets_them_into_the_answer(
    reader_config: Path,  # noqa: F811
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
) -> None:
    """It sends every batch twice with consecutive positions and a ``complete`` that counts them all: nothing in
    its own stream contradicts itself, but each file's rows run past the file's record count."""
    got: list[tuple[Any, ...]] = []
    with (
        _misbehaving_session("sends-rows-twice", reader_config, worker_factory.token) as session,
        pytest.raises(WorkerError) as failed,
    ):
        got = session.sql(f"SELECT id FROM {tables.namespace}.events").fetchall()
    assert got == []  # before: twice the table's rows, every one twice, and no error
    assert f"past the {ROWS_PER_FILE} records of its file" in str(failed.value)


def test_a_batch_whose_offsets_cross_is_never_read(
    reader_config: Path,  # noqa: F811
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
) -> None:
    """Before, the coordinator handed such a batch on as it came, and the query returned it (a value of negative
    length; offsets further off have Arrow or DuckDB read outside the message: a crash, or another query's
    bytes in a result)."""
    sql = f"SELECT * FROM {tables.namespace}.events"  # a pass-through read
    refusal = _refusal("crosses-offsets", sql, reader_config, worker_factory.token)
    assert "a batch's buffers do not hold its values" in refusal


def test_a_compressed_batch_is_refused_not_inflated(
    reader_config: Path,  # noqa: F811
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
) -> None:
    """Workers never compress; a compressed batch could state any size (a few KB of zstd inflate to GiB, allocated
    before its rows are counted). Before, the coordinator inflated and answered with it."""
    sql = f"SELECT * FROM {tables.namespace}.events"
    refusal = _refusal("compresses-its-batches", sql, reader_config, worker_factory.token)
    assert "a batch message is compressed" in refusal


def test_a_stream_that_completes_without_its_schema_is_not_taken_for_an_empty_fragment(
    reader_config: Path,  # noqa: F811
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
) -> None:
    """Before, a bare ``complete`` (no schema, no batch, zero rows) committed the fragment: its rows were lost and
    the query answered without them, without an error."""
    sql = f"SELECT count(*) FROM {tables.namespace}.events WHERE id >= 0"
    refusal = _refusal("completes-at-once", sql, reader_config, worker_factory.token, arrow=False)
    assert "completed without sending its schema" in refusal


def test_a_batch_before_its_streams_schema_breaks_the_attempt_which_is_retried(
    reader_config: Path,  # noqa: F811
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
) -> None:
    """A broken stream like one completing without its schema: retried, never read. Before, the first such batch
    failed the whole query at once."""
    got: Any = None
    with _misbehaving_session("sends-batches-before-its-schema", reader_config, worker_factory.token) as session:
        with pytest.raises(WorkerError) as failed:
            got = session.sql(f"SELECT * FROM {tables.namespace}.events").arrow()
        executor = session.distributed_executor
        assert executor is not None and executor.stats.fragments_retried >= 1
    assert got is None
    assert "a batch arrived before the schema" in str(failed.value)


def test_a_batch_naming_a_column_twice_is_refused_as_such(
    reader_config: Path,  # noqa: F811
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
) -> None:
    """Which of two same-named columns is the scan's cannot be told. Before: "coordinator error (KeyError)"."""
    sql = f"SELECT * FROM {tables.namespace}.events"
    refusal = _refusal("repeats-its-first-column", sql, reader_config, worker_factory.token)
    assert "a worker's batch names a column twice" in refusal


def test_an_aggregate_without_group_by_needs_exactly_one_partial_row_per_fragment(
    reader_config: Path,  # noqa: F811
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
) -> None:
    """Before, a worker that sent no partial row (and a ``complete`` counting none) had its fragments drop out of
    the merged count without an error."""
    got: list[tuple[Any, ...]] | None = None
    with (
        _misbehaving_session("drops-partial-rows", reader_config, worker_factory.token) as session,
        pytest.raises(WorkerError) as failed,
    ):
        log = TicketLog().attach(session)
        got = session.sql(f"SELECT count(*) FROM {tables.namespace}.events WHERE id >= 0").fetchall()
    assert log.tickets and all(t.HasField("partial_aggregate") for _, t in log.tickets)  # aggregated on workers
    assert got is None
    assert "0 partial rows for an aggregate of one" in str(failed.value)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT count(*) FROM {ns}.events WHERE id >= 0",
        "SELECT region, count(*), count(note), sum(amount) FROM {ns}.events GROUP BY region",
    ],
)
def test_partial_counts_past_a_fragments_records_never_reach_the_answer(
    query: str,
    reader_config: Path,  # noqa: F811
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
) -> None:
    """A worker whose partial rows count a thousand times the rows it read: before, the merged counts were a
    thousand times the table's, without an error. A fragment's counts can add up to its files' records at most."""
    got: list[tuple[Any, ...]] | None = None
    with (
        _misbehaving_session("inflates-partial-counts", reader_config, worker_factory.token) as session,
        pytest.raises(WorkerError) as failed,
    ):
        log = TicketLog().attach(session)
        got = session.sql(query.format(ns=tables.namespace)).fetchall()
    assert log.tickets and all(t.HasField("partial_aggregate") for _, t in log.tickets)  # aggregated on workers
    assert got is None
    assert "past the" in str(failed.value) and "records of its files" in str(failed.value)


@pytest.mark.parametrize(
    ("mode", "query"),
    [
        ("names-its-partial-schema-after-its-keys", "SELECT count(*) FROM {ns}.events WHERE id >= 0"),
        ("types-a-column-with-its-keys", "SELECT id FROM {ns}.events"),
    ],
)
def test_a_worker_putting_its_keys_into_its_schema_never_gets_them_into_errors_or_logs(
    mode: str,
    query: str,
    reader_config: Path,  # noqa: F811
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker's schema is its text too: the names of a partial-aggregate schema that is not the expected one
    were repeated in the query's error, and a column of a type that does not convert failed the query with Arrow's
    message naming that type, a struct field called after the ticket's secret included."""
    caplog.set_level(logging.DEBUG)
    worker = _MisbehavingWorker(mode)
    server, address = _serve(worker, worker_factory.token)
    overrides = {"coordinator": {"workers": [address], "token": worker_factory.token}}
    config = load_config(reader_config, env={}, overrides=overrides)
    try:
        with distributed_session(config) as session, pytest.raises(WorkerError) as failed:
            log = TicketLog().attach(session)
            session.sql(query.format(ns=tables.namespace)).fetchall()
    finally:
        server.stop(grace=None)
    secrets = log.secrets()
    assert worker.quoted and set(worker.quoted) <= secrets  # it did put them into its schema
    text = f"{failed.value}\n{caplog.text}"
    assert not [s for s in secrets if s in text]
