"""A fragment run in-process on real local Iceberg tables: rows, restrictions, slicing, progress; its FileIO."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType, StructType

from sqe.credentials import CredentialSet, StorageSettings
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidTicketError, MissingCredentialsError
from sqe.distributed.protocol.ipc import decode_batch, decode_schema, plain_offsets
from sqe.distributed.protocol.ticket import decode_ticket
from sqe.errors import CredentialExpiredError, WorkerError
from sqe.execution.cache import FRAGMENTS
from sqe.execution.local import LocalExecutor, QueryCancelledError
from sqe.restrictions import EMPTY_PLAN, RestrictionPlan, apply
from sqe.restrictions.plan import ColumnMask
from tests.unit.sqe.iceberg_local import local_catalog
from tests.unit.workers.worker_fixtures import LocalTables, restriction_plan, sorted_rows, ticket_for, wire
from workers.fileio import FragmentFileIO
from workers.fragment import RunningFragment, WorkerStats

SALT = bytes(range(16))
REGION = StorageSettings(region="us-east-1")


def run(ticket: pb.ScanTicket, *, max_message_bytes: int = 1 << 20) -> tuple[pa.Table, list[pb.ExecuteResponse]]:
    decoded = decode_ticket(ticket)
    cancel = threading.Event()
    io = FragmentFileIO(decoded.credentials, decoded.storage, cancel=cancel, allow_local=True)
    fragment = RunningFragment(decoded, io, cancel)
    messages = wire(fragment.stream(LocalExecutor(max_files_in_flight=2), max_message_bytes, WorkerStats()))
    schema = decode_schema(messages[0].schema.ipc)
    batches = [decode_batch(m.batch.ipc, schema) for m in messages if m.WhichOneof("payload") == "batch"]
    return pa.Table.from_batches(batches, schema=schema), messages


def local_reference(table: Table, plan: RestrictionPlan, output: list[str] | None = None) -> pa.Table:
    """The same read done locally: pyiceberg's scan of the read columns, then sqe.restrictions.apply."""
    schema = table.schema()
    output_ids = {schema.find_field(n).field_id for n in output} if output else {f.field_id for f in schema.columns}
    read_names = [f.name for f in schema.columns if f.field_id in output_ids | plan.filter_field_ids]
    read_schema = schema.select(*read_names)
    raw = table.scan(selected_fields=tuple(read_names)).to_arrow()
    batches = [apply(b, plan, salt=SALT, schema=read_schema, output_field_ids=output_ids) for b in raw.to_batches()]
    return pa.Table.from_batches(batches)


def test_plain_offsets_send_the_same_rows_with_32_bit_string_offsets(local_tables: LocalTables) -> None:
    """``ScanTicket.plain_offsets``: the wire schema's large strings become plain strings (the form Parquet decodes
    them to); every value, name and column order is the same, masked columns included."""
    table = local_tables.events
    plan = restriction_plan(table, {"required-column-projections": [{"field-id": 4, "action": "show-first-4"}]})
    ticket = ticket_for(table, plan=plan)
    wide, _ = run(ticket)
    ticket.plain_offsets = True
    narrow, messages = run(ticket)
    assert any(pa.types.is_large_string(t) for t in wide.schema.types)
    assert narrow.schema == plain_offsets(wide.schema) != wide.schema
    assert not any(pa.types.is_large_string(t) for t in narrow.schema.types)
    assert sorted_rows(narrow) == sorted_rows(wide) and narrow.num_rows == messages[-1].complete.rows == 2000


def test_fragment_returns_exactly_the_tables_rows(local_tables: LocalTables) -> None:
    result, messages = run(ticket_for(local_tables.events))
    expected = local_tables.events.scan().to_arrow()
    assert result.num_rows == 2000
    assert sorted_rows(result) == sorted_rows(expected)
    kinds = [m.WhichOneof("payload") for m in messages]
    assert kinds[0] == "schema" and kinds[-1] == "complete" and kinds.count("schema") == 1
    complete, last_progress = messages[-1].complete, messages[-2].progress
    assert (complete.rows, complete.files) == (2000, 5)
    assert (last_progress.files_done, last_progress.files_total, last_progress.rows_sent) == (5, 5, 2000)
    assert last_progress.bytes_done == last_progress.bytes_total > 0


def test_positional_deletes_are_applied(local_tables: LocalTables) -> None:
    result, _ = run(ticket_for(local_tables.deleted))
    assert sorted_rows(result) == sorted_rows(local_tables.deleted.scan().to_arrow())
    assert result.num_rows == 4000 - 3


def test_restrictions_are_applied_like_the_local_path(local_tables: LocalTables) -> None:
    table = local_tables.events
    plan = restriction_plan(
        table,
        {
            "required-row-filter": {"type": "lt", "left": {"type": "reference", "id": 2}, "right": 3},
            "required-column-projections": [
                {"field-id": 4, "action": "sha-256-query-local"},
                {"field-id": 3, "action": "truncate-to-year"},
            ],
        },
    )
    result, _ = run(ticket_for(table, plan=plan, output=["id", "day", "label"], salt=SALT))
    expected = local_reference(table, plan, ["id", "day", "label"])
    assert result.column_names == ["id", "day", "label"]  # grp was read for the filter, then dropped
    assert result.num_rows == 1200  # groups 0, 1 and 2
    assert sorted_rows(result) == sorted_rows(expected)
    assert result.schema.field("label").nullable  # masked columns are declared nullable, as locally


@pytest.fixture(scope="module")
def people(tmp_path_factory: pytest.TempPathFactory) -> Table:
    """ns.people: an id and a struct column ``person`` holding a string ``ssn`` (field id 3)."""
    catalog = local_catalog(tmp_path_factory.mktemp("people"), "wh")
    catalog.create_namespace("ns")
    person = StructType(NestedField(3, "ssn", StringType(), required=False))
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "person", person, required=False))
    table = catalog.create_table("ns.people", schema=schema)
    rows = {"id": [1, 2], "person": [{"ssn": "123-45-6789"}, {"ssn": "987-65-4321"}]}
    table.append(pa.Table.from_pydict(rows, schema=table.schema().as_arrow()))
    return catalog.load_table("ns.people")


@pytest.mark.parametrize(
    ("mask", "problem"),
    [
        # The worker masks top-level columns: a mask of a nested field was skipped and the struct sent unmasked.
        (ColumnMask(3, "mask-alphanum", "person.ssn", "string"), "nested inside a column read"),
        # An action the column's type does not take fails before any file is read (it failed at the first row).
        (ColumnMask(1, "show-first-4", "id", "long"), "the action does not apply to this type"),
    ],
)
def test_a_mask_the_worker_cannot_apply_is_refused_never_skipped(people: Table, mask: ColumnMask, problem: str) -> None:
    """A ticket's restriction plan comes off the wire (``RestrictionPlan.from_json`` checks its shape only): every
    mask on a column the ticket reads must be one the worker applies, else the ticket is refused (fail closed)."""
    plan = RestrictionPlan(column_masks=(mask,))
    with pytest.raises(InvalidTicketError, match=problem):
        run(ticket_for(people, plan=plan))


def test_a_mask_of_a_column_the_ticket_does_not_read_is_no_problem(people: Table) -> None:
    plan = RestrictionPlan(column_masks=(ColumnMask(3, "mask-alphanum", "person.ssn", "string"),))
    result, _ = run(ticket_for(people, plan=plan, output=["id"]))
    assert result.column("id").to_pylist() == [1, 2]


def test_batches_are_sliced_to_fit_the_message_limit(local_tables: LocalTables) -> None:
    limit = 8 * 1024
    result, messages = run(ticket_for(local_tables.numbers), max_message_bytes=limit)
    batch_messages = [m for m in messages if m.WhichOneof("payload") == "batch"]
    assert len(batch_messages) > 4  # one file is one batch locally; each had to be cut
    assert max(m.ByteSize() for m in batch_messages) <= limit
    assert sorted_rows(result) == sorted_rows(local_tables.numbers.scan().to_arrow())


def test_no_restrictions_and_all_columns_needs_no_transform(local_tables: LocalTables) -> None:
    result, _ = run(ticket_for(local_tables.numbers, plan=EMPTY_PLAN, output=["name"]))
    assert result.column_names == ["name"] and result.num_rows == 4000


# ------------------------------------------------------------------------------------------------ FileIO


def cred(prefix: str, key: str, expires_in: float | None = 3600.0) -> CredentialSet:
    expires = None if expires_in is None else int((time.time() + expires_in) * 1000)
    return CredentialSet(prefix, key, "secret-" + key, "token-" + key, expires, settings=REGION)


def file_io(*creds: CredentialSet, opened: list[str] | None = None, **kwargs: object) -> FragmentFileIO:
    record = opened.append if opened is not None else None
    return FragmentFileIO(
        creds,
        REGION,
        cancel=kwargs.pop("cancel", threading.Event()),  # type: ignore[arg-type]
        on_open=(lambda c: record(c.access_key_id)) if record is not None else None,
        **kwargs,  # type: ignore[arg-type]
    )


def test_each_file_uses_its_longest_prefix_and_uncovered_paths_fail() -> None:
    opened: list[str] = []
    io = file_io(cred("s3://b/wh", "WIDE"), cred("s3://b/wh/ns/t1", "NARROW"), opened=opened)
    io.new_input("s3://b/wh/ns/t1/data/a.parquet")
    io.new_input("s3://b/wh/ns/t10/data/a.parquet")  # t1 must not cover t10
    assert opened == ["NARROW", "WIDE"]
    with pytest.raises(MissingCredentialsError, match=r"no credential set in the ticket covers s3://other/x"):
        io.new_input("s3://other/x")
    with pytest.raises(MissingCredentialsError):
        io.new_input("file:///etc/passwd")  # local paths only with allow_local (unit tests)


def test_a_path_with_a_password_is_refused_without_it() -> None:
    """A ticket's paths come from the catalog's manifests: the worker's refusal names one without its password."""
    io = file_io(cred("s3://b/wh", "WIDE"))
    for path in ("http://alice:manifest-pw-4d2@127.0.0.1:9/x.parquet", "https://h/x.parquet?X-Amz-Signature=sig-8e1"):
        with pytest.raises(MissingCredentialsError) as caught:
            io.new_input(path)
        text = f"{caught.value} {caught.value!r}"
        assert "127.0.0.1" in text or "https://h/x.parquet" in text, text
        assert "manifest-pw-4d2" not in text and "sig-8e1" not in text, text


def test_an_expired_set_fails_before_the_file_is_opened() -> None:
    io = file_io(cred("s3://b/t", "OLD", expires_in=-1))
    expected = r"credentials for s3://b/t expired at .* and no refreshed set arrived"
    with pytest.raises(CredentialExpiredError, match=expected):
        io.new_input("s3://b/t/f.parquet")
    assert io.expired_set() is not None


def test_a_pushed_set_serves_files_opened_afterwards() -> None:
    opened: list[str] = []
    io = file_io(cred("s3://b/t", "OLD", expires_in=0.2), cred("s3://b/u", "OTHER"), opened=opened)
    first = io.new_input("s3://b/t/1.parquet")
    io.refresh([cred("s3://b/t/", "NEW")])  # same prefix, spelled with a trailing slash
    time.sleep(0.25)  # the old set is now expired; the new one is current
    second = io.new_input("s3://b/t/2.parquet")
    io.new_input("s3://b/u/3.parquet")  # other prefixes keep their set
    assert opened == ["OLD", "NEW", "OTHER"]
    assert first is not second
    assert {"OLD", "secret-OLD", "NEW", "token-NEW"} <= io.secret_values()
    assert "secret" not in repr(io)


def test_a_push_never_replaces_a_set_that_stays_valid_longer() -> None:
    # Found by review: a catch-up push sent before a refresh could land after it and put the older set back,
    # so the fragment failed when that set expired although the newer one had arrived.
    opened: list[str] = []
    io = file_io(cred("s3://b/t", "FIRST", expires_in=600), opened=opened)
    io.refresh([cred("s3://b/t", "NEWER", expires_in=3600)])
    io.refresh([cred("s3://b/t", "OLDER", expires_in=120), cred("s3://b/u", "ADDED", expires_in=120)])
    io.new_input("s3://b/t/1.parquet")
    io.new_input("s3://b/u/2.parquet")  # a new prefix is still added
    assert opened == ["NEWER", "ADDED"]


def test_pacing_waits_before_each_file_and_a_cancel_interrupts_it() -> None:
    cancel = threading.Event()
    io = file_io(cred("s3://b/t", "K"), cancel=cancel, pace_seconds=5.0)
    threading.Timer(0.1, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(QueryCancelledError):
        io.new_input("s3://b/t/f.parquet")
    assert time.monotonic() - started < 2.0


def test_workers_never_write() -> None:
    io = file_io(cred("s3://b/t", "K"))
    with pytest.raises(WorkerError):
        io.new_output("s3://b/t/x")
    with pytest.raises(WorkerError):
        io.delete("s3://b/t/x")


def _rows_by_task(ticket: pb.ScanTicket, executor: LocalExecutor, max_message_bytes: int) -> list[list[Any]]:
    """Each task's output rows rebuilt from the batches' positions (which must be contiguous per task)."""
    decoded = decode_ticket(ticket)
    cancel = threading.Event()
    io = FragmentFileIO(decoded.credentials, decoded.storage, cancel=cancel, allow_local=True)
    messages = wire(RunningFragment(decoded, io, cancel).stream(executor, max_message_bytes, WorkerStats()))
    assert messages[0].schema.row_positions
    schema = decode_schema(messages[0].schema.ipc)
    tasks: list[list[Any]] = [[] for _ in decoded.tasks]
    for message in messages:
        if message.WhichOneof("payload") == "batch":
            rows = tasks[message.batch.task_index]
            assert message.batch.row_offset == len(rows)  # no gap, no repeat
            rows.extend(decode_batch(message.batch.ipc, schema).to_pylist())
    return tasks


@pytest.mark.parametrize("name", ["events", "deleted"])
def test_each_tasks_rows_come_in_one_order_whatever_the_reader_settings(local_tables: LocalTables, name: str) -> None:
    """Row positions are only worth something if a task's output order is the same on every attempt: compare
    one reader with big batches against three readers with tiny batches sliced to a small message limit."""
    table = getattr(local_tables, name)
    ticket = ticket_for(table, plan=restriction_plan(table, None))
    one_reader = _rows_by_task(ticket, LocalExecutor(max_files_in_flight=1), 1 << 20)
    many_readers = _rows_by_task(
        ticket, LocalExecutor(max_files_in_flight=3, max_queued_batches=1, target_batch_bytes=512), 2048
    )
    assert one_reader == many_readers
    assert sum(len(rows) for rows in one_reader) == table.scan().to_arrow().num_rows > 0
    assert all(one_reader)


def test_a_later_fragment_under_the_same_scope_reuses_the_kept_footers(local_tables: LocalTables) -> None:
    """The worker's FileIO names each file's credential scope, so the engine's footer cache serves a later
    fragment (another query's, on a long-lived worker) without reading the footers again."""
    ticket = ticket_for(local_tables.numbers)
    first, _ = run(ticket)
    before = FRAGMENTS.stats.snapshot()
    again, _ = run(ticket)
    after = FRAGMENTS.stats.snapshot()
    assert after["hits"] - before["hits"] == len(ticket.tasks) == 4
    assert after["misses"] == before["misses"]
    assert sorted_rows(again) == sorted_rows(first)
