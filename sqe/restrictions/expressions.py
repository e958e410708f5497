"""The required row filter: a predicate tree bound by field id, parsed from the REST expression JSON.

Accepted input (Iceberg expressions spec, Appendix B, plus the deprecated forms the REST spec still
allows):

- new form: ``left``/``right``/``child``, ``{"type":"reference","id":N}`` (or ``"name"``), bare literals
  and ``{"type":"literal","value":V[,"data-type":T]}``, bare ``true``/``false``, ``in``/``not-in`` with
  ``values`` (a list of literals or ``{"type":"literals","values":[..],"data-type":T}``);
- deprecated form: ``term`` (a column name, or ``{"type":"reference","term":name}``) with
  ``value``/``values``, and ``{"type":"true"}``/``{"type":"false"}``.

Everything else fails closed: functions (``apply``), transforms, unknown types, unknown or missing keys, a
reference that does not resolve in the current schema, a literal that does not fit its column. A bare
string in ``left``/``child`` position is a literal, never a column.

Two-valued semantics (evaluated in ``evaluate.py``): a comparison with a null or NaN value is false, and
the ``not-*`` forms are exact negations, so ``not-eq`` is true for null.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from sqe.errors import InvalidRestrictionError, UnsupportedRestrictionError
from sqe.restrictions.literals import (
    FLOAT_TYPES,
    LiteralValue,
    compatible_literal_type,
    decode_literal,
    encode_literal,
    is_literal_type,
    parse_type_name,
    type_name,
)
from sqe.restrictions.schema_index import FieldInfo, SchemaIndex

CompareOp = Literal["lt", "lt-eq", "gt", "gt-eq", "eq", "not-eq"]
CheckOp = Literal["is-null", "not-null", "is-nan", "not-nan"]

COMPARE_OPS: frozenset[str] = frozenset({"lt", "lt-eq", "gt", "gt-eq", "eq", "not-eq"})
CHECK_OPS: frozenset[str] = frozenset({"is-null", "not-null", "is-nan", "not-nan"})
_FLIPPED: dict[str, CompareOp] = {
    "lt": "gt",
    "lt-eq": "gt-eq",
    "gt": "lt",
    "gt-eq": "lt-eq",
    "eq": "eq",
    "not-eq": "not-eq",
}
_STRING_OPS = frozenset({"starts-with", "not-starts-with"})
_SET_OPS = frozenset({"in", "not-in"})
_ERR = "read-restrictions: required-row-filter"


# --------------------------------------------------------------------------------------------- tree


@dataclass(frozen=True)
class FieldRef:
    """A column the filter names, resolved by field id in the schema it was bound against."""

    field_id: int
    name: str  # dotted name in the schema the filter was bound against
    type_name: str  # canonical Iceberg type
    path: tuple[int, ...]  # field ids from the top-level column down to this field (structs only)

    @property
    def top_level_id(self) -> int:
        return self.path[0]


@dataclass(frozen=True)
class Comparison:
    """``ref op value``; false where the column is null or NaN, except ``not-eq``, which is true there."""

    op: CompareOp
    ref: FieldRef
    value: LiteralValue


@dataclass(frozen=True)
class SetMembership:
    """``ref in values`` (``negated``: ``not-in``, true for null, as the exact negation of ``in``)."""

    ref: FieldRef
    values: tuple[LiteralValue, ...]
    negated: bool  # not-in


@dataclass(frozen=True)
class StartsWith:
    """A string column begins with ``prefix`` (``negated``: ``not-starts-with``, true for null)."""

    ref: FieldRef
    prefix: str
    negated: bool  # not-starts-with


@dataclass(frozen=True)
class NullCheck:
    """``is-null``/``not-null``/``is-nan``/``not-nan`` on one column; never itself null."""

    op: CheckOp
    ref: FieldRef


@dataclass(frozen=True)
class _Junction:
    """Two predicates joined; the subclass says how (an ``And`` never equals an ``Or`` of the same sides)."""

    left: Predicate
    right: Predicate


@dataclass(frozen=True)
class And(_Junction):
    """True where both sides are."""


@dataclass(frozen=True)
class Or(_Junction):
    """True where either side is."""


@dataclass(frozen=True)
class Not:
    """The exact negation of ``child`` (two-valued: true where the child is false, nulls included)."""

    child: Predicate


Predicate = Comparison | SetMembership | StartsWith | NullCheck | And | Or | Not
Leaf = Comparison | SetMembership | StartsWith | NullCheck


def leaves(predicate: Predicate) -> Iterator[Leaf]:
    if isinstance(predicate, And | Or):
        yield from leaves(predicate.left)
        yield from leaves(predicate.right)
    elif isinstance(predicate, Not):
        yield from leaves(predicate.child)
    else:
        yield predicate


# ------------------------------------------------------------------------------------------ parsing


def parse_row_filter(raw: Any, index: SchemaIndex) -> Predicate | bool:
    """Parse and bind a ``required-row-filter``; True/False when it folds to a constant."""
    if raw is None:
        return True
    return _Parser(index).predicate(raw)


@dataclass(frozen=True)
class _RawLiteral:
    value: Any
    data_type: str | None


_Operand = FieldRef | _RawLiteral
_Tree = Predicate | bool


class _Parser:
    def __init__(self, index: SchemaIndex) -> None:
        self._index = index

    # -- predicates

    def predicate(self, node: Any) -> _Tree:
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            raise InvalidRestrictionError(f"{_ERR}: expected a predicate object or true/false")
        kind = node.get("type")
        if not isinstance(kind, str):
            raise InvalidRestrictionError(f"{_ERR}: a predicate has no string 'type'")
        if kind in ("true", "false"):
            _keys(node, {"type"})
            return kind == "true"
        if kind in ("and", "or"):
            _keys(node, {"type", "left", "right"})
            left, right = self.predicate(node["left"]), self.predicate(node["right"])
            return _combine(kind, left, right)
        if kind == "not":
            _keys(node, {"type", "child"})
            return _negate(self.predicate(node["child"]))
        if kind in CHECK_OPS:
            return self._check(kind, node)
        if kind in COMPARE_OPS or kind in _STRING_OPS:
            return self._binary(kind, node)
        if kind in _SET_OPS:
            return self._set(kind, node)
        if kind == "apply":
            raise UnsupportedRestrictionError(f"{_ERR}: functions (apply) are not supported")
        if kind in ("reference", "literal", "literals", "transform"):
            raise InvalidRestrictionError(f"{_ERR}: '{kind}' is not a predicate")
        raise UnsupportedRestrictionError(f"{_ERR}: unknown expression type '{kind}'")

    def _check(self, kind: str, node: dict[str, Any]) -> _Tree:
        ref = self._ref_operand(node, deprecated_key="term", key="child")
        if kind in ("is-nan", "not-nan") and ref.type_name not in FLOAT_TYPES:
            raise InvalidRestrictionError(f"{_ERR}: {kind} needs a float or double column, not {ref.type_name}")
        return NullCheck(cast(CheckOp, kind), ref)

    def _binary(self, kind: str, node: dict[str, Any]) -> _Tree:
        if "term" in node:
            _keys(node, {"type", "term", "value"})
            left: _Operand = self._term(node["term"])
            right: _Operand = _RawLiteral(node["value"], None)
        else:
            _keys(node, {"type", "left", "right"})
            left, right = self._operand(node["left"]), self._operand(node["right"])
        if isinstance(left, _RawLiteral) and isinstance(right, FieldRef):
            if kind in _STRING_OPS:
                raise UnsupportedRestrictionError(f"{_ERR}: {kind} needs the column on the left")
            left, right, kind = right, left, _FLIPPED[kind]
        if not isinstance(left, FieldRef) or not isinstance(right, _RawLiteral):
            raise UnsupportedRestrictionError(f"{_ERR}: {kind} must compare one column with one literal")
        if kind in _STRING_OPS:
            if left.type_name != "string":
                raise InvalidRestrictionError(f"{_ERR}: {kind} needs a string column, not {left.type_name}")
            prefix = _typed(right, left)
            assert isinstance(prefix, str)
            return StartsWith(left, prefix, negated=kind == "not-starts-with")
        _require_comparable(kind, left)
        return Comparison(cast(CompareOp, kind), left, _typed(right, left))

    def _set(self, kind: str, node: dict[str, Any]) -> _Tree:
        if "term" in node:
            _keys(node, {"type", "term", "values"})
            ref = self._term(node["term"])
            raw_values = node["values"]
            if not isinstance(raw_values, list):
                raise InvalidRestrictionError(f"{_ERR}: {kind} 'values' must be a list")
            literals = [_RawLiteral(value, None) for value in raw_values]
        else:
            _keys(node, {"type", "child", "values"})
            child = self._operand(node["child"])
            if not isinstance(child, FieldRef):
                raise UnsupportedRestrictionError(f"{_ERR}: {kind} needs a column as its child")
            ref, literals = child, self._literal_list(node["values"])
        _require_comparable(kind, ref)
        values = tuple(dict.fromkeys(_typed(literal, ref) for literal in literals))
        if not values:
            return kind == "not-in"  # x in () is false for every row, x not-in () is true
        return SetMembership(ref, values, negated=kind == "not-in")

    # -- operands

    def _ref_operand(self, node: dict[str, Any], *, deprecated_key: str, key: str) -> FieldRef:
        if deprecated_key in node:
            _keys(node, {"type", deprecated_key})
            return self._term(node[deprecated_key])
        _keys(node, {"type", key})
        operand = self._operand(node[key])
        if not isinstance(operand, FieldRef):
            raise UnsupportedRestrictionError(f"{_ERR}: {node['type']} needs a column, not a literal")
        return operand

    def _operand(self, node: Any) -> _Operand:
        if isinstance(node, dict):
            kind = node.get("type")
            if kind == "reference":
                return self._reference(node)
            if kind == "literal":
                _keys(node, {"type", "value"}, optional={"data-type"})
                return _RawLiteral(node["value"], _data_type(node))
            if kind == "apply":
                raise UnsupportedRestrictionError(f"{_ERR}: functions (apply) are not supported")
            if kind == "transform":
                raise UnsupportedRestrictionError(f"{_ERR}: transforms are not supported")
            if isinstance(kind, str) and kind not in COMPARE_OPS | CHECK_OPS | _STRING_OPS | _SET_OPS:
                raise UnsupportedRestrictionError(f"{_ERR}: unknown expression type '{kind}'")
            raise InvalidRestrictionError(f"{_ERR}: expected a reference or a literal")
        if isinstance(node, bool | int | float | str):
            return _RawLiteral(node, None)  # a bare string is a literal, not a column
        raise InvalidRestrictionError(f"{_ERR}: expected a reference or a literal")

    def _term(self, node: Any) -> FieldRef:
        """Deprecated ``term``: a column name, or ``{"type":"reference","term":name}``."""
        if isinstance(node, str):
            return self._by_name(node)
        if isinstance(node, dict) and node.get("type") == "reference":
            return self._reference(node)
        if isinstance(node, dict) and node.get("type") == "transform":
            raise UnsupportedRestrictionError(f"{_ERR}: transforms are not supported")
        raise InvalidRestrictionError(f"{_ERR}: 'term' must be a column name or a reference")

    def _reference(self, node: dict[str, Any]) -> FieldRef:
        if "id" in node:
            _keys(node, {"type", "id"})
            return self._by_id(node["id"])
        for key in ("name", "term"):
            if key in node:
                _keys(node, {"type", key})
                if not isinstance(node[key], str):
                    raise InvalidRestrictionError(f"{_ERR}: reference '{key}' must be a string")
                return self._by_name(node[key])
        raise InvalidRestrictionError(f"{_ERR}: a reference needs an 'id'")

    def _by_id(self, field_id: Any) -> FieldRef:
        if isinstance(field_id, bool) or not isinstance(field_id, int):
            raise InvalidRestrictionError(f"{_ERR}: reference id must be an integer")
        if field_id <= 0:
            raise InvalidRestrictionError(f"{_ERR}: reference id {field_id} must be positive")
        info = self._index.get(field_id)
        if info is None:
            raise InvalidRestrictionError(f"{_ERR}: field id {field_id} is not in the current table schema")
        return _bind(info)

    def _by_name(self, name: str) -> FieldRef:
        info = self._index.by_name(name)
        if info is None:
            raise InvalidRestrictionError(f"{_ERR}: a referenced column is not in the current table schema")
        return _bind(info)

    def _literal_list(self, node: Any) -> list[_RawLiteral]:
        if isinstance(node, list):
            literals = [self._operand(item) for item in node]
            if not all(isinstance(item, _RawLiteral) for item in literals):
                raise UnsupportedRestrictionError(f"{_ERR}: in/not-in values must be literals")
            return [item for item in literals if isinstance(item, _RawLiteral)]
        if isinstance(node, dict) and node.get("type") == "literals":
            _keys(node, {"type", "values"}, optional={"data-type"})
            if not isinstance(node["values"], list):
                raise InvalidRestrictionError(f"{_ERR}: literals 'values' must be a list")
            data_type = _data_type(node)
            return [_RawLiteral(value, data_type) for value in node["values"]]
        raise InvalidRestrictionError(f"{_ERR}: in/not-in 'values' must be a list or a literals object")


def _bind(info: FieldInfo) -> FieldRef:
    if info.repeated:
        raise UnsupportedRestrictionError(
            f"{_ERR}: field id {info.field_id} is inside a list or map; row filters on it are not supported"
        )
    return FieldRef(info.field_id, info.name, info.type_name, info.path)


def _require_comparable(kind: str, ref: FieldRef) -> None:
    if not is_literal_type(ref.type_name):
        raise InvalidRestrictionError(f"{_ERR}: {kind} cannot apply to field id {ref.field_id} ({ref.type_name})")


def _typed(literal: _RawLiteral, ref: FieldRef) -> LiteralValue:
    what = f"field id {ref.field_id}"
    if literal.data_type is not None:
        declared = type_name(parse_type_name(literal.data_type))
        if not compatible_literal_type(declared, ref.type_name):
            raise InvalidRestrictionError(
                f"{_ERR}: a {declared} literal cannot be compared with {what} ({ref.type_name})"
            )
        # The literal is a value of its declared type, converted to the column's: a float literal 0.1 is
        # float32(0.1) even against a double column (read as a double it would admit rows in between).
        value = decode_literal(literal.value, declared, what)
        return decode_literal(encode_literal(value, declared), ref.type_name, what)
    return decode_literal(literal.value, ref.type_name, what)


def _data_type(node: Mapping[str, Any]) -> str | None:
    data_type = node.get("data-type")
    if data_type is None:
        return None
    if not isinstance(data_type, str):
        raise InvalidRestrictionError(f"{_ERR}: 'data-type' must be a type name string")
    return data_type


def _keys(node: Mapping[str, Any], required: set[str], optional: frozenset[str] | set[str] = frozenset()) -> None:
    extra = node.keys() - required - optional
    if extra:
        raise InvalidRestrictionError(f"{_ERR}: '{node.get('type')}' has unexpected keys {sorted(extra)}")
    missing = required - node.keys()
    if missing:
        raise InvalidRestrictionError(f"{_ERR}: '{node.get('type')}' is missing {sorted(missing)}")


# ------------------------------------------------------------------------------------------ folding
# Constants fold bottom-up while parsing, after both operands were fully validated, so a dropped branch still
# had to be well-formed.


def _combine(kind: str, left: _Tree, right: _Tree) -> _Tree:
    absorbing = kind == "or"  # true absorbs "or"; false absorbs "and"
    for side, other in ((left, right), (right, left)):
        if isinstance(side, bool):
            return absorbing if side is absorbing else other
    assert not isinstance(left, bool) and not isinstance(right, bool)
    return And(left, right) if kind == "and" else Or(left, right)


def _negate(child: _Tree) -> _Tree:
    return (not child) if isinstance(child, bool) else Not(child)


# ---------------------------------------------------------------------------------------- plan JSON


def predicate_to_json(predicate: Predicate) -> dict[str, Any]:
    """The bound filter in SQE's plan format (field ids, names and types inline, literals spec-encoded)."""
    if isinstance(predicate, And | Or):
        kind = "and" if isinstance(predicate, And) else "or"
        return {
            "type": kind,
            "left": predicate_to_json(predicate.left),
            "right": predicate_to_json(predicate.right),
        }
    if isinstance(predicate, Not):
        return {"type": "not", "child": predicate_to_json(predicate.child)}
    ref = _ref_json(predicate.ref)
    if isinstance(predicate, Comparison):
        return {
            "type": predicate.op,
            "ref": ref,
            "value": encode_literal(predicate.value, predicate.ref.type_name),
        }
    if isinstance(predicate, SetMembership):
        values = [encode_literal(value, predicate.ref.type_name) for value in predicate.values]
        return {"type": "not-in" if predicate.negated else "in", "ref": ref, "values": values}
    if isinstance(predicate, StartsWith):
        kind = "not-starts-with" if predicate.negated else "starts-with"
        return {"type": kind, "ref": ref, "value": predicate.prefix}
    return {"type": predicate.op, "ref": ref}


def predicate_from_json(node: Any) -> Predicate:
    """Inverse of ``predicate_to_json``; any deviation fails closed."""
    if not isinstance(node, dict) or not isinstance(node.get("type"), str):
        raise InvalidRestrictionError("restriction plan: malformed row filter node")
    kind = node["type"]
    if kind in ("and", "or"):
        _plan_keys(node, {"type", "left", "right"})
        left, right = predicate_from_json(node["left"]), predicate_from_json(node["right"])
        return And(left, right) if kind == "and" else Or(left, right)
    if kind == "not":
        _plan_keys(node, {"type", "child"})
        return Not(predicate_from_json(node["child"]))
    if kind in CHECK_OPS:
        _plan_keys(node, {"type", "ref"})
        return NullCheck(cast(CheckOp, kind), _ref_from_json(node["ref"]))
    if kind in _SET_OPS:
        _plan_keys(node, {"type", "ref", "values"})
        ref = _ref_from_json(node["ref"])
        if not isinstance(node["values"], list) or not node["values"]:
            raise InvalidRestrictionError("restriction plan: malformed in/not-in values")
        values = tuple(decode_literal(value, ref.type_name, f"field id {ref.field_id}") for value in node["values"])
        return SetMembership(ref, values, negated=kind == "not-in")
    if kind in COMPARE_OPS or kind in _STRING_OPS:
        _plan_keys(node, {"type", "ref", "value"})
        ref = _ref_from_json(node["ref"])
        value = decode_literal(node["value"], ref.type_name, f"field id {ref.field_id}")
        if kind in _STRING_OPS:
            assert isinstance(value, str)
            return StartsWith(ref, value, negated=kind == "not-starts-with")
        return Comparison(cast(CompareOp, kind), ref, value)
    raise InvalidRestrictionError(f"restriction plan: unknown row filter node '{kind}'")


def _ref_json(ref: FieldRef) -> dict[str, Any]:
    return {"field-id": ref.field_id, "name": ref.name, "field-type": ref.type_name, "path": list(ref.path)}


def _ref_from_json(node: Any) -> FieldRef:
    if not isinstance(node, dict):
        raise InvalidRestrictionError("restriction plan: malformed field reference")
    _plan_keys(node, {"field-id", "name", "field-type", "path"})
    field_id, name, field_type, path = node["field-id"], node["name"], node["field-type"], node["path"]
    if not (
        _is_positive_int(field_id)
        and isinstance(name, str)
        and isinstance(field_type, str)
        and isinstance(path, list)
        and path
        and all(_is_positive_int(item) for item in path)
        and path[-1] == field_id
    ):
        raise InvalidRestrictionError("restriction plan: malformed field reference")
    return FieldRef(field_id, name, field_type, tuple(path))


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _plan_keys(node: Mapping[str, Any], expected: set[str]) -> None:
    if set(node.keys()) != expected:
        raise InvalidRestrictionError(f"restriction plan: row filter node '{node.get('type')}' has wrong keys")


def referenced_fields(predicate: Predicate | None) -> Sequence[FieldRef]:
    if predicate is None:
        return ()
    return tuple(dict.fromkeys(leaf.ref for leaf in leaves(predicate)))
