"""Vectorised evaluation of the row filter on raw Arrow values, with the expressions spec's two-valued logic.

Every leaf yields a boolean array without nulls: a comparison, ``in`` or ``starts-with`` on a null (or NaN)
value is false, and the ``not-*`` forms are exact negations of their positive forms, so ``not-eq`` and
``not-in`` are true for null. Strings and binaries compare as unsigned bytes (Arrow compares UTF-8 byte-wise,
which is the spec's order). Temporal values compare as integers in the column's Iceberg unit.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from sqe.errors import RestrictionApplyError
from sqe.restrictions import expressions as ex
from sqe.restrictions.columns import BatchColumns
from sqe.restrictions.literals import TEMPORAL_NANOS, TIMESTAMP_TYPES

_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")
_COMPARE: dict[str, Callable[..., pa.Array]] = {
    "eq": pc.equal,
    "lt": pc.less,
    "lt-eq": pc.less_equal,
    "gt": pc.greater,
    "gt-eq": pc.greater_equal,
}


def evaluate(predicate: ex.Predicate, columns: BatchColumns) -> pa.BooleanArray:
    """A null-free mask of the rows the filter keeps."""
    return _Evaluator(columns).run(predicate)


class _Evaluator:
    def __init__(self, columns: BatchColumns) -> None:
        self._columns = columns
        self._cache: dict[ex.FieldRef, pa.Array] = {}

    def run(self, predicate: ex.Predicate) -> pa.BooleanArray:
        if isinstance(predicate, ex.And):
            return pc.and_(self.run(predicate.left), self.run(predicate.right))
        if isinstance(predicate, ex.Or):
            return pc.or_(self.run(predicate.left), self.run(predicate.right))
        if isinstance(predicate, ex.Not):
            return pc.invert(self.run(predicate.child))
        try:
            return self._leaf(predicate)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError, ValueError):
            ref = predicate.ref
            raise RestrictionApplyError(
                f"row filter on field id {ref.field_id} ({ref.type_name}) cannot be evaluated on this column"
            ) from None

    def _leaf(self, leaf: ex.Comparison | ex.SetMembership | ex.StartsWith | ex.NullCheck) -> pa.BooleanArray:
        values = self._values(leaf.ref)
        if isinstance(leaf, ex.NullCheck):
            return _null_check(leaf.op, values)
        if isinstance(leaf, ex.StartsWith):
            matched = _false_if_null(pc.starts_with(values, pattern=leaf.prefix))
            return pc.invert(matched) if leaf.negated else matched
        if isinstance(leaf, ex.SetMembership):
            value_set = pa.array(leaf.values, type=values.type)
            if pa.types.is_floating(values.type):
                # is_in hashes bits, so -0.0 would not be 0.0 as it is for eq; adding +0.0 turns -0.0 into 0.0
                values, value_set = _zero_signless(values), _zero_signless(value_set)
            matched = _false_if_null(pc.is_in(values, value_set=value_set, skip_nulls=True))
            return pc.invert(matched) if leaf.negated else matched
        literal = pa.scalar(leaf.value, type=values.type)
        if leaf.op == "not-eq":
            return pc.invert(_false_if_null(pc.equal(values, literal)))
        return _false_if_null(_COMPARE[leaf.op](values, literal))

    def _values(self, ref: ex.FieldRef) -> pa.Array:
        cached = self._cache.get(ref)
        if cached is None:
            raw = self._columns.resolve(ref.path)
            if raw is None:
                raise RestrictionApplyError(f"row filter column field id {ref.field_id} is not in the data being read")
            cached = self._cache[ref] = _comparable(raw, ref)
        return cached


def _null_check(op: str, values: pa.Array) -> pa.BooleanArray:
    if op in ("is-null", "not-null"):
        nulls = pc.is_null(values, nan_is_null=False)
        return nulls if op == "is-null" else pc.invert(nulls)
    nans = _false_if_null(pc.is_nan(values))
    return nans if op == "is-nan" else pc.invert(nans)


def _zero_signless(values: pa.Array) -> pa.Array:
    return pc.add(values, pa.scalar(0.0, type=values.type))


def _false_if_null(mask: pa.Array) -> pa.BooleanArray:
    return mask if mask.null_count == 0 else pc.fill_null(mask, False)


def _comparable(array: pa.Array, ref: ex.FieldRef) -> pa.Array:
    """Plain storage of the column; temporal types as integers in the Iceberg unit of the field."""
    if isinstance(array, pa.DictionaryArray):
        array = array.dictionary_decode()
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    kind = ref.type_name
    if kind == "date":
        _require(pa.types.is_date(array.type), ref)
        return _as_integers(array, pa.date32(), pa.int32())
    if kind == "time":
        _require(pa.types.is_time(array.type), ref)
        return _as_integers(array, pa.time64("us"), pa.int64())
    if kind in TIMESTAMP_TYPES:
        _require(pa.types.is_timestamp(array.type), ref)
        unit = "ns" if kind in TEMPORAL_NANOS else "us"
        return _as_integers(array, pa.timestamp(unit, tz=array.type.tz), pa.int64())
    return _promoted(array, ref)


def _promoted(array: pa.Array, ref: ex.FieldRef) -> pa.Array:
    """The values in the filter's (current) type: a snapshot read before an int/float/decimal promotion holds the
    narrower type, and the literal must not be narrowed to it (``x <= 0.1`` on a float keeps ``0.1f``)."""
    kind = ref.type_name
    if kind == "long" and pa.types.is_integer(array.type) and array.type != pa.int64():
        return array.cast(pa.int64())
    if kind == "double" and pa.types.is_floating(array.type) and array.type != pa.float64():
        return array.cast(pa.float64())
    if (match := _DECIMAL.fullmatch(kind)) and pa.types.is_decimal(array.type):
        wanted = pa.decimal128(int(match.group(1)), int(match.group(2)))
        if array.type != wanted:
            return array.cast(wanted)  # safe cast: a value that does not fit raises
    return array


def _require(matches: bool, ref: ex.FieldRef) -> None:
    if not matches:
        raise RestrictionApplyError(
            f"row filter column field id {ref.field_id} ({ref.type_name}) has an unexpected Arrow type"
        )


def _as_integers(array: pa.Array, logical: pa.DataType, physical: pa.DataType) -> pa.Array:
    if array.type != logical:
        array = array.cast(logical)  # safe cast: a lossy unit change raises instead of rounding
    return array.view(physical)
