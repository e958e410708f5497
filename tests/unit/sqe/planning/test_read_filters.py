"""The row filter narrowed to a file written before a promotion keeps every row the exact filter keeps.

Each case evaluates both filters as the reader does: the exact one bound to the table's schema over the values
promoted to the table's types, the narrowed one bound to the file's schema over the file's own values (pyiceberg's
bind, then ``expression_to_pyarrow``). The narrowed filter must keep every row the exact one keeps, and with a
literal the file's type holds exactly it must keep no other row.
"""

from __future__ import annotations

import decimal
import random
import struct
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNaN,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    NotEqualTo,
    NotIn,
    NotNaN,
    Or,
)
from pyiceberg.expressions.visitors import bind, translate_column_names
from pyiceberg.io.pyarrow import expression_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import DecimalType, DoubleType, FloatType, IntegerType, LongType, NestedField, StringType

from sqe.planning.read_filters import (
    float32_at_least,
    float32_at_most,
    nan_safe_filter,
    narrowed_fields,
    narrowed_filter,
)

FLOAT32_MAX = 3.4028234663852886e38
NAN = float("nan")


def f32(value: float) -> float:
    result: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return result


def schemas(old: Any, new: Any) -> tuple[Schema, Schema]:
    other = NestedField(2, "s", StringType(), required=False)
    return (
        Schema(NestedField(1, "x", new, required=False), other),
        Schema(NestedField(1, "x", old, required=False), other),
    )


def kept(schema: Schema, expr: BooleanExpression, rows: pa.Table, *, bound: bool = False) -> list[bool]:
    """Which rows the reader keeps: true where pyarrow's filter expression is true."""
    if not bound:
        expr = bind(schema, expr, case_sensitive=True)
    translated = translate_column_names(expr, schema, case_sensitive=True)
    condition = expression_to_pyarrow(bind(schema, translated, case_sensitive=True), schema)
    marked = rows.append_column("_row", pa.array(range(rows.num_rows)))
    survivors = set(marked.filter(condition).column("_row").to_pylist())
    return [i in survivors for i in range(rows.num_rows)]


def check(old: Any, new: Any, expr: BooleanExpression, values: list[Any], arrow_old: Any, arrow_new: Any) -> bool:
    """Asserts the narrowed filter keeps every row the exact one keeps; returns whether it kept exactly those."""
    table_schema, file_schema = schemas(old, new)
    bound = bind(table_schema, expr, case_sensitive=True)
    narrowed = narrowed_filter(bound, narrowed_fields(bound, table_schema, file_schema))
    strings = pa.array(["a"] * len(values))
    in_file = pa.table({"x": pa.array(values, arrow_old), "s": strings})
    promoted = pa.table({"x": in_file.column("x").cast(arrow_new), "s": strings})
    exact = kept(table_schema, bound, promoted, bound=True)
    loose = kept(file_schema, narrowed, in_file, bound=True)
    lost = [values[i] for i in range(len(values)) if exact[i] and not loose[i]]
    assert not lost, (expr, narrowed, lost)
    return exact == loose


FLOATS = [0.1, -0.1, 0.0, -0.0, 1.0, 2.5, 1e-45, -1e-45, 1e-40, 16777217.0, FLOAT32_MAX, -FLOAT32_MAX]


@pytest.mark.parametrize("value", [*FLOATS, 0.30000001192092896, 1 / 3, -2 / 3, 123456.789])
def test_float32_neighbours_of_a_double(value: float) -> None:
    below, above = float32_at_most(value), float32_at_least(value)
    assert f32(below) == below and f32(above) == above
    assert below <= value <= above
    if f32(value) == value:
        assert below == above == value
    else:  # nothing a float holds lies strictly between them
        assert below < value < above
        assert struct.unpack("<I", struct.pack("<f", above))[0] - struct.unpack("<I", struct.pack("<f", below))[0] in (
            1,
            -1,
        ) or (below < 0 < above)


def test_a_float_above_point_one_keeps_point_one_f() -> None:
    """0.1f as a double (0.10000000149...) is above 0.1: pyiceberg's own binding rounds 0.1 to 0.1f and drops it."""
    assert check(FloatType(), DoubleType(), GreaterThan("x", 0.1), [0.1, 0.09, 0.2], pa.float32(), pa.float64())
    _, file_schema = schemas(FloatType(), DoubleType())
    assert kept(file_schema, GreaterThan("x", 0.1), pa.table({"x": pa.array([0.1], pa.float32()), "s": ["a"]})) == [
        False
    ]


def _float_values(rng: random.Random) -> list[float | None]:
    specials = [float("nan"), float("inf"), float("-inf"), None, 0.0, -0.0, 1e-45, -1e-45, FLOAT32_MAX]
    return specials + [f32(rng.uniform(-3, 3)) for _ in range(40)] + [f32(rng.choice(FLOATS)) for _ in range(10)]


def _float_literals(rng: random.Random) -> list[float]:
    return (
        FLOATS
        + [rng.uniform(-3, 3) for _ in range(15)]
        + [f32(rng.uniform(-3, 3)) for _ in range(5)]
        + [1e39, -1e39, 1e300, float("inf"), float("-inf")]  # (pyiceberg makes no NaN literal)
    )


FLOAT_LEAVES = [GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual, EqualTo, NotEqualTo]


def test_float_comparisons_never_lose_a_row_and_are_exact_on_floats() -> None:
    rng = random.Random(7)
    values = _float_values(rng)
    for literal in _float_literals(rng):
        for leaf in FLOAT_LEAVES:
            exact = check(FloatType(), DoubleType(), leaf("x", literal), values, pa.float32(), pa.float64())
            held = abs(literal) <= FLOAT32_MAX and f32(literal) == literal
            if abs(literal) <= FLOAT32_MAX and leaf is not NotEqualTo and (leaf is not EqualTo or held):
                assert exact, (leaf, literal)  # a comparison within float's range keeps exactly the exact rows


def test_float_sets_null_and_nan_checks_and_nesting_never_lose_a_row() -> None:
    rng = random.Random(11)
    values = _float_values(rng)
    near = [0.1, f32(0.1), 0.5, -0.0, 1e39]
    expressions: list[BooleanExpression] = [
        In("x", {0.5, -0.0}),
        In("x", set(near)),
        NotIn("x", {0.5, 2.0}),
        NotIn("x", set(near)),
        IsNaN("x"),
        NotNaN("x"),
        IsNull("x"),
        Or(GreaterThan("x", 0.1), IsNaN("x")),
        Or(NotEqualTo("x", 0.5), Or(IsNull("x"), IsNaN("x"))),
        And(GreaterThan("x", -0.7), LessThan("x", 0.3)),
        Not(LessThan("x", 0.1)),
        Not(And(GreaterThan("x", 0.1), EqualTo("s", "a"))),
        And(Not(EqualTo("s", "b")), GreaterThanOrEqual("x", 1 / 3)),
    ]
    for expr in expressions:
        check(FloatType(), DoubleType(), expr, values, pa.float32(), pa.float64())


def test_int_literals_beyond_int_range_give_up_and_others_stay_exact() -> None:
    values: list[int | None] = [-(2**31), -1, 0, 1, 7, 2**31 - 1, None]
    for literal in [-(2**40), -(2**31) - 1, -(2**31), -1, 0, 5, 2**31 - 1, 2**31, 2**40]:
        for leaf in FLOAT_LEAVES:
            exact = check(IntegerType(), LongType(), leaf("x", literal), values, pa.int32(), pa.int64())
            if -(2**31) <= literal <= 2**31 - 1:
                assert exact, (leaf, literal)
        check(IntegerType(), LongType(), In("x", {literal, 7}), values, pa.int32(), pa.int64())
        check(IntegerType(), LongType(), NotIn("x", {literal, 7}), values, pa.int32(), pa.int64())


def test_decimal_literals_with_more_digits_give_up_and_others_stay_exact() -> None:
    values = [decimal.Decimal(v) for v in ("-999.99", "-1.50", "0.00", "1.25", "999.99")] + [None]
    for text in ("-1000.00", "-999.99", "0.00", "1.25", "1.26", "999.99", "1000.00", "1234567.89"):
        literal = decimal.Decimal(text)
        for leaf in FLOAT_LEAVES:
            old, new = DecimalType(5, 2), DecimalType(9, 2)
            exact = check(old, new, leaf("x", literal), values, pa.decimal128(5, 2), pa.decimal128(9, 2))
            if abs(literal) < 1000:
                assert exact, (leaf, literal)


def test_the_shapes_given_up() -> None:
    table_schema, file_schema = schemas(FloatType(), DoubleType())

    def narrowed(expr: BooleanExpression) -> BooleanExpression:
        bound = bind(table_schema, expr, case_sensitive=True)
        return narrowed_filter(bound, narrowed_fields(bound, table_schema, file_schema))

    assert narrowed(Not(LessThan("x", 0.5))) == AlwaysTrue()  # a NOT over a narrowed leaf
    assert narrowed(IsNaN("x")) == bind(table_schema, IsNaN("x"), case_sensitive=True)  # the same in every type
    assert narrowed(NotEqualTo("x", 0.5)) == bind(table_schema, NotEqualTo("x", 0.5), case_sensitive=True)
    assert narrowed(NotEqualTo("x", 0.1)) == AlwaysTrue()
    assert narrowed(GreaterThan("x", 1e39)) == AlwaysTrue()  # beyond float's range
    assert narrowed(EqualTo("x", 0.1)) == AlwaysTrue()  # a float holds no 0.1
    kept_as_is = bind(table_schema, Not(EqualTo("s", "b")), case_sensitive=True)
    assert narrowed(Not(EqualTo("s", "b"))) == kept_as_is  # no narrowed column below it
    same_schema = bind(table_schema, GreaterThan("x", 0.1), case_sensitive=True)
    assert narrowed_filter(same_schema, narrowed_fields(same_schema, table_schema, table_schema)) is same_schema


def test_nan_safe_filters_drop_what_is_true_on_nan_over_float_columns_only() -> None:
    """pyarrow prunes a row group by a min and max that leave NaN out (a group of 20.5 and NaN is skipped for
    ``is_nan(x)``), so a file is read without the parts of its filter that are true on NaN."""
    schema = Schema(
        NestedField(1, "x", DoubleType(), required=False),
        NestedField(2, "f", FloatType(), required=False),
        NestedField(3, "s", StringType(), required=False),
    )

    def safe(expr: BooleanExpression) -> BooleanExpression:
        return nan_safe_filter(bind(schema, expr, case_sensitive=True))

    def same(expr: BooleanExpression) -> bool:
        bound = bind(schema, expr, case_sensitive=True)
        return nan_safe_filter(bound) == bound

    assert safe(IsNaN("x")) == AlwaysTrue()
    assert safe(IsNaN("f")) == AlwaysTrue()
    assert safe(Or(NotEqualTo("x", 20.5), Or(IsNull("x"), IsNaN("x")))) == AlwaysTrue()
    assert safe(NotIn("f", {0.5, 1.5})) == AlwaysTrue()
    assert safe(Not(LessThan("x", 0.5))) == AlwaysTrue()  # NaN: x < 0.5 is false, so NOT of it is true
    assert safe(And(IsNaN("x"), EqualTo("s", "a"))) == bind(schema, EqualTo("s", "a"), case_sensitive=True)
    for kept_as_is in (
        GreaterThan("x", 0.5),
        And(LessThanOrEqual("f", 1.5), NotNaN("x")),
        In("x", {0.5}),
        IsNull("x"),
        NotEqualTo("s", "a"),
        Not(EqualTo("s", "b")),
    ):
        assert same(kept_as_is), kept_as_is


def test_nan_safe_filters_keep_every_nan_row_in_a_real_parquet_file(tmp_path: Any) -> None:
    """The filters through pyarrow's scanner on a real file whose second row group (20.5 and NaN) has statistics
    [20.5, 20.5]: read with the safe filter, then filtered exactly, every row the exact filter keeps is there."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    schema = Schema(NestedField(1, "x", DoubleType(), required=False))
    table = pa.table({"x": pa.array([1.0, 2.0, 20.5, NAN], pa.float64())})
    path = str(tmp_path / "nan.parquet")
    pq.write_table(table, path, row_group_size=2)
    fragment = next(iter(ds.dataset(path).get_fragments()))
    for expr in (IsNaN("x"), Or(NotEqualTo("x", 20.5), Or(IsNull("x"), IsNaN("x"))), Not(LessThan("x", 30.0))):
        bound = bind(schema, expr, case_sensitive=True)
        exact = expression_to_pyarrow(bound, schema)
        expected = table.filter(exact).num_rows  # row by row, no statistics
        safe = nan_safe_filter(bound)
        pushed = None if isinstance(safe, AlwaysTrue) else expression_to_pyarrow(safe, schema)
        read = ds.Scanner.from_fragment(fragment, filter=pushed).to_table()
        assert expected >= 1 and read.filter(exact).num_rows == expected, expr


def test_a_set_test_on_a_float_column_is_not_pushed_for_arrow_tells_minus_zero_from_zero(tmp_path: Any) -> None:
    """Arrow's is_in compares bits: ``-0.0`` is not in ``(0.0, 5.0)``, and a row group of zeros, whose statistics
    are [-0.0, 0.0], was pruned for ``x IN (0.0, 5.0)`` though every row of it equals 0.0. A file is read without a
    set test on a float or double column (on other columns it stays)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    schema = Schema(
        NestedField(1, "x", DoubleType(), required=False),
        NestedField(2, "f", FloatType(), required=False),
        NestedField(3, "n", LongType(), required=False),
    )
    zeros = [0.0, 0.0, -0.0, 1.0]
    table = pa.table({"x": pa.array(zeros, pa.float64()), "f": pa.array(zeros, pa.float32()), "n": [0, 0, 0, 1]})
    path = str(tmp_path / "zeros.parquet")
    pq.write_table(table, path, row_group_size=1)
    fragment = next(iter(ds.dataset(path).get_fragments()))
    for column in ("x", "f"):
        bound = bind(schema, In(column, {0.0, 5.0}), case_sensitive=True)
        safe = nan_safe_filter(bound)
        pushed = None if isinstance(safe, AlwaysTrue) else expression_to_pyarrow(safe, schema)
        read = ds.Scanner.from_fragment(fragment, filter=pushed).to_table()
        # IEEE equality, as the exact filter compares: all three zeros are in the set
        assert read.filter(pc.equal(read[column], 0.0)).num_rows == 3, column
    on_longs = bind(schema, In("n", {0, 5}), case_sensitive=True)
    assert nan_safe_filter(on_longs) == on_longs
    assert nan_safe_filter(bind(schema, And(In("x", {0.0, 5.0}), In("n", {0, 5})), case_sensitive=True)) == on_longs
