"""Row-filter evaluation on raw Arrow values: two-valued logic, nulls, NaN, byte order, every literal type."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from sqe.errors import RestrictionApplyError
from sqe.restrictions import parse_restrictions
from sqe.restrictions.columns import BatchColumns
from sqe.restrictions.evaluate import evaluate
from tests.unit.sqe.restrictions.restriction_fixtures import ALL_TYPES, batch_of, ref, restrictions

UTC = dt.UTC


def kept(node: Any, columns: dict[str, list[Any]]) -> list[bool]:
    plan = parse_restrictions(restrictions(node), ALL_TYPES)
    assert plan.row_filter is not None
    mask = evaluate(plan.row_filter, BatchColumns(batch_of(ALL_TYPES, columns), ALL_TYPES))
    assert mask.null_count == 0, "two-valued logic: a filter result is never null"
    return list(mask.to_pylist())


def op(kind: str, field_id: int, value: Any) -> dict[str, Any]:
    return {"type": kind, "left": ref(field_id), "right": value}


INTS = [1, 2, 3, None]


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (op("eq", 3, 2), [False, True, False, False]),
        (op("not-eq", 3, 2), [True, False, True, True]),  # not-eq is the negation of eq: null -> true
        (op("lt", 3, 2), [True, False, False, False]),
        (op("lt-eq", 3, 2), [True, True, False, False]),
        (op("gt", 3, 2), [False, False, True, False]),
        (op("gt-eq", 3, 2), [False, True, True, False]),
        ({"type": "in", "child": ref(3), "values": [1, 3]}, [True, False, True, False]),
        ({"type": "not-in", "child": ref(3), "values": [1, 3]}, [False, True, False, True]),
        ({"type": "is-null", "child": ref(3)}, [False, False, False, True]),
        ({"type": "not-null", "child": ref(3)}, [True, True, True, False]),
        ({"type": "not", "child": op("lt", 3, 2)}, [False, True, True, True]),
        ({"type": "not", "child": op("not-eq", 3, 2)}, [False, True, False, False]),
        ({"type": "and", "left": op("gt", 3, 1), "right": op("lt", 3, 3)}, [False, True, False, False]),
        (
            {"type": "or", "left": op("lt", 3, 2), "right": {"type": "is-null", "child": ref(3)}},
            [True, False, False, True],
        ),
        (
            {"type": "not", "child": {"type": "and", "left": op("gt", 3, 1), "right": op("eq", 3, 9)}},
            [True] * 4,
        ),
        (op("lt", 3, 2) | {"left": 2, "right": ref(3)}, [False, False, True, False]),  # 2 < i  ==  i > 2
    ],
)
def test_two_valued_logic_with_nulls(node: Any, expected: list[bool]) -> None:
    assert kept(node, {"i": INTS}) == expected


FLOATS = [1.0, float("nan"), None, -0.5]


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (op("eq", 6, 1.0), [True, False, False, False]),
        (op("not-eq", 6, 1.0), [False, True, True, True]),
        (op("lt", 6, 2.0), [True, False, False, True]),
        (op("gt", 6, -1.0), [True, False, False, True]),
        (op("gt-eq", 6, -0.5), [True, False, False, True]),
        ({"type": "not", "child": op("lt", 6, 2.0)}, [False, True, True, False]),
        ({"type": "in", "child": ref(6), "values": [1.0, -0.5]}, [True, False, False, True]),
        ({"type": "not-in", "child": ref(6), "values": [1.0]}, [False, True, True, True]),
        ({"type": "is-nan", "child": ref(6)}, [False, True, False, False]),
        ({"type": "not-nan", "child": ref(6)}, [True, False, True, True]),
        ({"type": "is-null", "child": ref(6)}, [False, False, True, False]),
        ({"type": "not-null", "child": ref(6)}, [True, True, False, True]),
    ],
)
def test_nan_behaves_like_null_in_comparisons(node: Any, expected: list[bool]) -> None:
    assert kept(node, {"d": FLOATS}) == expected


@pytest.mark.parametrize(("field_id", "column"), [(5, "f"), (6, "d")])
@pytest.mark.parametrize("zero", [0.0, -0.0])
def test_signed_zeros_are_one_value_for_comparisons_and_sets_alike(field_id: int, column: str, zero: float) -> None:
    """``in``/``not-in`` agree with ``eq``/``not-eq`` (IEEE: -0.0 equals 0.0); a set must not keep a row its
    ``eq`` form hides, or the other way round."""
    values = {column: [-0.0, 0.0, 1.0, None]}
    equal = kept(op("eq", field_id, zero), values)
    assert equal == [True, True, False, False]
    assert kept({"type": "in", "child": ref(field_id), "values": [zero, 5.0]}, values) == equal
    assert kept({"type": "not-in", "child": ref(field_id), "values": [zero]}, values) == kept(
        op("not-eq", field_id, zero), values
    )


def test_float_literal_is_compared_as_float32() -> None:
    assert kept(op("eq", 5, 0.1), {"f": [0.1, 0.2, None]}) == [True, False, False]


STRINGS = ["é", "z", "\uffff", "\U0001f600", "", None, "abc", "ab"]


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        # UTF-8 byte order: 'é' (C3 A9) sorts after 'z' (7A); U+1F600 (F0..) after U+FFFF (EF..),
        # which UTF-16 code units would order the other way
        (op("gt", 8, "z"), [True, False, True, True, False, False, False, False]),
        (op("lt", 8, "\U0001f600"), [True, True, True, False, True, False, True, True]),
        (op("gt", 8, "\uffff"), [False, False, False, True, False, False, False, False]),
        (op("eq", 8, ""), [False, False, False, False, True, False, False, False]),
        (op("starts-with", 8, "ab"), [False, False, False, False, False, False, True, True]),
        (op("not-starts-with", 8, "ab"), [True, True, True, True, True, True, False, False]),
        (op("starts-with", 8, ""), [True, True, True, True, True, False, True, True]),
        (op("lt-eq", 8, "ab"), [False, False, False, False, True, False, False, True]),
    ],
)
def test_strings_compare_as_unsigned_utf8_bytes(node: Any, expected: list[bool]) -> None:
    assert kept(node, {"s": STRINGS}) == expected


def day(year: int, month: int, day_: int) -> dt.date:
    return dt.date(year, month, day_)


@pytest.mark.parametrize(
    ("column", "values", "node", "expected"),
    [
        ("b", [True, False, None], op("eq", 2, True), [True, False, False]),
        ("b", [True, False, None], op("lt", 2, True), [False, True, False]),
        ("l", [2**40, -(2**40), None], op("gt", 4, 0), [True, False, False]),
        ("dec", [Decimal("1.50"), Decimal("-2.00"), None], op("gt-eq", 7, "1.50"), [True, False, False]),
        ("dec", [Decimal("1.50"), Decimal("-2.00"), None], op("eq", 7, "-2.00"), [False, True, False]),
        ("dt", [day(2024, 1, 1), day(1969, 12, 31), None], op("lt", 9, "1970-01-01"), [False, True, False]),
        ("t", [dt.time(12), dt.time(0, 0, 0, 1), None], op("gt", 10, "00:00:00"), [True, True, False]),
        (
            "ts",
            [dt.datetime(2024, 1, 1, 0, 0, 0, 1), dt.datetime(2023, 12, 31, 23, 59, 59), None],
            op("gt-eq", 11, "2024-01-01T00:00:00.000001"),
            [True, False, False],
        ),
        (
            "tstz",
            [dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2023, 12, 31, 23, tzinfo=UTC), None],
            op("eq", 12, "2024-01-01T00:00:00.000000+00:00"),
            [True, False, False],
        ),
        (
            "ts_ns",
            [1, 0, None],  # nanoseconds since the epoch
            op("gt", 13, "1970-01-01T00:00:00.000000000"),
            [True, False, False],
        ),
        (
            "tstz_ns",
            [-1, None],
            op("eq", 14, "1969-12-31T23:59:59.999999999+00:00"),
            [True, False],
        ),
        (
            "u",
            [uuid.UUID(int=1).bytes, uuid.UUID(int=2**127).bytes, None],
            op("gt", 15, "00000000-0000-0000-0000-000000000001"),
            [False, True, False],  # unsigned byte order: 0x80.. sorts last
        ),
        ("fx", [b"abc", b"\xff\x00\x00", None], op("gt", 16, "616263"), [False, True, False]),
        ("bin", [b"", b"\x80", b"\x01", None], op("gt", 17, "7f"), [False, True, False, False]),
        (
            "bin",
            [b"", b"\x80", None],
            {"type": "in", "child": ref(17), "values": ["", "80"]},
            [True, True, False],
        ),
    ],
)
def test_every_literal_type_compares_with_its_column(
    column: str, values: list[Any], node: Any, expected: list[bool]
) -> None:
    assert kept(node, {column: values}) == expected


def test_nested_struct_field_is_null_when_its_parent_is_null() -> None:
    addrs = [{"city": "Paris", "zip": 1}, None, {"city": None, "zip": 2}, {"city": "Rome", "zip": 3}]
    assert kept(op("eq", 19, "Paris"), {"addr": addrs}) == [True, False, False, False]
    assert kept(op("not-eq", 19, "Paris"), {"addr": addrs}) == [False, True, True, True]
    assert kept({"type": "is-null", "child": ref(19)}, {"addr": addrs}) == [False, True, True, False]
    assert kept({"type": "is-null", "child": ref(18)}, {"addr": addrs}) == [False, True, False, False]


def test_dictionary_encoded_and_sliced_columns() -> None:
    values = pa.array(["US", "DE", None, "US"], pa.large_string()).dictionary_encode()
    batch = pa.RecordBatch.from_arrays([values], names=["s"])
    plan = parse_restrictions(restrictions(op("eq", 8, "US")), ALL_TYPES)
    assert plan.row_filter is not None
    assert evaluate(plan.row_filter, BatchColumns(batch, ALL_TYPES)).to_pylist() == [True, False, False, True]
    sliced = batch_of(ALL_TYPES, {"s": ["x", "US", None, "US"]}).slice(1, 2)
    assert evaluate(plan.row_filter, BatchColumns(sliced, ALL_TYPES)).to_pylist() == [True, False]


def test_a_filter_column_missing_from_the_batch_fails() -> None:
    plan = parse_restrictions(restrictions(op("eq", 8, "US")), ALL_TYPES)
    assert plan.row_filter is not None
    with pytest.raises(RestrictionApplyError, match="field id 8 is not in the data being read"):
        evaluate(plan.row_filter, BatchColumns(batch_of(ALL_TYPES, {"i": [1]}), ALL_TYPES))


def test_a_filter_column_of_an_unexpected_arrow_type_fails() -> None:
    plan = parse_restrictions(restrictions(op("eq", 9, "2024-01-01")), ALL_TYPES)
    assert plan.row_filter is not None
    batch = pa.RecordBatch.from_arrays([pa.array(["2024-01-01"])], names=["dt"])
    with pytest.raises(RestrictionApplyError, match="field id 9"):
        evaluate(plan.row_filter, BatchColumns(batch, ALL_TYPES))


def test_a_float_typed_literal_on_a_double_column_keeps_its_float_value() -> None:
    # data-type float: the literal is float32(0.1) = 0.10000000149011612, promoted to double exactly (as the spec
    # and Java's FloatLiteral.to(DoubleType) do), not the decimal text 0.1 read as a double
    literal = {"type": "literal", "value": 0.1, "data-type": "float"}
    plan = parse_restrictions(restrictions({"type": "gt", "left": ref(6), "right": literal}), ALL_TYPES)
    assert plan.row_filter is not None
    batch = batch_of(ALL_TYPES, {"d": [0.1, 0.1000000001, 0.10000000149011612, 0.2]})
    assert evaluate(plan.row_filter, BatchColumns(batch, ALL_TYPES)).to_pylist() == [False, False, False, True]
