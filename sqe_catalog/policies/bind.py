"""Binding a parsed policy to one request: the subject (end user, groups) and the table schema (field ids, types).

Context (``Subject``)
    ``session_user()`` is the authenticated end user: for a delegated token the subject, never the reader acting
    for it. ``is_group_member(g)`` is exact, flat membership; an unknown group is an error, never ``false``
    (``Subject.known_groups`` is read in the same snapshot as the memberships).

Schema
    ``col(name)`` binds once, by exact name, to exactly one top-level field of the current schema (none or more
    than one fails the load). Value predicates need a type of the design's table (boolean, int, long, float,
    double, decimal, date, time, timestamp without zone, string); null tests need a nullable field.

Literal typing (no implicit conversion of any kind)
    A source literal gets its type once, from the column it is compared with, and must represent that type
    exactly: booleans only for boolean columns; numbers without a fraction for int/long (in range); numbers
    exactly representable for float/double (``0.1`` is not; negative zero is refused because readers disagree on
    whether it equals zero); numbers with at most the column's scale and precision for decimals (never rounded);
    strings in strict ISO form for date, time and timestamp (at most microseconds, no offset); strings for
    strings. Anything else is ``bind-literal-type`` / ``bind-literal-inexact`` / ``bind-literal-out-of-range``.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation, localcontext

from pyiceberg.schema import Schema
from pyiceberg.types import NestedField

from sqe.errors import RestrictionError
from sqe.restrictions.literals import LiteralValue, decode_literal, type_name
from sqe_catalog.policies.errors import PolicyError
from sqe_catalog.policies.rego import Literal_

__all__ = ["BoundField", "Subject", "bind_column", "type_literal"]

VALUE_TYPES = frozenset({"boolean", "int", "long", "float", "double", "date", "time", "timestamp", "string"})
ORDERED_TYPES = VALUE_TYPES - {"boolean"}
_INT_RANGE = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIME = re.compile(r"\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?")
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?")
_TEMPORAL = {"date": _DATE, "time": _TIME, "timestamp": _TIMESTAMP}


@dataclass(frozen=True)
class Subject:
    """The request context a policy binds to: one end user and a consistent snapshot of group facts."""

    user: str
    groups: frozenset[str]  # the user's direct (flat) memberships
    known_groups: frozenset[str]  # every group that exists, read in the same snapshot

    def is_member(self, group: str) -> bool:
        if group not in self.known_groups:
            raise PolicyError("bind-unknown-group", f"group {group!r} does not exist")
        return group in self.groups


@dataclass(frozen=True)
class BoundField:
    field_id: int
    name: str
    type_name: str
    required: bool


def _is_decimal(name: str) -> bool:
    return name.startswith("decimal(")


def bind_column(schema: Schema, name: str) -> BoundField:
    """The one top-level field named exactly ``name``; PolicyError when there is none or more than one."""
    matches = [f for f in schema.fields if f.name == name]
    if not matches:
        raise PolicyError("bind-unknown-column", f"the table has no top-level column {name!r}")
    if len(matches) > 1:
        raise PolicyError("bind-ambiguous-column", f"the table has several top-level columns named {name!r}")
    return _bound(matches[0])


def _bound(field: NestedField) -> BoundField:
    return BoundField(field.field_id, field.name, type_name(field.field_type), field.required)


def require_value_type(field: BoundField, *, ordering: bool) -> None:
    supported = field.type_name in VALUE_TYPES or _is_decimal(field.type_name)
    if not supported or not isinstance(field.type_name, str):
        raise PolicyError(
            "bind-unsupported-column-type",
            f"column {field.name!r} has type {field.type_name}, which policies cannot compare",
        )
    if ordering and field.type_name == "boolean":
        raise PolicyError("bind-unsupported-operator", f"boolean column {field.name!r} has no ordering")


def require_nullable(field: BoundField) -> None:
    if field.required:
        raise PolicyError("bind-null-test-on-required", f"column {field.name!r} is required: it is never null")


def type_literal(literal: Literal_, field: BoundField) -> LiteralValue:
    """The literal as a value of the column's exact type, or PolicyError (never a conversion)."""
    kind, value, target = literal.kind, literal.value, field.type_name
    where = f"a literal compared with column {field.name!r} ({target})"
    if target == "boolean":
        if kind != "boolean":
            raise PolicyError("bind-literal-type", f"{where} must be true or false")
        assert isinstance(value, bool)
        return value
    if target == "string":
        if kind != "string":
            raise PolicyError("bind-literal-type", f"{where} must be a string")
        assert isinstance(value, str)
        return value
    if target in _TEMPORAL:
        return _temporal(kind, value, target, where)
    if kind != "number":
        raise PolicyError("bind-literal-type", f"{where} must be a number")
    assert isinstance(value, str)
    if target in _INT_RANGE:
        return _integer(value, target, where)
    if target in ("float", "double"):
        return _floating(value, target, where)
    if _is_decimal(target):
        return _decimal(value, target, where)
    raise PolicyError("bind-unsupported-column-type", f"column {field.name!r} has type {target}")


def _integer(text: str, target: str, where: str) -> int:
    if "." in text:
        raise PolicyError("bind-literal-inexact", f"{where} must be an integer (no decimal point)")
    number = int(text)
    low, high = _INT_RANGE[target]
    if not low <= number <= high:
        raise PolicyError("bind-literal-out-of-range", f"{where} is outside the {target} range")
    return number


def _floating(text: str, target: str, where: str) -> float:
    exact = Decimal(text)
    if exact.is_zero() and text.startswith("-"):
        raise PolicyError("bind-literal-inexact", f"{where}: negative zero is not a portable literal")
    try:
        number = float(text)
        if target == "float":
            number = struct.unpack("<f", struct.pack("<f", number))[0]
    except OverflowError:
        raise PolicyError("bind-literal-out-of-range", f"{where} is outside the {target} range") from None
    if number in (float("inf"), float("-inf")):
        raise PolicyError("bind-literal-out-of-range", f"{where} is outside the {target} range")
    if Decimal(number) != exact:
        raise PolicyError("bind-literal-inexact", f"{where} is not exactly representable as a {target}")
    return number


def _decimal(text: str, target: str, where: str) -> Decimal:
    match = re.fullmatch(r"decimal\((\d+),(-?\d+)\)", target)
    assert match is not None
    precision, scale = int(match.group(1)), int(match.group(2))
    number = Decimal(text)
    try:
        with localcontext() as context:
            context.prec = 200  # enough for any source literal (16 KiB) at any scale the schema allows
            quantized = number.quantize(Decimal(1).scaleb(-scale))
    except InvalidOperation:
        raise PolicyError("bind-literal-out-of-range", f"{where} does not fit {target}") from None
    if quantized != number:
        raise PolicyError("bind-literal-inexact", f"{where} cannot be represented without rounding")
    if quantized.is_zero():
        quantized = abs(quantized)  # -0.00 is 0.00: the same decimal value
    if len(quantized.as_tuple().digits) > precision:
        raise PolicyError("bind-literal-out-of-range", f"{where} has more digits than precision {precision}")
    return quantized


def _temporal(kind: str, value: object, target: str, where: str) -> LiteralValue:
    if kind != "string" or not isinstance(value, str) or not _TEMPORAL[target].fullmatch(value):
        shapes = {"date": "YYYY-MM-DD", "time": "HH:MM:SS[.ffffff]", "timestamp": "YYYY-MM-DDTHH:MM:SS[.ffffff]"}
        raise PolicyError("bind-literal-type", f"{where} must be a string {shapes[target]} (no offset)")
    try:
        return decode_literal(value, target, "the column")
    except RestrictionError:
        raise PolicyError("bind-literal-out-of-range", f"{where} is not a valid {target}") from None
