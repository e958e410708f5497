"""``ScanTicket.user_filter``: the user's simple WHERE (``sqe.planning.user_filter``) to and from protobuf.

Decoding checks the message's structure (known operators, the number of values, a value in each); whether the
conditions fit the restricted output is the worker's compile of the filter against its schema.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterator

from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidTicketError
from sqe.planning.user_filter import (
    COMPARISONS,
    MAX_CONDITIONS,
    MAX_DEPTH,
    MAX_TEXT_BYTES,
    MAX_VALUES,
    NULL_CHECKS,
    AllOf,
    AnyOf,
    Clause,
    Condition,
    Not,
    Operator,
    UserFilter,
    Value,
)

__all__ = ["filter_from_proto", "filter_to_proto"]

_EPOCH = datetime.date(1970, 1, 1)
_TO_WIRE: dict[Operator, int] = {
    "eq": pb.FILTER_OPERATOR_EQ,
    "ne": pb.FILTER_OPERATOR_NE,
    "lt": pb.FILTER_OPERATOR_LT,
    "le": pb.FILTER_OPERATOR_LE,
    "gt": pb.FILTER_OPERATOR_GT,
    "ge": pb.FILTER_OPERATOR_GE,
    "in": pb.FILTER_OPERATOR_IN,
    "is_null": pb.FILTER_OPERATOR_IS_NULL,
    "is_not_null": pb.FILTER_OPERATOR_IS_NOT_NULL,
    "like": pb.FILTER_OPERATOR_LIKE,
}
_FROM_WIRE: dict[int, Operator] = {wire: name for name, wire in _TO_WIRE.items()}


def filter_to_proto(where: UserFilter) -> pb.UserFilter:
    return pb.UserFilter(conditions=[_clause_to_proto(clause) for clause in where.conditions])


def _clause_to_proto(clause: Clause) -> pb.FilterClause:
    if isinstance(clause, Condition):
        condition = pb.FilterCondition(
            column=clause.column,
            operator=_TO_WIRE[clause.operator],  # type: ignore[arg-type]
            values=[_value_to_proto(v) for v in clause.values],
        )
        return pb.FilterClause(condition=condition)
    if isinstance(clause, Not):
        return pb.FilterClause(negated=_clause_to_proto(clause.clause))
    parts = pb.FilterClauses(clauses=[_clause_to_proto(part) for part in clause.clauses])
    return pb.FilterClause(any=parts) if isinstance(clause, AnyOf) else pb.FilterClause(all=parts)


def _value_to_proto(value: Value) -> pb.FilterValue:
    if isinstance(value, bool):  # before int: a bool is an int in Python
        return pb.FilterValue(boolean=value)
    if isinstance(value, int):
        return pb.FilterValue(integer=value)
    if isinstance(value, str):
        return pb.FilterValue(text=value)
    if isinstance(value, float):
        return pb.FilterValue(real=value)
    return pb.FilterValue(date_days=(value - _EPOCH).days)


def filter_from_proto(message: pb.UserFilter) -> UserFilter:
    """The filter a ticket carries; a structural problem is InvalidTicketError (the fragment never starts)."""
    if not message.conditions:
        raise InvalidTicketError("user_filter needs at least one condition")
    counter = iter(range(MAX_CONDITIONS + 1))
    where = UserFilter(tuple(_clause(item, counter, 0) for item in message.conditions))
    if where.text_bytes() > MAX_TEXT_BYTES:
        raise InvalidTicketError(f"user_filter's string constants exceed {MAX_TEXT_BYTES} bytes")
    return where


def _clause(item: pb.FilterClause, counter: Iterator[int], depth: int) -> Clause:
    """One clause; ``counter`` numbers the conditions (running out of numbers is too many), ``depth`` the
    nesting of ANDs, ORs and NOTs."""
    kind = item.WhichOneof("clause")
    if kind == "condition":
        index = next(counter, None)
        if index is None or index >= MAX_CONDITIONS:
            raise InvalidTicketError(f"user_filter has more than {MAX_CONDITIONS} conditions")
        return _condition(item.condition, index)
    if kind is None:
        raise InvalidTicketError("user_filter: a clause is empty")
    if depth >= MAX_DEPTH:
        raise InvalidTicketError(f"user_filter nests ANDs, ORs and NOTs more than {MAX_DEPTH} deep")
    if kind == "negated":
        return Not(_clause(item.negated, counter, depth + 1))
    parts = item.any.clauses if kind == "any" else item.all.clauses
    if len(parts) < 2:
        raise InvalidTicketError(f"user_filter: an {'OR' if kind == 'any' else 'AND'} needs at least two clauses")
    clauses = tuple(_clause(part, counter, depth + 1) for part in parts)
    return AnyOf(clauses) if kind == "any" else AllOf(clauses)


def _condition(item: pb.FilterCondition, index: int) -> Condition:
    operator = _FROM_WIRE.get(item.operator)
    if operator is None:
        raise InvalidTicketError(f"user_filter: condition {index} has no (or an unknown) operator")
    if not item.column:
        raise InvalidTicketError(f"user_filter: condition {index} names no column")
    count = len(item.values)
    single = operator in COMPARISONS or operator == "like"
    fits = count == 0 if operator in NULL_CHECKS else count == 1 if single else count >= 1
    if not fits or count > MAX_VALUES:
        raise InvalidTicketError(f"user_filter: condition {index} ({operator}) has the wrong number of values")
    return Condition(item.column, operator, tuple(_value(v, index) for v in item.values))


def _value(value: pb.FilterValue, index: int) -> Value:
    kind = value.WhichOneof("value")
    if kind == "integer":
        return int(value.integer)
    if kind == "text":
        return str(value.text)
    if kind == "boolean":
        return bool(value.boolean)
    if kind == "date_days":
        try:
            return _EPOCH + datetime.timedelta(days=value.date_days)
        except OverflowError:
            raise InvalidTicketError(f"user_filter: condition {index} has a date out of range") from None
    if kind == "real":
        if not math.isfinite(value.real):
            raise InvalidTicketError(f"user_filter: condition {index} has a double that is not finite")
        return float(value.real)
    raise InvalidTicketError(f"user_filter: condition {index} has a value without a type")
