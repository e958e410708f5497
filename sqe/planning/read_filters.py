"""What data files are read with: the scan's row filter, weakened (never strengthened) where pyarrow would get it wrong.

Only these filters go to the Parquet reader; the read-restrictions' exact filter and the user's WHERE (DuckDB)
run on the rows after, so a weaker filter costs only pruning.

Iceberg promotes int to long, float to double and decimal(P, S) to decimal(P', S) (P' > P). A file written
before the promotion holds the narrower type, and Iceberg's rule (the Java reader) compares the promoted value
with the table's literal: ``x > 0.1`` keeps a float ``x`` of ``0.1f``, which is above ``0.1`` as a double.
pyiceberg's reader binds the filter to the file's own types instead and rounds the literal to them (``0.1`` to
``0.1f``: the row is dropped), so such a file is read with :func:`narrowed_filter`'s filter and then filtered
exactly in the table's types (``sqe.execution.local``).

The narrowed filter is never stronger than the exact one, so the exact filter after it still decides every
row; it only lets the Parquet reader skip row groups (by their statistics) and rows. Each comparison on a
narrowed column gets a literal the file's type holds exactly:

- float: for a ``c`` no float holds, ``x > c`` and ``x >= c`` become ``x >= above(c)``, the smallest float above
  ``c``, and ``x < c`` and ``x <= c`` become ``x <= below(c)``, the largest float below it. No float lies
  between ``c`` and either, so a float ``f`` is above ``c`` exactly when it is at least ``above(c)``: the
  comparison keeps the same rows (false on null and NaN in both).
- int and decimal: a literal the narrower type holds is kept as it is (the comparison is the same in both
  types); one it does not hold (beyond int's range, more digits than P) gives up the leaf.
- ``=``, ``<>``, ``IN`` and ``NOT IN``: kept when the narrower type holds every literal exactly, else given up.

A leaf given up becomes AlwaysTrue, which only weakens the filter as long as no NOT is above it: a NOT over a
narrowed leaf gives up its whole subtree. Null and NaN checks do not depend on the type and stay. Any other pair
of types (one this module does not know) gives up the leaf too.

:func:`nan_safe_filter` weakens every scan's filter the same way for flaws of pyarrow's row-group pruning with
NaN and with -0.0 (see there); the planner applies it to what files are read with
(``sqe.planning.planner.build_read_spec``).
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal
from typing import TYPE_CHECKING

from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    BoundGreaterThan,
    BoundGreaterThanOrEqual,
    BoundIn,
    BoundIsNaN,
    BoundLessThan,
    BoundLessThanOrEqual,
    BoundLiteralPredicate,
    BoundNotEqualTo,
    BoundNotIn,
    BoundPredicate,
    BoundSetPredicate,
    BoundUnaryPredicate,
    Not,
    Or,
)
from pyiceberg.expressions.literals import DoubleLiteral
from pyiceberg.expressions.visitors import extract_field_ids
from pyiceberg.types import DecimalType, DoubleType, FloatType, IntegerType, LongType

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyiceberg.expressions.literals import Literal
    from pyiceberg.schema import Schema
    from pyiceberg.types import IcebergType

__all__ = ["nan_safe_filter", "narrowed_fields", "narrowed_filter", "nearest_float32"]

_FLOAT32_MAX = 3.4028234663852886e38
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_ALWAYS_TRUE: BooleanExpression = AlwaysTrue()
_LOWER_BOUNDS = (BoundGreaterThan, BoundGreaterThanOrEqual)
_UPPER_BOUNDS = (BoundLessThan, BoundLessThanOrEqual)
# Leaves pyarrow gets wrong on a float or double column (see nan_safe_filter): those true on a NaN value, and IN.
_WRONG_ON_FLOATS = (BoundIsNaN, BoundNotEqualTo, BoundNotIn, BoundIn)


def narrowed_fields(
    bound_filter: BooleanExpression, table_schema: Schema, file_schema: Schema
) -> dict[int, IcebergType]:
    """The fields the filter reads that the file holds in another type than the table: field id -> file type."""
    narrowed: dict[int, IcebergType] = {}
    for field_id in extract_field_ids(bound_filter):
        if field_id in file_schema.field_ids:
            in_file = file_schema.find_type(field_id)
            if in_file != table_schema.find_type(field_id):
                narrowed[field_id] = in_file
    return narrowed


def narrowed_filter(bound_filter: BooleanExpression, narrowed: dict[int, IcebergType]) -> BooleanExpression:
    """``bound_filter`` (bound to the table's schema) with every leaf on a ``narrowed`` field rewritten to hold a
    literal of the file's type exactly, or given up; never stronger than ``bound_filter``."""
    if not narrowed:
        return bound_filter
    return _weakened(bound_filter, set(narrowed), lambda leaf: _narrow_leaf(leaf, narrowed[_field_id(leaf)]))


def nan_safe_filter(bound_filter: BooleanExpression) -> BooleanExpression:
    """``bound_filter`` without the leaves on float and double columns that are true on NaN (``is_nan``, ``<>``,
    ``NOT IN``, and a NOT above any leaf on such a column) and without their ``IN``; never stronger than
    ``bound_filter``.

    pyarrow (26) prunes a row group by its statistics, whose min and max leave NaN out, as if the group held no
    NaN: a group of 20.5 and NaN is skipped for ``is_nan(x)`` and for ``x <> 20.5 OR is_nan(x)``, and its NaN
    row, which the filter keeps, is lost. Comparisons are false on NaN, so pruning them is right. Arrow's
    ``is_in`` compares bits, so ``-0.0`` is not in ``(0.0)``, and a group of zeros (statistics [-0.0, 0.0]) is
    skipped for ``x IN (0.0, 5.0)``; ``=`` compares as IEEE does and stays."""
    floating = _floating_ids(bound_filter)
    if not floating:
        return bound_filter
    return _weakened(bound_filter, floating, lambda leaf: _ALWAYS_TRUE if isinstance(leaf, _WRONG_ON_FLOATS) else leaf)


def _floating_ids(expr: BooleanExpression) -> set[int]:
    """The field ids of the float and double columns the bound filter's leaves read."""
    if isinstance(expr, And | Or):
        return _floating_ids(expr.left) | _floating_ids(expr.right)
    if isinstance(expr, Not):
        return _floating_ids(expr.child)
    if isinstance(expr, BoundPredicate) and isinstance(expr.term.ref().field.field_type, FloatType | DoubleType):
        return {_field_id(expr)}
    return set()


def _field_id(leaf: BoundPredicate) -> int:
    return leaf.term.ref().field.field_id


def _weakened(
    expr: BooleanExpression, touched: set[int], rewrite: Callable[[BoundPredicate], BooleanExpression]
) -> BooleanExpression:
    """``expr`` with each leaf on a ``touched`` field replaced by ``rewrite(leaf)``, which must be no stronger."""
    if isinstance(expr, And):
        return _and(_weakened(expr.left, touched, rewrite), _weakened(expr.right, touched, rewrite))
    if isinstance(expr, Or):
        return _or(_weakened(expr.left, touched, rewrite), _weakened(expr.right, touched, rewrite))
    if isinstance(expr, Not):
        # Weakening below a NOT would strengthen the whole: only a subtree without touched leaves stays.
        return expr if not _reads(expr.child, touched) else _ALWAYS_TRUE
    if isinstance(expr, BoundPredicate):
        return rewrite(expr) if _field_id(expr) in touched else expr
    if isinstance(expr, AlwaysTrue | AlwaysFalse):
        return expr
    return _ALWAYS_TRUE  # an expression kind not known here: pruning with less is safe


def _reads(expr: BooleanExpression, touched: set[int]) -> bool:
    if isinstance(expr, And | Or):
        return _reads(expr.left, touched) or _reads(expr.right, touched)
    if isinstance(expr, Not):
        return _reads(expr.child, touched)
    if isinstance(expr, BoundPredicate):
        return _field_id(expr) in touched
    return not isinstance(expr, AlwaysTrue | AlwaysFalse)  # unknown: treated as reading one


def _and(left: BooleanExpression, right: BooleanExpression) -> BooleanExpression:
    if isinstance(left, AlwaysTrue):
        return right
    return left if isinstance(right, AlwaysTrue) else And(left, right)


def _or(left: BooleanExpression, right: BooleanExpression) -> BooleanExpression:
    return _ALWAYS_TRUE if isinstance(left, AlwaysTrue) or isinstance(right, AlwaysTrue) else Or(left, right)


def _narrow_leaf(leaf: BoundPredicate, file_type: IcebergType) -> BooleanExpression:
    if isinstance(leaf, BoundUnaryPredicate):
        return leaf  # null and NaN checks: the same in every type
    table_type = leaf.term.ref().field.field_type
    holds = _holder(file_type, table_type)
    if holds is None:
        return _ALWAYS_TRUE
    if isinstance(leaf, BoundSetPredicate):  # IN and NOT IN: kept when the file's type holds every value
        return leaf if all(holds(lit.value) for lit in leaf.literals) else _ALWAYS_TRUE
    if not isinstance(leaf, BoundLiteralPredicate):
        return _ALWAYS_TRUE
    value = leaf.literal.value
    if holds(value):
        return leaf
    if isinstance(file_type, FloatType) and isinstance(leaf, (*_LOWER_BOUNDS, *_UPPER_BOUNDS)):
        return _float_bound(leaf, value)
    return _ALWAYS_TRUE


def _holder(file_type: IcebergType, table_type: IcebergType) -> Callable[[object], bool] | None:
    """Whether the file's type holds a value of the table's type exactly, for the promotions Iceberg allows."""
    if isinstance(file_type, IntegerType) and isinstance(table_type, LongType):
        return _holds_int
    if isinstance(file_type, FloatType) and isinstance(table_type, DoubleType):
        return _holds_float
    if (
        isinstance(file_type, DecimalType)
        and isinstance(table_type, DecimalType)
        and file_type.scale == table_type.scale
        and file_type.precision < table_type.precision
    ):
        precision = file_type.precision
        return lambda value: _holds_decimal(value, precision)
    return None


def _holds_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and _INT32_MIN <= value <= _INT32_MAX


def _holds_float(value: object) -> bool:
    return isinstance(value, float) and _within_float(value) and nearest_float32(value) == value


def _within_float(value: float) -> bool:
    """Finite and within float's range (beyond it, packing it as a float raises)."""
    return math.isfinite(value) and abs(value) <= _FLOAT32_MAX


def _holds_decimal(value: object, precision: int) -> bool:
    return isinstance(value, Decimal) and value.is_finite() and len(value.as_tuple().digits) <= precision


def _float_bound(leaf: BoundLiteralPredicate, value: object) -> BooleanExpression:
    """``x > c``/``x >= c`` as ``x >= above(c)``; ``x < c``/``x <= c`` as ``x <= below(c)``, for a ``c`` no float
    holds (with one it holds, the leaf stays as it is)."""
    if not isinstance(value, float) or not _within_float(value):
        return _ALWAYS_TRUE  # beyond float's finite range (or NaN): pyiceberg would bind it to a sentinel
    term = leaf.term
    if isinstance(leaf, _LOWER_BOUNDS):
        return BoundGreaterThanOrEqual(term=term, literal=_double(float32_at_least(value)))
    return BoundLessThanOrEqual(term=term, literal=_double(float32_at_most(value)))


def _double(value: float) -> Literal[float]:
    """A literal of the table's type holding a float's value: pyiceberg converts it to the file's without loss."""
    return DoubleLiteral(value)


def nearest_float32(value: float) -> float:
    """``value`` rounded to the nearest float (32 bits); ``value`` must be within float's finite range."""
    result: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return result


def float32_at_most(value: float) -> float:
    """The largest float (32 bits) that is at most ``value`` (finite, within float's range)."""
    rounded = nearest_float32(value)
    return rounded if rounded <= value else _float32_step_down(rounded)


def float32_at_least(value: float) -> float:
    """The smallest float (32 bits) that is at least ``value`` (finite, within float's range)."""
    rounded = nearest_float32(value)
    return rounded if rounded >= value else -_float32_step_down(-rounded)


def _float32_step_down(value: float) -> float:
    """The float (32 bits) just below ``value``, a finite float above float's lowest."""
    if value == 0:
        smallest: float = struct.unpack("<f", struct.pack("<I", 1))[0]
        return -smallest  # the smallest negative subnormal
    bits: int = struct.unpack("<I", struct.pack("<f", value))[0]
    bits = bits - 1 if value > 0 else bits + 1  # sign and magnitude: a negative one's magnitude grows
    result: float = struct.unpack("<f", struct.pack("<I", bits))[0]
    return result
