"""parse_restrictions: the wire shape, every expression form, and every invalid shape failing closed."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import GeometryType, IntegerType, NestedField, StringType, StructType

from sqe.errors import InvalidRestrictionError, RestrictionError, UnsupportedRestrictionError
from sqe.restrictions import EMPTY_PLAN, ColumnMask, parse_restrictions
from sqe.restrictions.expressions import (
    And,
    Comparison,
    FieldRef,
    Not,
    NullCheck,
    Or,
    SetMembership,
    StartsWith,
)
from tests.unit.sqe.restrictions.restriction_fixtures import ALL_TYPES, ref, restrictions

S = FieldRef(8, "s", "string", (8,))
I = FieldRef(3, "i", "int", (3,))  # noqa: E741
EQ_S = {"type": "eq", "left": ref(8), "right": "US"}


def parse(row_filter: Any = None, projections: list[tuple[int, str]] | None = None) -> Any:
    return parse_restrictions(restrictions(row_filter, projections), ALL_TYPES)


def row_filter_of(node: Any) -> Any:
    return parse(node).row_filter


# ----------------------------------------------------------------------------------- no restriction


@pytest.mark.parametrize("raw", [None, {}, "null", "{}", b"{}"])
def test_absent_or_empty_means_no_restriction(raw: Any) -> None:
    plan = parse_restrictions(raw, ALL_TYPES)
    assert plan == EMPTY_PLAN
    assert not plan.is_restricted


@pytest.mark.parametrize(
    "node",
    [True, {"type": "true"}, {"type": "or", "left": EQ_S, "right": True}, {"type": "not", "child": False}],
)
def test_always_true_filters_mean_no_filter(node: Any) -> None:
    plan = parse(node)
    assert plan.row_filter is None
    assert not plan.always_false
    assert not plan.is_restricted


@pytest.mark.parametrize(
    "node",
    [
        False,
        {"type": "false"},
        {"type": "and", "left": EQ_S, "right": False},
        {"type": "not", "child": True},
        {"type": "in", "child": ref(8), "values": []},
    ],
)
def test_false_filters_mean_no_rows(node: Any) -> None:
    plan = parse(node)
    assert plan.always_false
    assert plan.row_filter is None
    assert plan.is_restricted


def test_null_filter_and_null_projections_are_absent() -> None:
    plan = parse_restrictions({"required-row-filter": None, "required-column-projections": None}, ALL_TYPES)
    assert plan == EMPTY_PLAN


def test_json_text_is_accepted() -> None:
    text = json.dumps(restrictions(EQ_S, [(8, "mask-alphanum")]))
    plan = parse_restrictions(text, ALL_TYPES)
    assert plan.row_filter == Comparison("eq", S, "US")
    assert plan.column_masks == (ColumnMask(8, "mask-alphanum", "s", "string"),)


# --------------------------------------------------------------------------------- expression forms


def test_spec_example() -> None:
    raw = {
        "required-column-projections": [
            {"field-id": 8, "action": "show-last-4"},
            {"field-id": 3, "action": "replace-with-null"},
            {"field-id": 9, "action": "truncate-to-year"},
            {"field-id": 4, "action": "sha-256-global"},
            {"field-id": 30, "action": "mask-alphanum"},
        ],
        "required-row-filter": {
            "type": "eq",
            "left": {"type": "reference", "id": 8},
            "right": {"type": "literal", "value": "US"},
        },
    }
    plan = parse_restrictions(raw, ALL_TYPES)
    assert plan.row_filter == Comparison("eq", S, "US")
    assert dict(plan.masks) == {
        8: "show-last-4",
        3: "replace-with-null",
        9: "truncate-to-year",
        4: "sha-256-global",
        30: "mask-alphanum",
    }
    assert plan.masked_field_ids == frozenset({8, 3, 9, 4, 30})


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"type": "lt", "left": ref(3), "right": 5}, Comparison("lt", I, 5)),
        ({"type": "lt-eq", "left": ref(3), "right": 5}, Comparison("lt-eq", I, 5)),
        ({"type": "gt", "left": ref(3), "right": 5}, Comparison("gt", I, 5)),
        ({"type": "gt-eq", "left": ref(3), "right": 5}, Comparison("gt-eq", I, 5)),
        ({"type": "not-eq", "left": ref(3), "right": 5}, Comparison("not-eq", I, 5)),
        # a literal on the left flips the operator
        ({"type": "lt", "left": 5, "right": ref(3)}, Comparison("gt", I, 5)),
        ({"type": "gt-eq", "left": 5, "right": ref(3)}, Comparison("lt-eq", I, 5)),
        ({"type": "eq", "left": "US", "right": ref(8)}, Comparison("eq", S, "US")),
        ({"type": "eq", "left": ref(3), "right": {"type": "literal", "value": 5}}, Comparison("eq", I, 5)),
        (
            {"type": "eq", "left": ref(3), "right": {"type": "literal", "value": 5, "data-type": "int"}},
            Comparison("eq", I, 5),
        ),
        (
            {"type": "eq", "left": ref(3), "right": {"type": "literal", "value": 5, "data-type": "long"}},
            Comparison("eq", I, 5),
        ),
        ({"type": "starts-with", "left": ref(8), "right": "ab"}, StartsWith(S, "ab", negated=False)),
        ({"type": "not-starts-with", "left": ref(8), "right": "ab"}, StartsWith(S, "ab", negated=True)),
        ({"type": "in", "child": ref(3), "values": [1, 2, 2]}, SetMembership(I, (1, 2), negated=False)),
        (
            {"type": "not-in", "child": ref(3), "values": [1, {"type": "literal", "value": 2}]},
            SetMembership(I, (1, 2), negated=True),
        ),
        (
            {
                "type": "in",
                "child": ref(3),
                "values": {"type": "literals", "values": [7], "data-type": "int"},
            },
            SetMembership(I, (7,), negated=False),
        ),
        ({"type": "is-null", "child": ref(8)}, NullCheck("is-null", S)),
        ({"type": "not-null", "child": ref(8)}, NullCheck("not-null", S)),
        ({"type": "is-nan", "child": ref(6)}, NullCheck("is-nan", FieldRef(6, "d", "double", (6,)))),
        ({"type": "not-nan", "child": ref(5)}, NullCheck("not-nan", FieldRef(5, "f", "float", (5,)))),
        ({"type": "not", "child": EQ_S}, Not(Comparison("eq", S, "US"))),
        (
            {"type": "and", "left": EQ_S, "right": {"type": "is-null", "child": ref(3)}},
            And(Comparison("eq", S, "US"), NullCheck("is-null", I)),
        ),
        (
            {"type": "or", "left": EQ_S, "right": {"type": "is-null", "child": ref(3)}},
            Or(Comparison("eq", S, "US"), NullCheck("is-null", I)),
        ),
        ({"type": "and", "left": True, "right": EQ_S}, Comparison("eq", S, "US")),
        ({"type": "or", "left": False, "right": EQ_S}, Comparison("eq", S, "US")),
        ({"type": "not-in", "child": ref(3), "values": []}, None),
        (
            {"type": "eq", "left": {"type": "reference", "name": "s"}, "right": "US"},
            Comparison("eq", S, "US"),
        ),
        (
            {"type": "eq", "left": ref(19), "right": "Paris"},
            Comparison("eq", FieldRef(19, "addr.city", "string", (18, 19)), "Paris"),
        ),
        (
            {"type": "eq", "left": ref(7), "right": "1.50"},
            Comparison("eq", FieldRef(7, "dec", "decimal(9,2)", (7,)), Decimal("1.50")),
        ),
    ],
)
def test_new_expression_forms(node: Any, expected: Any) -> None:
    assert row_filter_of(node) == expected


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"type": "eq", "term": "s", "value": "US"}, Comparison("eq", S, "US")),
        (
            {"type": "eq", "term": {"type": "reference", "term": "s"}, "value": "US"},
            Comparison("eq", S, "US"),
        ),
        ({"type": "lt", "term": "i", "value": 3}, Comparison("lt", I, 3)),
        ({"type": "is-null", "term": "s"}, NullCheck("is-null", S)),
        ({"type": "in", "term": "i", "values": [1, 2]}, SetMembership(I, (1, 2), negated=False)),
        ({"type": "not-in", "term": "i", "values": [1]}, SetMembership(I, (1,), negated=True)),
        ({"type": "starts-with", "term": "s", "value": "a"}, StartsWith(S, "a", negated=False)),
        (
            {"type": "eq", "term": "addr.city", "value": "x"},
            Comparison("eq", FieldRef(19, "addr.city", "string", (18, 19)), "x"),
        ),
        (
            {"type": "and", "left": {"type": "true"}, "right": {"type": "eq", "term": "i", "value": 1}},
            Comparison("eq", I, 1),
        ),
    ],
)
def test_deprecated_term_value_forms(node: Any, expected: Any) -> None:
    assert row_filter_of(node) == expected


def test_a_bare_string_on_the_left_is_a_literal_not_a_column() -> None:
    # "s" names a column, but in left position it is the string literal "s": two literals, nothing to bind.
    with pytest.raises(UnsupportedRestrictionError, match="one column with one literal"):
        row_filter_of({"type": "eq", "left": "s", "right": "US"})
    with pytest.raises(UnsupportedRestrictionError, match="needs a column"):
        row_filter_of({"type": "is-null", "child": "s"})


def test_a_dropped_branch_must_still_be_valid() -> None:
    bad = {"type": "eq", "left": ref(999), "right": 1}
    with pytest.raises(InvalidRestrictionError, match="field id 999"):
        row_filter_of({"type": "and", "left": False, "right": bad})
    with pytest.raises(InvalidRestrictionError, match="field id 999"):
        row_filter_of({"type": "or", "left": bad, "right": True})


# ---------------------------------------------------------------------------------- invalid filters


@pytest.mark.parametrize(
    ("node", "error", "message"),
    [
        (
            {"type": "apply", "function": "bucket", "arguments": [16, ref(3)]},
            UnsupportedRestrictionError,
            "apply",
        ),
        (
            {
                "type": "eq",
                "left": {"type": "apply", "function": "year", "arguments": [ref(9)]},
                "right": 2024,
            },
            UnsupportedRestrictionError,
            "apply",
        ),
        (
            {"type": "like", "left": ref(8), "right": "a%"},
            UnsupportedRestrictionError,
            "unknown expression type 'like'",
        ),
        (
            {"type": "eq", "left": ref(8), "right": {"type": "mystery"}},
            UnsupportedRestrictionError,
            "unknown expression",
        ),
        (
            {"type": "eq", "term": {"type": "transform", "transform": "bucket[16]", "term": "i"}, "value": 1},
            UnsupportedRestrictionError,
            "transforms",
        ),
        (
            {"type": "eq", "left": ref(3), "right": ref(4)},
            UnsupportedRestrictionError,
            "one column with one literal",
        ),
        ({"type": "eq", "left": 1, "right": 2}, UnsupportedRestrictionError, "one column with one literal"),
        (
            {"type": "starts-with", "left": "ab", "right": ref(8)},
            UnsupportedRestrictionError,
            "column on the left",
        ),
        ({"type": "eq", "left": ref(22), "right": "x"}, UnsupportedRestrictionError, "inside a list or map"),
        ({"type": "eq", "left": ref(25), "right": 1}, UnsupportedRestrictionError, "inside a list or map"),
        (
            {"type": "in", "child": ref(3), "values": [ref(4)]},
            UnsupportedRestrictionError,
            "must be literals",
        ),
        (
            {"type": "eq", "left": ref(999), "right": 1},
            InvalidRestrictionError,
            "field id 999 is not in the current",
        ),
        ({"type": "eq", "left": ref(0), "right": 1}, InvalidRestrictionError, "must be positive"),
        ({"type": "eq", "left": ref(-3), "right": 1}, InvalidRestrictionError, "must be positive"),
        (
            {"type": "eq", "left": {"type": "reference", "id": True}, "right": 1},
            InvalidRestrictionError,
            "integer",
        ),
        (
            {"type": "eq", "left": {"type": "reference", "id": "3"}, "right": 1},
            InvalidRestrictionError,
            "integer",
        ),
        ({"type": "eq", "left": {"type": "reference"}, "right": 1}, InvalidRestrictionError, "needs an 'id'"),
        (
            {"type": "eq", "left": {"type": "reference", "name": "nope"}, "right": 1},
            InvalidRestrictionError,
            "not in",
        ),
        (
            {"type": "eq", "term": "nope", "value": 1},
            InvalidRestrictionError,
            "not in the current table schema",
        ),
        ({"type": "eq", "left": ref(3), "right": "5"}, InvalidRestrictionError, "does not fit type int"),
        ({"type": "eq", "left": ref(3), "right": 2**31}, InvalidRestrictionError, "does not fit type int"),
        ({"type": "eq", "left": ref(5), "right": 1}, InvalidRestrictionError, "does not fit type float"),
        ({"type": "eq", "left": ref(7), "right": "1.5"}, InvalidRestrictionError, "scale"),
        ({"type": "eq", "left": ref(12), "right": "2024-01-01T00:00:00"}, InvalidRestrictionError, "+00:00"),
        (
            {"type": "eq", "left": ref(8), "right": None},
            InvalidRestrictionError,
            "expected a reference or a literal",
        ),
        (
            {"type": "eq", "left": ref(8), "right": {"type": "literal", "value": None}},
            InvalidRestrictionError,
            "null literal",
        ),
        (
            {"type": "eq", "left": ref(3), "right": {"type": "literal", "value": "x", "data-type": "string"}},
            InvalidRestrictionError,
            "cannot be compared",
        ),
        (
            {"type": "eq", "left": ref(3), "right": {"type": "literal", "value": 1, "data-type": "varchar"}},
            InvalidRestrictionError,
            "data-type",
        ),
        (
            {"type": "eq", "left": ref(3), "right": {"type": "literal", "value": 1, "data-type": 5}},
            InvalidRestrictionError,
            "data-type",
        ),
        ({"type": "eq", "left": ref(3), "right": [1]}, InvalidRestrictionError, "reference or a literal"),
        (
            {"type": "starts-with", "left": ref(3), "right": "1"},
            InvalidRestrictionError,
            "needs a string column",
        ),
        ({"type": "is-nan", "child": ref(3)}, InvalidRestrictionError, "float or double"),
        (
            {"type": "eq", "left": ref(18), "right": "x"},
            InvalidRestrictionError,
            "cannot apply to field id 18",
        ),
        (
            {"type": "in", "child": ref(21), "values": ["x"]},
            InvalidRestrictionError,
            "cannot apply to field id 21",
        ),
        ({"type": "eq", "left": ref(3)}, InvalidRestrictionError, "missing ['right']"),
        ({"type": "eq", "left": ref(3), "right": 1, "extra": 0}, InvalidRestrictionError, "unexpected keys"),
        ({"type": "eq", "left": ref(3), "right": 1, "term": "i"}, InvalidRestrictionError, "unexpected keys"),
        ({"type": "and", "left": EQ_S}, InvalidRestrictionError, "missing"),
        ({"type": "not", "child": EQ_S, "left": EQ_S}, InvalidRestrictionError, "unexpected keys"),
        ({"type": "true", "value": 1}, InvalidRestrictionError, "unexpected keys"),
        ({"type": "in", "child": ref(3), "values": 1}, InvalidRestrictionError, "must be a list"),
        ({"type": "in", "term": "i", "values": 1}, InvalidRestrictionError, "must be a list"),
        (
            {"type": "in", "child": ref(3), "values": {"type": "literals", "values": 1}},
            InvalidRestrictionError,
            "list",
        ),
        (
            {"type": "eq", "left": {"type": "reference", "id": 3, "name": "i"}, "right": 1},
            InvalidRestrictionError,
            "unexpected keys",
        ),
        ({"type": "reference", "id": 3}, InvalidRestrictionError, "not a predicate"),
        ({"type": "literal", "value": True}, InvalidRestrictionError, "not a predicate"),
        ({"type": 5}, InvalidRestrictionError, "no string 'type'"),
        ({"left": ref(3)}, InvalidRestrictionError, "no string 'type'"),
        ("eq", InvalidRestrictionError, "expected a predicate"),
        (1, InvalidRestrictionError, "expected a predicate"),
        ([EQ_S], InvalidRestrictionError, "expected a predicate"),
    ],
)
def test_invalid_filters_fail_closed(node: Any, error: type[RestrictionError], message: str) -> None:
    with pytest.raises(error) as caught:
        row_filter_of(node)
    assert message in str(caught.value)
    assert str(caught.value).startswith("read-restrictions:")


# -------------------------------------------------------------------------------------- projections


@pytest.mark.parametrize(
    ("projections", "error", "message"),
    [
        ("x", InvalidRestrictionError, "must be a list"),
        ({"field-id": 3, "action": "replace-with-null"}, InvalidRestrictionError, "must be a list"),
        ([3], InvalidRestrictionError, "exactly 'field-id' and 'action'"),
        ([{"field-id": 3}], InvalidRestrictionError, "exactly 'field-id' and 'action'"),
        ([{"field-id": 3, "action": "mask-alphanum", "extra": 1}], InvalidRestrictionError, "exactly"),
        ([{"field-id": "3", "action": "replace-with-null"}], InvalidRestrictionError, "must be an integer"),
        ([{"field-id": True, "action": "replace-with-null"}], InvalidRestrictionError, "must be an integer"),
        ([{"field-id": 3.0, "action": "replace-with-null"}], InvalidRestrictionError, "must be an integer"),
        ([{"field-id": 0, "action": "replace-with-null"}], InvalidRestrictionError, "must be positive"),
        ([{"field-id": -1, "action": "replace-with-null"}], InvalidRestrictionError, "must be positive"),
        ([{"field-id": 3, "action": 5}], InvalidRestrictionError, "must be a string"),
        ([{"field-id": 3, "action": "hide"}], UnsupportedRestrictionError, "unknown action 'hide'"),
        ([{"field-id": 3, "action": "Mask-Alphanum"}], UnsupportedRestrictionError, "unknown action"),
        (
            [{"field-id": 3, "action": "replace-with-null"}, {"field-id": 3, "action": "sha-256-global"}],
            InvalidRestrictionError,
            "duplicate column projections for field id 3",
        ),
        (
            [{"field-id": 999, "action": "replace-with-null"}],
            InvalidRestrictionError,
            "field id 999 is not in",
        ),
        ([{"field-id": 24, "action": "mask-alphanum"}], InvalidRestrictionError, "targets a map key"),
        ([{"field-id": 28, "action": "mask-alphanum"}], InvalidRestrictionError, "targets a map key"),
        ([{"field-id": 27, "action": "mask-to-fixed-value"}], InvalidRestrictionError, "targets a map key"),
        (
            [{"field-id": 19, "action": "mask-alphanum"}, {"field-id": 18, "action": "replace-with-null"}],
            InvalidRestrictionError,
            "field id 19 and on its ancestor 18",
        ),
        (
            [{"field-id": 21, "action": "mask-to-fixed-value"}, {"field-id": 22, "action": "mask-alphanum"}],
            InvalidRestrictionError,
            "ancestor 21",
        ),
        (
            [{"field-id": 25, "action": "sha-256-global"}, {"field-id": 23, "action": "replace-with-null"}],
            InvalidRestrictionError,
            "ancestor 23",
        ),
        ([{"field-id": 19, "action": "mask-alphanum"}], UnsupportedRestrictionError, "nested field id 19"),
        ([{"field-id": 22, "action": "mask-alphanum"}], UnsupportedRestrictionError, "nested field id 22"),
        ([{"field-id": 25, "action": "sha-256-global"}], UnsupportedRestrictionError, "nested field id 25"),
        ([{"field-id": 1, "action": "replace-with-null"}], InvalidRestrictionError, "required"),
        ([{"field-id": 30, "action": "replace-with-null"}], InvalidRestrictionError, "required"),
    ],
)
def test_invalid_projections_fail_closed(projections: Any, error: type[RestrictionError], message: str) -> None:
    with pytest.raises(error) as caught:
        parse_restrictions({"required-column-projections": projections}, ALL_TYPES)
    assert message in str(caught.value)


APPLICABLE = {
    "mask-alphanum": {"s", "req_s"},
    "show-first-4": {"s", "req_s"},
    "show-last-4": {"s", "req_s"},
    "truncate-to-year": {"dt", "ts", "tstz", "ts_ns", "tstz_ns"},
    "truncate-to-month": {"dt", "ts", "tstz", "ts_ns", "tstz_ns"},
    "sha-256-global": {"i", "l", "id", "s", "req_s", "bin"},
    "sha-256-query-local": {"i", "l", "id", "s", "req_s", "bin"},
    "mask-to-fixed-value": {field.name for field in ALL_TYPES.fields},
    "replace-with-null": {field.name for field in ALL_TYPES.fields if not field.required},
}


@pytest.mark.parametrize("action", sorted(APPLICABLE))
def test_each_action_applies_exactly_to_its_types(action: str) -> None:
    for field in ALL_TYPES.fields:
        raw = {"required-column-projections": [{"field-id": field.field_id, "action": action}]}
        if field.name in APPLICABLE[action]:
            plan = parse_restrictions(raw, ALL_TYPES)
            assert plan.masks == {field.field_id: action}
        else:
            with pytest.raises(InvalidRestrictionError, match=f"{action} on field id {field.field_id}"):
                parse_restrictions(raw, ALL_TYPES)


def test_mask_to_fixed_value_on_a_struct_needs_fixed_values_for_every_field() -> None:
    schema = Schema(
        NestedField(1, "ok", StructType(NestedField(2, "a", IntegerType(), required=False)), required=False),
        NestedField(3, "bad", StructType(NestedField(4, "g", GeometryType(), required=False)), required=False),
        NestedField(5, "g", GeometryType(), required=False),
    )
    assert parse_restrictions(restrictions(None, [(1, "mask-to-fixed-value")]), schema).masks == {
        1: "mask-to-fixed-value"
    }
    for field_id in (3, 5):
        with pytest.raises(InvalidRestrictionError, match="no fixed value"):
            parse_restrictions(restrictions(None, [(field_id, "mask-to-fixed-value")]), schema)


def test_projection_on_a_dropped_column_is_allowed_but_an_unknown_id_is_not() -> None:
    old = Schema(
        NestedField(1, "id", IntegerType(), required=True),
        NestedField(2, "ssn", StringType(), required=False),
        schema_id=0,
    )
    current = Schema(NestedField(1, "id", IntegerType(), required=True), schema_id=1)
    plan = parse_restrictions(restrictions(None, [(2, "mask-alphanum")]), current, all_schemas=[old, current])
    assert plan.column_masks == (ColumnMask(2, "mask-alphanum", "ssn", "string"),)
    assert plan.is_restricted
    with pytest.raises(InvalidRestrictionError, match="field id 2 is not in the table schema"):
        parse_restrictions(restrictions(None, [(2, "mask-alphanum")]), current)
    with pytest.raises(InvalidRestrictionError, match="field id 3"):
        parse_restrictions(restrictions(None, [(3, "mask-alphanum")]), current, all_schemas=[old, current])


def test_a_dropped_column_is_validated_against_its_last_type() -> None:
    old = Schema(NestedField(1, "id", IntegerType(), required=True), NestedField(2, "n", IntegerType()), schema_id=0)
    current = Schema(NestedField(1, "id", IntegerType(), required=True), schema_id=1)
    with pytest.raises(InvalidRestrictionError, match="mask-alphanum on field id 2"):
        parse_restrictions(restrictions(None, [(2, "mask-alphanum")]), current, all_schemas=[old])


def test_filter_references_resolve_only_against_the_current_schema() -> None:
    old = Schema(NestedField(1, "id", IntegerType(), required=True), NestedField(2, "n", IntegerType()), schema_id=0)
    current = Schema(NestedField(1, "id", IntegerType(), required=True), schema_id=1)
    with pytest.raises(InvalidRestrictionError, match="field id 2 is not in the current table schema"):
        parse_restrictions(restrictions({"type": "eq", "left": ref(2), "right": 1}), current, all_schemas=[old])


# ----------------------------------------------------------------------------------- document shape


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "expected a JSON object"),
        ("[]", "expected a JSON object"),
        (5, "expected a JSON object"),
        ({"required-row-filter": True, "required-masks": []}, "unexpected keys ['required-masks']"),
        ("{", "malformed JSON"),
        ('{"required-row-filter": true, "required-row-filter": false}', "malformed JSON"),
        (
            '{"required-row-filter": {"type": "eq", "left": {"type": "reference", "id": 5}, "right": NaN}}',
            "malformed",
        ),
        (b"\xff\xfe", "malformed JSON"),
    ],
)
def test_malformed_documents_fail_closed(raw: Any, message: str) -> None:
    with pytest.raises(InvalidRestrictionError, match="read-restrictions") as caught:
        parse_restrictions(raw, ALL_TYPES)
    assert message in str(caught.value)


def test_absurdly_deep_filters_fail_closed() -> None:
    node: Any = EQ_S
    for _ in range(5000):
        node = {"type": "not", "child": node}
    with pytest.raises(InvalidRestrictionError, match="nested too deeply"):
        parse_restrictions({"required-row-filter": node}, ALL_TYPES)
    text = '{"required-row-filter": ' + '{"type": "not", "child": ' * 100_000 + "true" + "}" * 100_001
    with pytest.raises(InvalidRestrictionError, match="malformed JSON"):
        parse_restrictions(text, ALL_TYPES)
