"""RestrictionPlan: filter-then-mask on batches, filter-only columns, plan JSON, EXPLAIN and safe pushdown."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import struct
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, BooleanExpression
from pyiceberg.expressions.visitors import bind
from pyiceberg.io.pyarrow import expression_to_pyarrow, schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, NestedField, StringType

from sqe.errors import InvalidRestrictionError, RestrictionApplyError
from sqe.restrictions import (
    EMPTY_PLAN,
    RestrictionPlan,
    apply,
    new_query_salt,
    parse_restrictions,
    required_columns,
)
from sqe.restrictions import actions as actions_module
from sqe.restrictions.columns import BatchColumns
from sqe.restrictions.evaluate import evaluate
from tests.unit.sqe.restrictions.restriction_fixtures import ALL_TYPES, batch_of, ref, restrictions

SALT = b"s" * 16

PEOPLE = Schema(
    NestedField(1, "id", IntegerType(), required=True),
    NestedField(2, "email", StringType(), required=False),
    NestedField(3, "country", StringType(), required=False),
    NestedField(4, "ssn", StringType(), required=False),
)


def people() -> pa.RecordBatch:
    return batch_of(
        PEOPLE,
        {
            "id": [1, 2, 3, 4],
            "email": ["ann@x.io", "bob@y.io", None, "dee@z.io"],
            "country": ["US", "DE", "US", None],
            "ssn": ["123-45-6789", "987-65-4321", "111-22-3333", None],
        },
    )


def people_plan(row_filter: Any = None, projections: list[tuple[int, str]] | None = None) -> RestrictionPlan:
    return parse_restrictions(restrictions(row_filter, projections), PEOPLE)


US_ONLY = {"type": "eq", "left": ref(3), "right": "US"}


def test_filter_on_raw_values_then_masks_on_survivors() -> None:
    plan = people_plan(US_ONLY, [(2, "show-first-4"), (3, "mask-alphanum"), (4, "show-last-4")])
    out = apply(people(), plan, salt=SALT, schema=PEOPLE)
    # the filter saw raw "US" although the output country is masked
    assert out.to_pydict() == {
        "id": [1, 3],
        "email": ["ann@x.xx", None],
        "country": ["xx", "xx"],
        "ssn": ["nnn-nn-6789", "nnn-nn-3333"],
    }
    assert out.schema == people().schema


def test_filter_only_columns_are_read_and_then_dropped() -> None:
    plan = people_plan(US_ONLY, [(4, "mask-alphanum")])
    assert required_columns(plan, {1, 4}) == {1, 3, 4}
    out = apply(people(), plan, salt=SALT, schema=PEOPLE, output_field_ids={1, 4})
    assert out.schema.names == ["id", "ssn"]
    assert out.to_pydict() == {"id": [1, 3], "ssn": ["nnn-nn-nnnn", "nnn-nn-nnnn"]}


def test_masks_on_columns_not_read_do_not_apply() -> None:
    plan = people_plan(None, [(4, "sha-256-query-local"), (2, "mask-alphanum")])
    batch = people().select(["id", "email"])
    out = apply(batch, plan, salt=SALT, schema=PEOPLE)
    assert out.column("email").to_pylist() == ["xxx@x.xx", "xxx@x.xx", None, "xxx@x.xx"]
    assert out.column("id").to_pylist() == [1, 2, 3, 4]


def test_filtered_out_rows_never_reach_masking(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[Any]] = []
    real = actions_module.apply_action

    def spy(action: str, array: pa.Array, *, salt: bytes) -> pa.Array:
        seen.append(array.to_pylist())
        return real(action, array, salt=salt)

    monkeypatch.setattr("sqe.restrictions.plan.apply_action", spy)
    plan = people_plan(US_ONLY, [(4, "sha-256-global")])
    out = apply(people(), plan, salt=SALT, schema=PEOPLE)
    assert seen == [["123-45-6789", "111-22-3333"]]
    assert out.column("ssn").to_pylist() == [hashlib.sha256(s.encode()).hexdigest() for s in seen[0]]


def test_always_false_returns_an_empty_batch_with_the_same_schema() -> None:
    plan = people_plan(False, [(2, "replace-with-null")])
    out = apply(people(), plan, salt=SALT, schema=PEOPLE, output_field_ids={1, 2})
    assert out.num_rows == 0
    assert out.schema.names == ["id", "email"]


def test_replace_with_null_makes_the_output_field_nullable() -> None:
    batch = people()
    strict_email = batch.schema.field("email").with_nullable(False)
    batch = pa.RecordBatch.from_arrays(
        batch.columns, schema=batch.schema.set(batch.schema.get_field_index("email"), strict_email)
    )
    out = apply(batch, people_plan(None, [(2, "replace-with-null")]), salt=SALT, schema=PEOPLE)
    assert out.schema.field("email").nullable
    assert out.column("email").null_count == 4


def test_unrestricted_plan_passes_the_batch_through() -> None:
    batch = people()
    assert apply(batch, EMPTY_PLAN, salt=b"", schema=PEOPLE) is batch
    projected = apply(batch, EMPTY_PLAN, salt=b"", schema=PEOPLE, output_field_ids={2})
    assert projected.schema.names == ["email"]


def test_query_local_masks_need_a_long_enough_salt_even_for_empty_batches() -> None:
    plan = people_plan(None, [(4, "sha-256-query-local")])
    with pytest.raises(RestrictionApplyError, match="16 bytes"):
        apply(people(), plan, salt=b"short", schema=PEOPLE)
    with pytest.raises(RestrictionApplyError, match="16 bytes"):
        apply(people().slice(0, 0), plan, salt=b"short", schema=PEOPLE)


def test_new_query_salt_is_random_and_long_enough() -> None:
    salts = {new_query_salt() for _ in range(8)}
    assert len(salts) == 8
    assert all(len(salt) >= 16 for salt in salts)


def test_columns_without_field_id_metadata_match_by_name() -> None:
    batch = pa.RecordBatch.from_pydict({"country": ["US", "DE"], "email": ["a@b.c", "d@e.f"]})
    out = apply(batch, people_plan(US_ONLY, [(2, "mask-alphanum")]), salt=SALT, schema=PEOPLE)
    assert out.to_pydict() == {"country": ["US"], "email": ["x@x.x"]}


def test_field_id_metadata_wins_over_names() -> None:
    # a column renamed since: the field id still identifies the masked column
    field = pa.field("renamed_ssn", pa.large_string(), metadata={b"PARQUET:field_id": b"4"})
    batch = pa.RecordBatch.from_arrays([pa.array(["123-45-6789"], pa.large_string())], schema=pa.schema([field]))
    out = apply(batch, people_plan(None, [(4, "show-last-4")]), salt=SALT, schema=PEOPLE)
    assert out.column(0).to_pylist() == ["nnn-nn-6789"]


def test_unidentifiable_columns_fail_closed() -> None:
    batch = pa.RecordBatch.from_pydict({"mystery": [1]})
    with pytest.raises(RestrictionApplyError, match="'mystery' cannot be matched"):
        apply(batch, people_plan(None, [(4, "mask-alphanum")]), salt=SALT, schema=PEOPLE)


def test_a_missing_filter_column_fails_instead_of_returning_rows() -> None:
    with pytest.raises(RestrictionApplyError, match="field id 3"):
        apply(people().select(["id"]), people_plan(US_ONLY), salt=SALT, schema=PEOPLE)


# ---------------------------------------------------------------------------------- describe / JSON


def test_describe_names_columns_and_actions_but_no_literal_values() -> None:
    plan = people_plan({"type": "eq", "left": ref(3), "right": "SECRET-REGION"}, [(4, "show-last-4")])
    described = plan.describe()
    assert described == {
        "row_filter": True,
        "always_false": False,
        "masked_columns": [{"column": "ssn", "field_id": 4, "action": "show-last-4"}],
    }
    assert "SECRET-REGION" not in json.dumps(described)
    assert "SECRET-REGION" not in str(plan.describe())
    assert people_plan(False).describe()["row_filter"] is True
    assert EMPTY_PLAN.describe() == {"row_filter": False, "always_false": False, "masked_columns": []}


EVERY_LITERAL = {
    "type": "and",
    "left": {
        "type": "or",
        "left": {"type": "eq", "left": ref(2), "right": True},
        "right": {
            "type": "not",
            "child": {"type": "in", "child": ref(7), "values": ["1.50", "-2.00"]},
        },
    },
    "right": {
        "type": "and",
        "left": {"type": "not-starts-with", "left": ref(8), "right": "é😀"},
        "right": {
            "type": "or",
            "left": {"type": "lt", "left": ref(14), "right": "2017-11-16T22:31:08.123456789+00:00"},
            "right": {
                "type": "or",
                "left": {"type": "is-nan", "child": ref(5)},
                "right": {
                    "type": "or",
                    "left": {
                        "type": "not-in",
                        "child": ref(15),
                        "values": ["f79c3e09-677c-4bbd-a479-3f349cb785e7"],
                    },
                    "right": {
                        "type": "or",
                        "left": {"type": "gt-eq", "left": ref(16), "right": "00ff10"},
                        "right": {
                            "type": "or",
                            "left": {"type": "eq", "left": ref(10), "right": "01:02:03.000004"},
                            "right": {"type": "not-eq", "left": ref(19), "right": "Paris"},
                        },
                    },
                },
            },
        },
    },
}


def test_plan_json_round_trip() -> None:
    plan = parse_restrictions(
        restrictions(EVERY_LITERAL, [(8, "mask-alphanum"), (12, "truncate-to-month"), (3, "sha-256-query-local")]),
        ALL_TYPES,
    )
    text = json.dumps(plan.to_json())
    again = RestrictionPlan.from_json(json.loads(text))
    assert again == plan
    assert RestrictionPlan.from_json(text) == plan
    assert again.to_json() == plan.to_json()
    for other in (EMPTY_PLAN, people_plan(False, [(2, "replace-with-null")])):
        assert RestrictionPlan.from_json(json.dumps(other.to_json())) == other


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(version=2),
        lambda d: d.update(format="other"),
        lambda d: d.update(extra=1),
        lambda d: d.pop("masks"),
        lambda d: d.update({"always-false": "no"}),
        lambda d: d.update({"always-false": True}),
        lambda d: d["masks"].append(dict(d["masks"][0])),
        lambda d: d["masks"][0].update(action="reveal"),
        lambda d: d["masks"][0].update({"field-id": 0}),
        lambda d: d["row-filter"].update(type="like"),
        lambda d: d["row-filter"]["ref"].update(path=[9]),
        lambda d: d["row-filter"]["ref"].update({"field-id": True}),
        lambda d: d["row-filter"].update(value=5),
        lambda d: d["row-filter"].update(extra=None),
    ],
)
def test_plan_json_rejects_tampering(mutate: Any) -> None:
    document = people_plan(US_ONLY, [(4, "mask-alphanum")]).to_json()
    mutate(document)
    with pytest.raises(InvalidRestrictionError, match="restriction"):
        RestrictionPlan.from_json(document)


def test_plan_is_frozen_and_masks_are_read_only() -> None:
    plan = people_plan(US_ONLY, [(4, "mask-alphanum")])
    with pytest.raises(AttributeError):
        plan.always_false = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.masks[4] = "replace-with-null"  # type: ignore[index]
    assert hash(plan) == hash(people_plan(US_ONLY, [(4, "mask-alphanum")]))


# ----------------------------------------------------------------------------------------- pushdown


def pushdown_keeps(expression: BooleanExpression, schema: Schema, table: pa.Table) -> list[bool]:
    """Which rows pyiceberg's own Arrow evaluation of the pushed-down expression would keep."""
    if isinstance(expression, AlwaysTrue):
        return [True] * table.num_rows
    if isinstance(expression, AlwaysFalse):
        return [False] * table.num_rows
    kept_ids = set(table.filter(expression_to_pyarrow(bind(schema, expression, True), schema)).column("id").to_pylist())
    return [row_id in kept_ids for row_id in table.column("id").to_pylist()]


PUSHDOWN_ROWS = {
    "id": [1, 2, 3, 4, 5, 6],
    "i": [1, 2, None, 4, 5, 6],
    "d": [1.0, float("nan"), None, -1.0, 2.5, 0.0],
    "s": ["US", "DE", None, "USA", "", "é"],
    "ts_ns": [1, 2, None, 4, 5, 6],
    "addr": [
        {"city": "Paris", "zip": 1},
        None,
        {"city": None, "zip": 2},
        {"city": "Rome", "zip": 3},
        None,
        None,
    ],
}


def op(kind: str, field_id: int, value: Any) -> dict[str, Any]:
    return {"type": kind, "left": ref(field_id), "right": value}


@pytest.mark.parametrize(
    "node",
    [
        op("eq", 8, "US"),
        op("not-eq", 8, "US"),
        {"type": "not", "child": op("eq", 8, "US")},
        {"type": "not", "child": op("not-eq", 8, "US")},
        op("lt", 3, 4),
        {"type": "not", "child": op("lt", 3, 4)},
        {"type": "not", "child": op("gt-eq", 6, 1.0)},
        op("not-eq", 6, 1.0),
        {"type": "not", "child": {"type": "and", "left": op("gt", 3, 1), "right": op("lt", 6, 2.0)}},
        {
            "type": "not",
            "child": {"type": "or", "left": op("eq", 8, "DE"), "right": op("starts-with", 8, "U")},
        },
        {"type": "not-in", "child": ref(8), "values": ["US", "DE"]},
        {"type": "not", "child": {"type": "in", "child": ref(3), "values": [1, 2]}},
        op("not-starts-with", 8, "U"),
        {"type": "not-nan", "child": ref(6)},
        {"type": "not", "child": {"type": "is-nan", "child": ref(6)}},
        {"type": "not", "child": {"type": "not-null", "child": ref(8)}},
        op("not-eq", 19, "Paris"),
        # zip is required inside the optional addr: null wherever addr is, though pyiceberg binds it as never null
        op("not-eq", 20, 2),
        {"type": "not", "child": op("lt", 20, 2)},
        {"type": "not-in", "child": ref(20), "values": [1, 2]},
        {"type": "is-null", "child": ref(20)},
        {"type": "not", "child": {"type": "not-null", "child": ref(20)}},
        op("gt", 13, "1970-01-01T00:00:00.000000002"),
        {"type": "and", "left": op("gt", 3, 1), "right": op("lt", 13, "1970-01-01T00:00:00.000000005")},
    ],
)
def test_pushdown_keeps_every_row_the_exact_filter_keeps(node: Any) -> None:
    plan = parse_restrictions(restrictions(node), ALL_TYPES)
    batch = batch_of(ALL_TYPES, PUSHDOWN_ROWS)
    assert plan.row_filter is not None
    exact = evaluate(plan.row_filter, BatchColumns(batch, ALL_TYPES)).to_pylist()
    table = pa.Table.from_batches([batch])
    read_schema = ALL_TYPES.select(*batch.schema.names)
    for schema in (None, ALL_TYPES):
        pushed = plan.safe_pushdown_filter(schema)
        by_pyiceberg = pushdown_keeps(pushed, read_schema, table)
        assert all(p or not e for p, e in zip(by_pyiceberg, exact, strict=True)), (
            pushed,
            exact,
            by_pyiceberg,
        )


def test_pushdown_is_exact_where_pyiceberg_can_express_it() -> None:
    plan = parse_restrictions(restrictions(op("not-eq", 8, "US")), ALL_TYPES)
    batch = batch_of(ALL_TYPES, PUSHDOWN_ROWS)
    assert plan.row_filter is not None
    exact = evaluate(plan.row_filter, BatchColumns(batch, ALL_TYPES)).to_pylist()
    pushed = plan.safe_pushdown_filter(ALL_TYPES)
    assert pushdown_keeps(pushed, ALL_TYPES.select(*batch.schema.names), pa.Table.from_batches([batch])) == exact


@pytest.mark.parametrize("negated", [False, True])
@pytest.mark.parametrize(
    "leaf",
    [
        *(
            op(kind, field_id, value)
            for kind in ("eq", "not-eq", "lt", "lt-eq", "gt", "gt-eq")
            for field_id, value in ((3, 2), (6, 1.0))
        ),
        *({"type": kind, "child": ref(field_id)} for kind in ("is-null", "not-null") for field_id in (3, 6, 8)),
        *({"type": kind, "child": ref(6)} for kind in ("is-nan", "not-nan")),
    ],
)
def test_pushdown_of_every_comparison_and_check_is_exact_negated_or_not(leaf: Any, negated: bool) -> None:
    # Not only safe: a leaf pushed weaker than it needs (say, OR is_null on a negated null check) prunes nothing.
    node = {"type": "not", "child": leaf} if negated else leaf
    plan = parse_restrictions(restrictions(node), ALL_TYPES)
    batch = batch_of(ALL_TYPES, PUSHDOWN_ROWS)
    assert plan.row_filter is not None
    exact = evaluate(plan.row_filter, BatchColumns(batch, ALL_TYPES)).to_pylist()
    pushed = plan.safe_pushdown_filter(ALL_TYPES)
    assert pushdown_keeps(pushed, ALL_TYPES.select(*batch.schema.names), pa.Table.from_batches([batch])) == exact


def test_pushdown_constants_and_unrepresentable_leaves() -> None:
    assert plan_pushdown(None) == AlwaysTrue()
    assert plan_pushdown(False) == AlwaysFalse()
    assert plan_pushdown(op("eq", 13, "1970-01-01T00:00:00.000000001")) == AlwaysTrue()  # ns literal: not pushed


def plan_pushdown(node: Any) -> BooleanExpression:
    return parse_restrictions(restrictions(node), ALL_TYPES).safe_pushdown_filter(ALL_TYPES)


def test_pushdown_refuses_a_name_that_binds_to_another_field_in_the_scan_schema() -> None:
    plan = parse_restrictions(restrictions(op("eq", 8, "US")), ALL_TYPES)
    renamed = Schema(NestedField(99, "s", StringType(), required=False))  # same name, different field id
    assert plan.safe_pushdown_filter(renamed) == AlwaysTrue()
    assert plan.safe_pushdown_filter(ALL_TYPES) != AlwaysTrue()


def test_pushdown_literals_bind_for_every_pushable_type() -> None:
    values = {
        2: True, 3: 5, 4: 5, 5: 0.5, 6: 0.5, 7: "1.50", 8: "x", 9: "2024-01-01", 10: "01:00:00",
        11: "2024-01-01T00:00:00", 12: "2024-01-01T00:00:00+00:00",
        16: "616263", 17: "00",
    }  # fmt: skip
    for field_id, value in values.items():
        pushed = plan_pushdown(op("eq", field_id, value))
        assert pushed != AlwaysTrue(), field_id
        bind(ALL_TYPES, pushed, case_sensitive=True)


def test_uuid_filters_are_not_pushed_because_pyiceberg_cannot_evaluate_them_over_arrow() -> None:
    assert plan_pushdown(op("eq", 15, "f79c3e09-677c-4bbd-a479-3f349cb785e7")) == AlwaysTrue()


def test_arrow_schema_helper_matches_pyiceberg() -> None:
    # guards the fixtures: batches carry pyiceberg's Arrow types and field ids
    assert batch_of(ALL_TYPES, {"s": ["a"]}).schema.field("s") == schema_to_pyarrow(ALL_TYPES).field("s")


def test_dates_and_int_hashes_survive_apply_end_to_end() -> None:
    plan = parse_restrictions(
        restrictions(op("gt-eq", 9, "2000-01-01"), [(9, "truncate-to-year"), (3, "sha-256-global")]),
        ALL_TYPES,
    )
    batch = batch_of(ALL_TYPES, {"dt": [dt.date(2024, 7, 15), dt.date(1999, 1, 1), None], "i": [5, 6, 7]})
    out = apply(batch, plan, salt=SALT, schema=ALL_TYPES)
    expected_hash = struct.unpack("<i", hashlib.sha256(struct.pack("<i", 5)).digest()[:4])[0]
    assert out.to_pydict() == {"dt": [dt.date(2024, 1, 1)], "i": [expected_hash]}
