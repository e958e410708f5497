"""The row filter as direct compute calls: for every expression it compiles, exactly the rows (and the order) that
``Table.filter(expression_to_pyarrow(...))`` keeps; everything else is left to Acero (None)."""

from __future__ import annotations

import datetime
import math
import random
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.expressions import (
    AlwaysFalse,
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
    NotNull,
    NotStartsWith,
    Or,
    StartsWith,
)
from pyiceberg.expressions.visitors import bind
from pyiceberg.io.pyarrow import expression_to_pyarrow, schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
)

from sqe.execution.row_filter import compile_row_filter, filter_rows

SCHEMA = Schema(
    NestedField(1, "i", LongType(), required=False),
    NestedField(2, "n", IntegerType(), required=False),
    NestedField(3, "d", DoubleType(), required=False),
    NestedField(4, "f", FloatType(), required=False),
    NestedField(5, "s", StringType(), required=False),
    NestedField(6, "b", BooleanType(), required=False),
    NestedField(7, "dt", DateType(), required=False),
    NestedField(8, "ts", TimestampType(), required=False),
    NestedField(9, "dec", DecimalType(9, 2), required=False),
)
ROWS = 600
STRINGS = ["", "a", "ab", "abc", "b", "ß", "ßa", "日本", "日", "a%", "Ab", "zz"]
DOUBLES = [0.0, -0.0, 1.5, -1.5, 2.0, 1e300, -1e300, math.inf, -math.inf, math.nan, 3.25]


def _cents(value: int) -> Decimal:
    return (Decimal(value) / 100).quantize(Decimal("0.01"))


def _values(rng: random.Random) -> dict[str, list[Any]]:
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.15 else value

    day = datetime.date(2020, 1, 1)
    return {
        "i": [maybe(rng.randint(-5, 5)) for _ in range(ROWS)],
        "n": [maybe(rng.randint(-3, 3)) for _ in range(ROWS)],
        "d": [maybe(rng.choice(DOUBLES)) for _ in range(ROWS)],
        "f": [maybe(rng.choice(DOUBLES)) for _ in range(ROWS)],
        "s": [maybe(rng.choice(STRINGS)) for _ in range(ROWS)],
        "b": [maybe(rng.random() < 0.5) for _ in range(ROWS)],
        "dt": [maybe(day + datetime.timedelta(days=rng.randint(0, 4))) for _ in range(ROWS)],
        "ts": [maybe(datetime.datetime(2020, 1, 1) + datetime.timedelta(hours=rng.randint(0, 4))) for _ in range(ROWS)],
        "dec": [maybe(_cents(rng.randint(-300, 300))) for _ in range(ROWS)],
    }


def _table(rng: random.Random, string_type: pa.DataType | None = None) -> pa.Table:
    """The file's columns as Parquet decodes them (strings as ``string``, the converter's literals are
    ``large_string``: the compute functions cast as Acero does)."""
    arrow = schema_to_pyarrow(SCHEMA, include_field_ids=False)
    fields = [pa.field(f.name, string_type or pa.string()) if f.name == "s" else f for f in arrow]
    fields.append(pa.field("row", pa.int64()))  # which row each kept one is (no filter reads it)
    values = {**_values(rng), "row": list(range(ROWS))}
    return pa.table({f.name: pa.array(values[f.name], f.type) for f in fields}, schema=pa.schema(fields))


def _literal(rng: random.Random, name: str) -> Any:
    day = datetime.date(2020, 1, 1)
    return {
        "i": lambda: rng.randint(-6, 6),
        "n": lambda: rng.randint(-4, 4),
        "d": lambda: rng.choice([0.0, -0.0, 1.5, 2.0, -1.5, 1e300, 3.0]),
        "f": lambda: rng.choice([0.0, 1.5, 2.0, -1.5, 3.0]),
        "s": lambda: rng.choice(STRINGS),
        "b": lambda: rng.random() < 0.5,
        "dt": lambda: (day + datetime.timedelta(days=rng.randint(0, 5))).isoformat(),
        "ts": lambda: (datetime.datetime(2020, 1, 1) + datetime.timedelta(hours=rng.randint(0, 5))).isoformat(),
        "dec": lambda: str(_cents(rng.randint(-300, 300))),
    }[name]()


def _predicate(rng: random.Random) -> BooleanExpression:
    name = rng.choice(["i", "n", "d", "f", "s", "b", "dt", "ts", "dec"])
    kinds: list[str] = ["eq", "ne", "lt", "le", "gt", "ge", "in", "notin", "null", "notnull"]
    if name in ("d", "f"):
        kinds += ["nan", "notnan"]
    if name == "s":
        kinds += ["starts", "notstarts"]
    if name == "b":
        kinds = ["eq", "ne", "null", "notnull", "in"]
    kind = rng.choice(kinds)
    if kind in ("in", "notin"):
        values = {_literal(rng, name) for _ in range(rng.randint(1, 4))}
        return In(name, values) if kind == "in" else NotIn(name, values)
    unary = {"null": IsNull, "notnull": NotNull, "nan": IsNaN, "notnan": NotNaN}
    if kind in unary:
        return unary[kind](name)
    binary = {
        "eq": EqualTo,
        "ne": NotEqualTo,
        "lt": LessThan,
        "le": LessThanOrEqual,
        "gt": GreaterThan,
        "ge": GreaterThanOrEqual,
        "starts": StartsWith,
        "notstarts": NotStartsWith,
    }
    return binary[kind](name, _literal(rng, name))


def _expression(rng: random.Random, depth: int = 0) -> BooleanExpression:
    roll = rng.random()
    if depth >= 4 or roll < 0.4:
        return _predicate(rng) if rng.random() > 0.04 else rng.choice([AlwaysTrue(), AlwaysFalse()])
    if roll < 0.55:
        return Not(_expression(rng, depth + 1))
    left, right = _expression(rng, depth + 1), _expression(rng, depth + 1)
    return And(left, right) if roll < 0.8 else Or(left, right)


def _acero(table: pa.Table, bound: BooleanExpression) -> pa.Table:
    return table.filter(expression_to_pyarrow(bound, SCHEMA))


def _same_rows(ours: pa.Table, acero: pa.Table) -> bool:
    """The same rows in the same order, told by their row numbers (a NaN never equals itself in ``equals``)."""
    return ours.schema == acero.schema and ours.column("row").to_pylist() == acero.column("row").to_pylist()


@pytest.mark.parametrize("seed", range(4))
def test_random_filters_keep_exactly_the_rows_acero_keeps(seed: int) -> None:
    rng = random.Random(seed)
    table = _table(rng)
    compiled = 0
    for _ in range(150):
        bound = bind(SCHEMA, _expression(rng), case_sensitive=True)
        mask = compile_row_filter(bound, SCHEMA, table.schema)
        assert mask is not None, bound  # every kind generated here compiles
        compiled += 1
        ours = filter_rows(table, mask)
        assert _same_rows(ours, _acero(table, bound)), bound
    assert compiled == 150


def test_chunked_columns_and_large_strings_filter_alike() -> None:
    rng = random.Random(7)
    table = _table(rng, pa.large_string())
    table = pa.concat_tables([table.slice(0, 100), table.slice(100, 250), table.slice(350)])  # several chunks
    for _ in range(60):
        bound = bind(SCHEMA, _expression(rng), case_sensitive=True)
        mask = compile_row_filter(bound, SCHEMA, table.schema)
        assert mask is not None
        assert _same_rows(filter_rows(table, mask), _acero(table, bound)), bound


def test_a_constant_filter_keeps_every_row_or_none() -> None:
    table = _table(random.Random(1))
    for expression, rows in ((AlwaysTrue(), ROWS), (AlwaysFalse(), 0)):
        mask = compile_row_filter(bind(SCHEMA, expression, case_sensitive=True), SCHEMA, table.schema)
        assert mask is not None
        kept = filter_rows(table, mask)
        assert kept.num_rows == rows and kept.schema == table.schema


def test_what_acero_must_evaluate_is_not_compiled() -> None:
    nested = Schema(
        NestedField(1, "i", LongType(), required=False),
        NestedField(2, "st", StructType(NestedField(3, "x", LongType(), required=False)), required=False),
    )
    nested_arrow = schema_to_pyarrow(nested, include_field_ids=False)
    bound = bind(nested, EqualTo("st.x", 1), case_sensitive=True)
    assert compile_row_filter(bound, nested, nested_arrow) is None  # a nested column: a tuple path for Acero

    dictionary = pa.schema([pa.field("s", pa.dictionary(pa.int32(), pa.string()))])
    strings = Schema(NestedField(5, "s", StringType(), required=False))
    assert compile_row_filter(bind(strings, EqualTo("s", "a"), case_sensitive=True), strings, dictionary) is None

    # A file whose column does not have the type its schema says: the compute functions refuse it, so Acero
    # evaluates it and raises its own error for it, exactly as before.
    wrong = pa.schema([pa.field("i", pa.binary())])
    longs = Schema(NestedField(1, "i", LongType(), required=False))
    assert compile_row_filter(bind(longs, LessThan("i", 3), case_sensitive=True), longs, wrong) is None
