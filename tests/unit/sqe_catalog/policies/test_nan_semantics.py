"""NaN in float/double columns through the catalog's lowering and the engine's evaluator.

The expressions spec says NaN follows the same rules as null, and both the canonical form and ``if``/``else``
lowering rely on ``negate`` being the exact complement. These tests evaluate the served wire form with the
engine itself (``parse_restrictions`` + ``apply``), so a NaN row hidden by the catalog's rewriting shows up as a
missing row.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, FloatType, LongType, NestedField, StringType

from sqe.restrictions import parse_restrictions
from sqe.restrictions.plan import apply
from sqe_catalog.policies import rego
from sqe_catalog.policies.bind import Subject, bind_column
from sqe_catalog.policies.lower import canonical, from_predicate, lower_filter, to_wire

SCHEMA = Schema(
    NestedField(1, "score", DoubleType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "weight", FloatType(), required=True),
)
SCORES = [1.0, 9.0, math.nan, None, 5.0]
WEIGHTS = [1.0, 9.0, math.nan, 2.0, 5.0]
BATCH = pa.record_batch(
    [pa.array(SCORES, pa.float64()), pa.array(["US"] * 5), pa.array(WEIGHTS, pa.float32())],
    schema=pa.schema(
        [
            pa.field("score", pa.float64(), metadata={b"PARQUET:field_id": b"1"}),
            pa.field("region", pa.string(), metadata={b"PARQUET:field_id": b"2"}),
            pa.field("weight", pa.float32(), nullable=False, metadata={b"PARQUET:field_id": b"3"}),
        ]
    ),
)
SUBJECT = Subject("alice", frozenset(), frozenset())


def _kept(wire: Any) -> list[int]:
    """Row positions (of BATCH) the engine keeps under ``wire`` as the required row filter."""
    plan = parse_restrictions({"required-row-filter": wire}, SCHEMA)
    numbered = BATCH.append_column("pos", pa.array(range(BATCH.num_rows)))
    schema = Schema(*SCHEMA.fields, NestedField(4, "pos", LongType()))
    numbered = numbered.set_column(
        3, pa.field("pos", pa.int64(), metadata={b"PARQUET:field_id": b"4"}), numbered.column(3)
    )
    out = apply(numbered, plan, salt=b"s" * 16, schema=schema)
    return out.column("pos").to_pylist()


def _lowered(source: str) -> Any:
    rule = rego.parse(source, "filter")
    return to_wire(lower_filter(rule, SUBJECT, lambda name: bind_column(SCHEMA, name)).node)


@pytest.mark.parametrize("op", ["lt", "lt-eq", "gt", "gt-eq"])
@pytest.mark.parametrize("field_id", [1, 3])
def test_canonicalizing_a_negated_comparison_keeps_the_nan_rows(op: str, field_id: int) -> None:
    raw = {"type": "not", "child": {"type": op, "left": {"type": "reference", "id": field_id}, "right": 5.0}}
    plan = parse_restrictions({"required-row-filter": raw}, SCHEMA)
    assert plan.row_filter is not None
    served = to_wire(canonical(from_predicate(plan.row_filter, lambda fid: fid != 3)))
    assert _kept(served) == _kept(raw)  # the raw filter keeps the NaN row (not lt(NaN) is true)


def test_a_nan_row_takes_the_else_branch_of_a_conditional_filter() -> None:
    # score > 5.0 is false for NaN under every reading, so the first-match chain gives the fallback (true)
    wire = _lowered('filter := col("region") == "EU" if col("score") > 5.0 else := true')
    assert 2 in _kept(wire)
    wire = _lowered('filter := col("region") == "EU" if col("weight") > 5.0 else := true')
    assert 2 in _kept(wire)


@pytest.mark.parametrize(("positive", "negated"), [("<", ">="), ("<=", ">"), (">", "<="), (">=", "<")])
@pytest.mark.parametrize("column", ["score", "weight"])
def test_not_of_a_comparison_is_its_complement_for_nan_too(positive: str, negated: str, column: str) -> None:
    kept = _kept(_lowered(f'filter := col("{column}") {positive} 5.0'))
    complement = _kept(_lowered(f'filter := not (col("{column}") {positive} 5.0)'))
    assert sorted(kept + complement) == list(range(BATCH.num_rows))  # every row in exactly one of them
    assert complement == _kept(_lowered(f'filter := col("{column}") {negated} 5.0'))
