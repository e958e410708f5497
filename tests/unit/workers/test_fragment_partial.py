"""Partial aggregation in a fragment run in-process on real local Iceberg tables: partial rows, restrictions,
rejected tickets and errors that keep their own kind."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

import duckdb
import pyarrow as pa
import pytest

from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidTicketError
from sqe.distributed.protocol.ipc import decode_batch, decode_schema
from sqe.distributed.protocol.partial import (
    PartialAggregate,
    PartialInterrupt,
    open_database,
    partial_types,
    run_partial,
)
from sqe.distributed.protocol.ticket import decode_ticket
from sqe.duckdb_connection import DatabaseLimits
from sqe.execution.local import LocalExecutor, QueryCancelledError
from tests.unit.sqe.iceberg_local import local_catalog
from tests.unit.workers.test_fragment import local_reference
from tests.unit.workers.worker_fixtures import LocalTables, restriction_plan, ticket_for
from workers.fileio import FragmentFileIO
from workers.fragment import RunningFragment, WorkerStats

GROUPED = PartialAggregate(
    ("grp",),
    (("count_star", ""), ("count", "label"), ("sum", "id"), ("min", "label"), ("max", "day")),
)


def _with_partial(ticket: pb.ScanTicket, partial: pb.PartialAggregate) -> pb.ScanTicket:
    ticket.partial_aggregate.CopyFrom(partial)
    return ticket


def run(ticket: pb.ScanTicket) -> tuple[pa.Table, list[pb.ExecuteResponse]]:
    decoded = decode_ticket(ticket)
    cancel = threading.Event()
    io = FragmentFileIO(
        decoded.credentials, decoded.storage, cancel=cancel, allow_local=True, pace_seconds=decoded.pace_seconds
    )
    fragment = RunningFragment(decoded, io, cancel)
    messages = list(fragment.stream(LocalExecutor(max_files_in_flight=2), 1 << 20, WorkerStats()))
    schema = decode_schema(messages[0].schema.ipc)
    batches = [decode_batch(m.batch.ipc, schema) for m in messages if m.WhichOneof("payload") == "batch"]
    return pa.Table.from_batches(batches, schema=schema), messages


def _duckdb_reference(rows: pa.Table, spec: PartialAggregate) -> pa.Table:
    con = duckdb.connect()
    con.register("__sqe_fragment", rows)
    return con.sql(spec.sql()[0]).to_arrow_table()


def _sorted(table: pa.Table) -> list[tuple[object, ...]]:
    return sorted(tuple(row.values()) for row in table.to_pylist())


def test_a_partial_fragment_sends_one_row_per_group_without_positions(local_tables: LocalTables) -> None:
    table = local_tables.events
    result, messages = run(_with_partial(ticket_for(table), GROUPED.to_proto()))
    expected = _duckdb_reference(table.scan().to_arrow(), GROUPED)
    assert result.schema.names == ["g0", "a0", "a1", "a2", "a3", "a4"]
    assert result.schema == partial_types(GROUPED, table.schema().as_arrow())[0]
    assert _sorted(result) == _sorted(expected) and result.num_rows == 5
    assert messages[0].schema.row_positions is False
    complete = messages[-1].complete
    assert (complete.rows, complete.files) == (5, 5)


def test_partial_rows_are_computed_on_restricted_values(local_tables: LocalTables) -> None:
    """Row filter on raw values, then the mask, then the aggregate: min/max see only masked labels."""
    table = local_tables.events
    raw = {
        "required-column-projections": [{"field-id": 4, "action": "mask-alphanum"}],
        "required-row-filter": {"type": "lt", "left": {"type": "reference", "id": 1}, "right": 1000},
    }
    plan = restriction_plan(table, raw)
    spec = PartialAggregate((), (("count_star", ""), ("min", "label"), ("max", "label"), ("sum", "id")))
    result, _ = run(_with_partial(ticket_for(table, plan=plan, salt=bytes(range(16))), spec.to_proto()))
    expected = _duckdb_reference(local_reference(table, plan), spec)
    assert result.to_pylist() == expected.to_pylist()
    [row] = result.to_pylist()
    assert row["a0"] == 1000 and row["a3"] == sum(range(1000))
    assert row["a1"].startswith("x") and row["a2"].startswith("x")  # masked values, never a raw label


def test_an_unknown_column_is_an_invalid_ticket(local_tables: LocalTables) -> None:
    spec = pb.PartialAggregate(
        group_by=["grp"], aggregates=[pb.Aggregate(function=pb.AGGREGATE_FUNCTION_SUM, column="nope")]
    )
    ticket = decode_ticket(_with_partial(ticket_for(local_tables.events), spec))
    cancel = threading.Event()
    io = FragmentFileIO(ticket.credentials, ticket.storage, cancel=cancel, allow_local=True)
    with pytest.raises(InvalidTicketError, match="not in the restricted output: 'nope'"):
        RunningFragment(ticket, io, cancel)


def test_an_aggregate_duckdb_cannot_bind_is_an_invalid_ticket_before_any_file_is_read(
    local_tables: LocalTables,
) -> None:
    """``sum`` of a string column names a real column, but no such aggregate exists: the ticket is refused as it
    is decoded (invalid-ticket), not failed later as an internal error after the fragment started reading."""
    spec = pb.PartialAggregate(aggregates=[pb.Aggregate(function=pb.AGGREGATE_FUNCTION_SUM, column="label")])
    ticket = decode_ticket(_with_partial(ticket_for(local_tables.events), spec))
    cancel = threading.Event()
    io = FragmentFileIO(ticket.credentials, ticket.storage, cancel=cancel, allow_local=True)
    with pytest.raises(InvalidTicketError, match=r"partial_aggregate .*sum\('label'\)"):
        RunningFragment(ticket, io, cancel)


def test_a_column_only_the_row_filter_reads_is_not_aggregatable(local_tables: LocalTables) -> None:
    table = local_tables.events
    plan = restriction_plan(
        table, {"required-row-filter": {"type": "lt", "left": {"type": "reference", "id": 1}, "right": 10}}
    )
    spec = PartialAggregate((), (("sum", "id"),)).to_proto()
    ticket = decode_ticket(_with_partial(ticket_for(table, plan=plan, output=["grp"]), spec))
    cancel = threading.Event()
    io = FragmentFileIO(ticket.credentials, ticket.storage, cancel=cancel, allow_local=True)
    with pytest.raises(InvalidTicketError, match="'id'"):
        RunningFragment(ticket, io, cancel)


@pytest.mark.parametrize(
    ("aggregate", "message"),
    [
        (pb.Aggregate(function=pb.AGGREGATE_FUNCTION_UNSPECIFIED, column="id"), "no \\(or an unknown\\) function"),
        (pb.Aggregate(function=99, column="id"), "no \\(or an unknown\\) function"),  # type: ignore[arg-type]
        (pb.Aggregate(function=pb.AGGREGATE_FUNCTION_COUNT_STAR, column="id"), "needs no column"),
        (pb.Aggregate(function=pb.AGGREGATE_FUNCTION_MIN), "needs a column"),
    ],
)
def test_malformed_aggregates_are_invalid_tickets(
    local_tables: LocalTables, aggregate: pb.Aggregate, message: str
) -> None:
    ticket = _with_partial(ticket_for(local_tables.events), pb.PartialAggregate(aggregates=[aggregate]))
    with pytest.raises(InvalidTicketError, match=message):
        decode_ticket(ticket)


def test_an_empty_partial_aggregate_is_an_invalid_ticket(local_tables: LocalTables) -> None:
    with pytest.raises(InvalidTicketError, match="at least one"):
        decode_ticket(_with_partial(ticket_for(local_tables.events), pb.PartialAggregate()))


def test_names_are_quoted_never_spliced_into_the_sql() -> None:
    schema = pa.schema([('a"; SELECT 1; --', pa.int64())])
    spec = PartialAggregate((), (("sum", 'a"; SELECT 1; --'),))
    got = list(run_partial(spec, schema, iter([pa.record_batch([pa.array([1, 2, 3])], schema=schema)])))
    assert pa.Table.from_batches(got).to_pylist() == [{"a0": 6}]


def test_an_error_of_the_batches_keeps_its_own_type() -> None:
    """A cancelled (or failed) read inside DuckDB's scan surfaces as itself, so the fragment keeps its kind."""
    schema = pa.schema([("x", pa.int64())])

    def batches() -> Iterator[pa.RecordBatch]:
        yield pa.record_batch([pa.array([1])], schema=schema)
        raise QueryCancelledError()

    with pytest.raises(QueryCancelledError):
        list(run_partial(PartialAggregate((), (("count_star", ""),)), schema, batches()))


def test_the_partial_connection_reads_nothing_but_the_fragment(tmp_path: pytest.TempPathFactory) -> None:
    """External access is disabled: even a name that looks like a file is only ever a quoted column."""
    schema = pa.schema([("x", pa.int64())])
    spec = PartialAggregate(("read_csv('/etc/passwd')",), ())
    with pytest.raises(InvalidTicketError):
        spec.check_columns(schema)


def test_fragments_running_at_once_see_only_their_own_batches() -> None:
    """Each fragment's connection registers its stream under the same name; none sees another's rows."""
    schema = pa.schema([("x", pa.int64())])
    spec = PartialAggregate((), (("sum", "x"),))
    gate = threading.Barrier(2)

    def batches(value: int) -> Iterator[pa.RecordBatch]:
        gate.wait(timeout=10)  # both fragments are inside DuckDB's scan at once
        yield pa.record_batch([pa.array([value] * 10)], schema=schema)

    results: dict[int, object] = {}

    def run_one(value: int) -> None:
        results[value] = pa.Table.from_batches(list(run_partial(spec, schema, batches(value)))).to_pylist()

    threads = [threading.Thread(target=run_one, args=(v,)) for v in (1, 100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert results == {1: [{"a0": 10}], 100: [{"a0": 1000}]}


def test_zoned_timestamps_carry_one_zone_label_whatever_the_process_zone() -> None:
    """The coordinator and a worker on machines with different ``TZ`` compute the same partial schema."""
    schema = pa.schema([("ts", pa.timestamp("us", "America/New_York"))])
    got = partial_types(PartialAggregate((), (("max", "ts"),)), schema)[0]
    assert got.field("a0").type == pa.timestamp("us", "UTC")


def test_a_partial_fragment_reports_progress_while_it_aggregates(local_tables: LocalTables) -> None:
    """Files finishing while DuckDB aggregates are reported before the partial rows and ``complete``."""
    table = local_tables.events  # 5 files
    ticket = _with_partial(ticket_for(table, pace_ms=300), PartialAggregate((), (("count_star", ""),)).to_proto())
    result, messages = run(ticket)
    assert result.to_pylist() == [{"a0": 2000}]
    kinds = [m.WhichOneof("payload") for m in messages]
    first_batch = kinds.index("batch")
    early = [m.progress.files_done for m in messages[:first_batch] if m.WhichOneof("payload") == "progress"]
    assert early and 0 < early[0] < 5  # reported while files were still being read
    assert kinds[-1] == "complete" and messages[-1].complete.files == 5


def _paced_count_stream(local_tables: LocalTables) -> tuple[Generator[Any], threading.Event]:
    """A running ``count(*)`` partial fragment over the events files (300 ms before each), and its cancel flag."""
    ticket = _with_partial(
        ticket_for(local_tables.events, pace_ms=300), PartialAggregate((), (("count_star", ""),)).to_proto()
    )
    decoded = decode_ticket(ticket)
    cancel = threading.Event()
    io = FragmentFileIO(
        decoded.credentials, decoded.storage, cancel=cancel, allow_local=True, pace_seconds=decoded.pace_seconds
    )
    fragment = RunningFragment(decoded, io, cancel)
    stream = fragment.stream(LocalExecutor(max_files_in_flight=1), 1 << 20, WorkerStats())
    return cast("Generator[Any]", stream), cancel


def test_a_partial_fragment_closed_early_stops_its_readers(local_tables: LocalTables) -> None:
    """The client goes away mid-aggregation: the stream closes, the helper and readers stop (no hang)."""
    stream, cancel = _paced_count_stream(local_tables)
    assert next(stream).WhichOneof("payload") == "schema"
    assert next(stream).WhichOneof("payload") == "progress"
    stream.close()
    assert cancel.is_set()
    assert not [t for t in threading.enumerate() if t.name.startswith("sqe-partial-")]


def test_cancel_while_aggregating_ends_the_stream_as_cancelled(local_tables: LocalTables) -> None:
    stream, cancel = _paced_count_stream(local_tables)
    assert next(stream).WhichOneof("payload") == "schema"
    cancel.set()  # what the Cancel RPC does
    started = time.monotonic()
    with pytest.raises(QueryCancelledError):
        list(stream)
    assert time.monotonic() - started < 5


# ------------------------------------------------------------------------------- cancelling DuckDB's own work

_MANY_GROUPS = 200_000  # GROUP BY id: about three partial batches of 64k rows, and more to come


def _distinct_ids(count: int) -> pa.Table:
    return pa.table({"id": pa.array(range(count), pa.int64())})


def _grouped_by_id(interrupt: PartialInterrupt, database: duckdb.DuckDBPyConnection | None) -> Iterator[pa.RecordBatch]:
    rows = _distinct_ids(_MANY_GROUPS)
    spec = PartialAggregate(("id",), (("count_star", ""),))
    return run_partial(spec, rows.schema, iter(rows.to_batches()), database=database, interrupt=interrupt)


@pytest.mark.parametrize("own_database", [False, True], ids=["shared", "lent"])
def test_an_interrupt_stops_duckdb_mid_result_and_leaves_its_database_usable(own_database: bool) -> None:
    """DuckDB past its scan, producing partial rows: the interrupt ends the run as cancelled at the next batch."""
    database = open_database(DatabaseLimits(memory_bytes=256 << 20, threads=1, spill_bytes=0)) if own_database else None
    interrupt = PartialInterrupt()
    run = _grouped_by_id(interrupt, database)
    assert next(run).num_rows > 0
    interrupt.interrupt()
    with pytest.raises(QueryCancelledError):
        next(run)
    if database is not None:
        assert database.execute("SELECT 41 + 1").fetchall() == [(42,)]
        database.close()


def test_a_run_interrupted_before_it_starts_never_reads_its_batches() -> None:
    interrupt = PartialInterrupt()
    interrupt.interrupt()
    read: list[int] = []

    def batches() -> Iterator[pa.RecordBatch]:
        read.append(1)
        yield from _distinct_ids(10).to_batches()

    spec = PartialAggregate((), (("count_star", ""),))
    with pytest.raises(QueryCancelledError):
        list(run_partial(spec, _distinct_ids(0).schema, batches(), interrupt=interrupt))
    assert read == []


def test_an_interrupt_after_the_run_ended_changes_nothing() -> None:
    interrupt = PartialInterrupt()
    rows = pa.Table.from_batches(list(_grouped_by_id(interrupt, None)))
    interrupt.interrupt()
    assert rows.num_rows == _MANY_GROUPS and sum(rows.column("a0").to_pylist()) == _MANY_GROUPS


def test_a_cancelled_fragment_sends_none_of_the_partial_rows_it_had_already_computed(tmp_path: Path) -> None:
    """The Cancel RPC arrives while DuckDB hands over partial rows faster than the client reads them: the next
    message is the cancellation, not the rows waiting in the hand-over queue, and the aggregation thread ends."""
    catalog = local_catalog(tmp_path, "wh")
    catalog.create_namespace_if_not_exists("ns")
    table = catalog.create_table("ns.ids", schema=_distinct_ids(0).schema)
    table.append(_distinct_ids(_MANY_GROUPS))
    ticket = _with_partial(ticket_for(table), PartialAggregate(("id",), (("count_star", ""),)).to_proto())
    decoded = decode_ticket(ticket)
    cancel = threading.Event()
    io = FragmentFileIO(decoded.credentials, decoded.storage, cancel=cancel, allow_local=True)
    stream = RunningFragment(decoded, io, cancel).stream(LocalExecutor(max_files_in_flight=1), 64 << 20, WorkerStats())
    while next(stream).WhichOneof("payload") != "batch":
        pass
    time.sleep(0.5)  # DuckDB fills the hand-over queue (2 batches) within milliseconds
    cancel.set()  # what the Cancel RPC does
    with pytest.raises(QueryCancelledError):
        next(stream)
    assert not [t for t in threading.enumerate() if t.name.startswith("sqe-partial-")]
