"""The user's WHERE in a fragment (``ScanTicket.user_filter``), run in-process on real local Iceberg tables: only
the rows it keeps are sent or aggregated, it runs on masked values, and a filter that does not fit the restricted
output, or is malformed, is an invalid ticket before any file is read."""

from __future__ import annotations

import datetime
import math
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidTicketError
from sqe.distributed.protocol.filters import filter_from_proto, filter_to_proto
from sqe.distributed.protocol.partial import PartialAggregate
from sqe.distributed.protocol.partial import run_partial as partial_rows
from sqe.distributed.protocol.ticket import decode_ticket
from sqe.planning.user_filter import AnyOf, Condition, Not, UserFilter
from tests.unit.sqe.iceberg_local import local_catalog
from tests.unit.workers.test_fragment import local_reference, run
from tests.unit.workers.test_fragment_partial import run as run_partial
from tests.unit.workers.worker_fixtures import LocalTables, restriction_plan, ticket_for
from workers.fileio import FragmentFileIO
from workers.fragment import RunningFragment

MASK_LABEL = {"required-column-projections": [{"field-id": 4, "action": "mask-alphanum"}]}


def _filtered(ticket: pb.ScanTicket, where: UserFilter) -> pb.ScanTicket:
    ticket.user_filter.CopyFrom(filter_to_proto(where))
    return ticket


def _ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


def test_a_fragment_sends_only_the_rows_the_where_keeps(local_tables: LocalTables) -> None:
    table = local_tables.events  # ids 0..1999, grp = id % 5, day 2024-01-01 + grp
    where = UserFilter(
        (
            Condition("id", "lt", (100,)),
            Condition("grp", "in", (1, 3)),
            Condition("day", "ge", (datetime.date(2024, 1, 3),)),
            Condition("label", "is_not_null"),
        )
    )
    result, messages = run(_filtered(ticket_for(table), where))
    assert _ids(result) == [i for i in range(100) if i % 5 == 3]
    batches = [m.batch for m in messages if m.WhichOneof("payload") == "batch"]
    assert sum(b.num_rows for b in batches) == result.num_rows == messages[-1].complete.rows
    per_task: dict[int, int] = {}
    for batch in batches:  # positions count the kept rows of each task: a retry can skip what was forwarded
        assert batch.row_offset == per_task.get(batch.task_index, 0)
        per_task[batch.task_index] = batch.row_offset + batch.num_rows


def test_a_negated_where_keeps_sqls_rows_in_plain_and_partial_fragments(local_tables: LocalTables) -> None:
    """NOT over an OR of an IN and a LIKE: the fragment's rows and its partial aggregate both keep exactly these."""
    table = local_tables.events
    where = UserFilter((Not(AnyOf((Condition("grp", "in", (1, 3)), Condition("label", "like", ("e1%",))))),))
    kept = [i for i in range(2000) if not (i % 5 in (1, 3) or str(i).startswith("1"))]
    result, _ = run(_filtered(ticket_for(table), where))
    assert _ids(result) == kept
    ticket = _filtered(ticket_for(table), where)
    ticket.partial_aggregate.CopyFrom(PartialAggregate((), (("count_star", ""),)).to_proto())
    assert run_partial(ticket)[0].column("a0").to_pylist() == [len(kept)]


def test_the_where_runs_on_masked_values(local_tables: LocalTables) -> None:
    """Row filter and masks first: a raw label matches nothing, the masked spelling matches its rows."""
    table = local_tables.events
    plan = restriction_plan(table, MASK_LABEL)
    raw_value = UserFilter((Condition("label", "eq", ("e5",)),))
    assert run(_filtered(ticket_for(table, plan=plan), raw_value))[0].num_rows == 0
    masked = local_reference(table, plan)
    spelling = masked.column("label")[5].as_py()
    assert spelling != "e5"
    result, _ = run(_filtered(ticket_for(table, plan=plan), UserFilter((Condition("label", "eq", (spelling,)),))))
    assert _ids(result) == sorted(
        i for i, v in zip(masked["id"].to_pylist(), masked["label"].to_pylist(), strict=True) if v == spelling
    )
    assert result.num_rows > 1  # every label of that shape masks to the same spelling


def test_a_partial_aggregate_aggregates_only_the_kept_rows(local_tables: LocalTables) -> None:
    table = local_tables.events
    spec = PartialAggregate(("grp",), (("count_star", ""), ("sum", "id")))
    ticket = _filtered(ticket_for(table), UserFilter((Condition("id", "ge", (1000,)), Condition("grp", "ne", (0,)))))
    ticket.partial_aggregate.CopyFrom(spec.to_proto())
    result, _ = run_partial(ticket)
    expected = {g: (200, sum(i for i in range(1000, 2000) if i % 5 == g)) for g in (1, 2, 3, 4)}
    assert {row["g0"]: (row["a0"], row["a1"]) for row in result.to_pylist()} == expected


def test_a_like_on_a_dictionary_encoded_file_keeps_its_rows(tmp_path: Path) -> None:
    """pyiceberg hands a file written from a dictionary array back dictionary-encoded; the WHERE was compiled for
    the restricted schema's plain strings and decodes the columns it reads (match_like has no dictionary kernel)."""
    catalog = local_catalog(tmp_path, "wh")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.coded", schema=pa.schema([("label", pa.string()), ("id", pa.int64())]))
    path = tmp_path / "coded.parquet"
    labels = pa.array(["ab", "b", None, "ab", "ä"]).dictionary_encode()
    pq.write_table(pa.table({"label": labels, "id": pa.array(range(5), pa.int64())}), path)
    table.add_files([str(path)])
    table = catalog.load_table("ns.coded")
    where = UserFilter((AnyOf((Condition("label", "like", ("a%",)), Condition("label", "eq", ("ä",)))),))
    result, _ = run(_filtered(ticket_for(table), where))
    assert _ids(result) == [0, 3, 4]
    ticket = _filtered(ticket_for(table), where)
    ticket.partial_aggregate.CopyFrom(PartialAggregate((), (("count_star", ""),)).to_proto())
    assert run_partial(ticket)[0].column("a0").to_pylist() == [3]


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (UserFilter((Condition("nope", "eq", (1,)),)), "'nope' is not a column of the restricted output"),
        (UserFilter((Condition("id", "eq", ("1",)),)), "does not fit the type int64 of 'id'"),
        (UserFilter((Condition("grp", "eq", (True,)),)), "does not fit the type int32 of 'grp'"),
        (UserFilter((Condition("label", "gt", (datetime.date(2024, 1, 1),)),)), "of 'label'"),
        (UserFilter((Condition("grp", "in", (1, 2**40)),)), "out of range for 'grp'"),
        (UserFilter((Condition("id", "gt", (1.5,)),)), "does not fit the type int64 of 'id'"),
        (UserFilter((Condition("label", "like", ("e\\1%",)),)), "LIKE pattern on 'label' holds a backslash"),
        (UserFilter((Condition("label", "like", ("e%" * 501,)),)), "LIKE pattern on 'label' is longer than 1000"),
        (UserFilter((Not(Condition("id", "like", ("1%",))),)), "LIKE needs a string column"),
    ],
)
def test_a_where_that_does_not_fit_the_output_is_an_invalid_ticket(
    local_tables: LocalTables, where: UserFilter, message: str
) -> None:
    ticket = decode_ticket(_filtered(ticket_for(local_tables.events), where))
    cancel = threading.Event()
    io = FragmentFileIO(ticket.credentials, ticket.storage, cancel=cancel, allow_local=True)
    with pytest.raises(InvalidTicketError, match=message):
        RunningFragment(ticket, io, cancel)


def test_a_column_only_the_row_filter_reads_cannot_be_filtered_on(local_tables: LocalTables) -> None:
    table = local_tables.events
    plan = restriction_plan(
        table, {"required-row-filter": {"type": "lt", "left": {"type": "reference", "id": 1}, "right": 10}}
    )
    ticket = decode_ticket(
        _filtered(ticket_for(table, plan=plan, output=["grp"]), UserFilter((Condition("id", "gt", (5,)),)))
    )
    cancel = threading.Event()
    io = FragmentFileIO(ticket.credentials, ticket.storage, cancel=cancel, allow_local=True)
    with pytest.raises(InvalidTicketError, match="'id' is not a column"):
        RunningFragment(ticket, io, cancel)


def _condition(**fields: object) -> pb.UserFilter:
    return pb.UserFilter(conditions=[pb.FilterClause(condition=pb.FilterCondition(**fields))])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (pb.UserFilter(), "at least one condition"),
        (_condition(column="id", values=[pb.FilterValue(integer=1)]), "no \\(or an unknown\\) operator"),
        (_condition(column="id", operator=77, values=[pb.FilterValue(integer=1)]), "unknown\\) operator"),
        (_condition(operator=pb.FILTER_OPERATOR_EQ, values=[pb.FilterValue(integer=1)]), "names no column"),
        (_condition(column="id", operator=pb.FILTER_OPERATOR_EQ), "wrong number of values"),
        (_condition(column="id", operator=pb.FILTER_OPERATOR_IN), "wrong number of values"),
        (
            _condition(column="id", operator=pb.FILTER_OPERATOR_IS_NULL, values=[pb.FilterValue(integer=1)]),
            "wrong number of values",
        ),
        (
            _condition(
                column="id",
                operator=pb.FILTER_OPERATOR_LT,
                values=[pb.FilterValue(integer=1), pb.FilterValue(integer=2)],
            ),
            "wrong number of values",
        ),
        (_condition(column="id", operator=pb.FILTER_OPERATOR_EQ, values=[pb.FilterValue()]), "without a type"),
        (
            _condition(column="day", operator=pb.FILTER_OPERATOR_EQ, values=[pb.FilterValue(date_days=2**31 - 1)]),
            "date out of range",
        ),
        (
            _condition(column="id", operator=pb.FILTER_OPERATOR_GT, values=[pb.FilterValue(real=float("nan"))]),
            "double that is not finite",
        ),
        (_condition(column="label", operator=pb.FILTER_OPERATOR_LIKE), "wrong number of values"),
    ],
)
def test_malformed_user_filters_are_invalid_tickets(
    local_tables: LocalTables, message: pb.UserFilter, error: str
) -> None:
    ticket = ticket_for(local_tables.events)
    ticket.user_filter.CopyFrom(message)
    with pytest.raises(InvalidTicketError, match=error):
        decode_ticket(ticket)


def test_the_wire_form_keeps_every_value_exactly() -> None:
    where = UserFilter(
        (
            Condition("a", "eq", (-(2**63),)),
            Condition("b", "in", ("x", "", "ä'\"")),
            Condition("c", "ne", (False,)),
            Condition("d", "le", (datetime.date(1, 1, 1),)),
            Condition("d", "gt", (datetime.date(9999, 12, 31),)),
            Condition("e", "is_null"),
            Condition("f", "is_not_null"),
            Condition("g", "ge", (-0.0,)),
            Not(Condition("h", "like", ("%_ä",))),
        )
    )
    decoded = filter_from_proto(pb.UserFilter.FromString(filter_to_proto(where).SerializeToString()))
    assert decoded == where
    assert [type(v) for c in decoded.leaves() for v in c.values] == [
        int,
        str,
        str,
        str,
        bool,
        datetime.date,
        datetime.date,
        float,
        str,
    ]
    assert math.copysign(1.0, next(c for c in decoded.leaves() if c.column == "g").values[0]) == -1.0


def test_the_partial_where_binds_its_constants_and_quotes_its_names() -> None:
    """A partial aggregate's WHERE runs in DuckDB: the names are quoted identifiers and the constants bound
    parameters, so a quote in either is data, never SQL."""
    name = 'a"; SELECT 1; --'
    schema = pa.schema([(name, pa.large_string()), ("n", pa.int32())])
    batch = pa.record_batch(
        [pa.array(["x'; --", "y", None], pa.large_string()), pa.array([1, 2, 3], pa.int32())], schema=schema
    )
    spec = PartialAggregate((), (("count_star", ""), ("sum", "n")))
    where = UserFilter((Condition(name, "in", ("x'; --", "z")), Condition("n", "lt", (2**40,))))
    text, parameters = spec.sql(where=where)
    assert "x'" not in text and parameters == ["x'; --", "z", 2**40]
    got = pa.Table.from_batches(list(partial_rows(spec, schema, iter([batch]), where)))
    assert got.to_pylist() == [{"a0": 1, "a1": 1}]


def test_a_ticket_with_more_string_constants_than_a_filter_may_carry_is_refused(local_tables: LocalTables) -> None:
    ticket = ticket_for(local_tables.events)
    values = [pb.FilterValue(text="x" * 1024) for _ in range(1025)]  # just over 1 MiB
    ticket.user_filter.CopyFrom(
        pb.UserFilter(
            conditions=[
                pb.FilterClause(
                    condition=pb.FilterCondition(column="label", operator=pb.FILTER_OPERATOR_IN, values=values)
                )
            ]
        )
    )
    with pytest.raises(InvalidTicketError, match="string constants exceed 1048576 bytes"):
        decode_ticket(ticket)
