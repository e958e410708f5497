"""The required row filter as a pyiceberg expression for scan planning: never stronger than the real filter.

pyiceberg may evaluate the expression on files, manifests *and* rows (its Arrow path drops a row whose
predicate is null). So the translation must keep every row the exact filter keeps, under any null
semantics:

- negations are pushed down to the leaves first (negation normal form), so the tree is monotone in its
  leaves;
- a leaf that is true for null values in our two-valued logic (``not-eq``, ``not-in``, negated ``lt`` ...)
  gets ``OR is_null(x)`` (and ``OR is_nan(x)`` on float columns), because pyiceberg would drop those rows;
- a leaf pyiceberg cannot bind (for example a nanosecond timestamp literal) becomes AlwaysTrue, which in a
  monotone tree only weakens the filter. So does a leaf that needs ``is_null`` on a required field inside an
  optional struct: pyiceberg binds that to false, though the field is null wherever the struct is. Pruning
  with less is safe; the exact filter runs on every batch.
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

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
    NotEqualTo,
    NotIn,
    NotNaN,
    NotNull,
    NotStartsWith,
    Or,
    Reference,
    StartsWith,
)
from pyiceberg.expressions.visitors import bind
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField

from sqe.restrictions import expressions as ex
from sqe.restrictions.literals import FLOAT_TYPES, LiteralValue, parse_type_name

# op -> (pyiceberg leaf, true for null/NaN values where pyiceberg's leaf is not: it needs OR is_null/is_nan)
_COMPARISONS: dict[str, tuple[Callable[..., BooleanExpression], bool]] = {
    "eq": (EqualTo, False),
    "not-eq": (NotEqualTo, True),
    "lt": (LessThan, False),
    "lt-eq": (LessThanOrEqual, False),
    "gt": (GreaterThan, False),
    "gt-eq": (GreaterThanOrEqual, False),
}
_CHECKS: dict[str, tuple[Callable[..., BooleanExpression], bool]] = {
    "is-null": (IsNull, False),
    "not-null": (NotNull, False),
    "is-nan": (IsNaN, False),
    "not-nan": (NotNaN, True),
}
_COMPLEMENTS = {"eq": "not-eq", "lt": "gt-eq", "lt-eq": "gt", "is-null": "not-null", "is-nan": "not-nan"}
_COMPLEMENT = _COMPLEMENTS | {second: first for first, second in _COMPLEMENTS.items()}


def _comparison(op: str, negate: bool) -> tuple[Callable[..., BooleanExpression], bool]:
    """A negated comparison is its complement's leaf, true on null/NaN exactly where the comparison is not
    (our comparisons are two-valued: false on null and NaN, except ``not-eq``)."""
    make, true_on_null = _COMPARISONS[op]
    return (_COMPARISONS[_COMPLEMENT[op]][0], not true_on_null) if negate else (make, true_on_null)


def _check(op: str, negate: bool) -> tuple[Callable[..., BooleanExpression], bool]:
    """Null and NaN checks are never null themselves: a negated one is simply its complement."""
    return _CHECKS[_COMPLEMENT[op] if negate else op]


# pyiceberg 0.12 + pyarrow 26 cannot evaluate row filters on these over Arrow (no kernel for arrow.uuid).
_NOT_EVALUABLE_BY_PYICEBERG = frozenset({"uuid"})


def to_pyiceberg(predicate: ex.Predicate, schema: Schema | None = None) -> BooleanExpression:
    """Unbound pyiceberg expression by column name; ``schema`` (the scan's) makes the bind check exact."""
    return _Translator(schema).convert(predicate, negate=False)


class _Translator:
    def __init__(self, schema: Schema | None) -> None:
        self._schema = schema

    def convert(self, predicate: ex.Predicate, *, negate: bool) -> BooleanExpression:
        if isinstance(predicate, ex.Not):
            return self.convert(predicate.child, negate=not negate)
        if isinstance(predicate, ex.And | ex.Or):
            left = self.convert(predicate.left, negate=negate)
            right = self.convert(predicate.right, negate=negate)
            conjunction = isinstance(predicate, ex.And) != negate  # De Morgan
            return And(left, right) if conjunction else Or(left, right)
        return self._leaf(predicate, negate)

    def _leaf(self, leaf: ex.Leaf, negate: bool) -> BooleanExpression:
        ref = leaf.ref
        if ref.type_name in _NOT_EVALUABLE_BY_PYICEBERG:
            return AlwaysTrue()  # pruning with less is safe; the exact filter runs on every batch
        if isinstance(leaf, ex.NullCheck):
            make, true_on_null = _check(leaf.op, negate)
            build: Callable[[str], BooleanExpression] = lambda name: make(Reference(name))  # noqa: E731
        elif isinstance(leaf, ex.StartsWith):
            make, true_on_null = (NotStartsWith, True) if leaf.negated != negate else (StartsWith, False)
            prefix = leaf.prefix
            build = lambda name: make(Reference(name), prefix)  # noqa: E731
        elif isinstance(leaf, ex.SetMembership):
            if ref.type_name in FLOAT_TYPES:
                # The reader would test the set with Arrow's is_in, which tells -0.0 from 0.0 (the exact filter
                # does not: -0.0 in [0.0]), and drop rows the filter keeps; a Python set cannot hold both zeros.
                return AlwaysTrue()
            make, true_on_null = (NotIn, True) if leaf.negated != negate else (In, False)
            values = {_pyiceberg_value(value, ref) for value in leaf.values}
            build = lambda name: make(Reference(name), values)  # noqa: E731
        else:
            make, true_on_null = _comparison(leaf.op, negate)
            value = _pyiceberg_value(leaf.value, ref)
            build = lambda name: make(Reference(name), value)  # noqa: E731
        if (true_on_null or make is IsNull) and not self._null_test_is_exact(ref):
            return AlwaysTrue()  # pyiceberg would bind IsNull to false and drop rows the filter keeps
        if not self._binds(build, ref):
            return AlwaysTrue()
        expression = build(ref.name)
        if true_on_null:
            expression = Or(expression, IsNull(term=Reference(ref.name)))
            # A NaN check already answers NaN rows as pyiceberg does; only comparisons are false on NaN there.
            if ref.type_name in FLOAT_TYPES and not isinstance(leaf, ex.NullCheck):
                expression = Or(expression, IsNaN(term=Reference(ref.name)))
        return expression

    def _null_test_is_exact(self, ref: ex.FieldRef) -> bool:
        """Whether pyiceberg's IsNull on ``ref`` matches its null rows: pyiceberg binds IsNull on a required field
        to false, but a required field inside an optional struct is null wherever the struct is."""
        if len(ref.path) == 1:
            return True
        if self._schema is None:
            return False  # the ancestors' optionality is unknown
        try:
            fields = [self._schema.find_field(field_id) for field_id in ref.path]
        except ValueError:
            return False
        return not fields[-1].required or all(field.required for field in fields[:-1])

    def _binds(self, build: Callable[[str], BooleanExpression], ref: ex.FieldRef) -> bool:
        """Whether pyiceberg binds this leaf to the same field id (and can convert its literal)."""
        if self._schema is not None:
            schema, name, field_id = self._schema, ref.name, ref.field_id
        else:
            field = NestedField(1, "c", parse_type_name(ref.type_name), required=False)
            schema, name, field_id = Schema(field), "c", 1
        try:
            bound = bind(schema, build(name), case_sensitive=True)
        except Exception:  # pyiceberg raises several types for unconvertible literals; all mean "don't push"
            return False
        term = getattr(bound, "term", None)
        return term is not None and term.ref().field.field_id == field_id


def _pyiceberg_value(value: LiteralValue, ref: ex.FieldRef) -> object:
    """pyiceberg literal input: UUIDs as UUID, temporal values as integers in the Iceberg unit."""
    if ref.type_name == "uuid" and isinstance(value, bytes):
        return UUID(bytes=value)
    return value
