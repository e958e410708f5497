"""The schema a reader's row filter is bound to: initial-defaults in the representation of the filter's literals.

A data file written before a column was added lacks it; Iceberg reads the column's ``initial-default`` there.
pyiceberg's reader (``translate_column_names``) decides such a file's rows by evaluating each leaf of the filter
on the bound field's ``initial_default``, compared with the leaf's literal as pyiceberg holds it:

- a date, time or timestamp default is a Python ``date``/``time``/``datetime``, the literal Iceberg's internal
  number (days, microseconds, nanoseconds): ``v = DATE '2024-01-02'`` compared ``date(2024, 1, 2)`` with
  ``19724``, never equal;
- a float default is a Python float (a double), the literal rounded to a float: ``v = 0.1`` compared ``0.1``
  with ``0.1f``, never equal, though the rows the reader fills hold ``0.1f``.

Either way every row of every such file was dropped (a user's WHERE as well as the read-restrictions' filter).
Binding the reader's filter to a schema whose defaults are already in the literals' representation makes that
comparison Iceberg's. Only binding uses this schema: the reader fills the column itself from the projected
schema, which keeps pyiceberg's own values.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import (
    DateType,
    FloatType,
    IcebergType,
    NestedField,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
)
from pyiceberg.utils.datetime import date_to_days, datetime_to_micros, datetime_to_nanos, time_to_micros

from sqe.planning.read_filters import nearest_float32


def _float32(value: float) -> float:
    """The float (single precision) nearest ``value``, as a Python float: what a float column holds. One beyond
    a float's range (not a float column's default) stays as it is: it equals no float literal either way."""
    try:
        return nearest_float32(value)
    except OverflowError:
        return value


# Iceberg type -> (the Python type pyiceberg reads its default as, that value as the literals hold it)
_INTERNAL: dict[type[IcebergType], tuple[type, Callable[[Any], Any]]] = {
    FloatType: (float, _float32),
    DateType: (dt.date, date_to_days),
    TimeType: (dt.time, time_to_micros),
    TimestampType: (dt.datetime, datetime_to_micros),
    TimestamptzType: (dt.datetime, datetime_to_micros),
    TimestampNanoType: (dt.datetime, datetime_to_nanos),
    TimestamptzNanoType: (dt.datetime, datetime_to_nanos),
}


def with_internal_defaults(schema: Schema) -> Schema:
    """``schema`` with every temporal or float ``initial-default`` (nested ones too) as the literals hold it."""
    fields = [_converted(field) for field in schema.fields]
    if all(new is old for new, old in zip(fields, schema.fields, strict=True)):
        return schema
    return Schema(*fields, schema_id=schema.schema_id, identifier_field_ids=schema.identifier_field_ids)


def _converted(field: NestedField) -> NestedField:
    field_type = _converted_type(field.field_type)
    default = _internal(field.field_type, field.initial_default)
    if field_type is field.field_type and default is field.initial_default:
        return field
    return field.model_copy(update={"field_type": field_type, "initial_default": default})


def _converted_type(field_type: IcebergType) -> IcebergType:
    if isinstance(field_type, StructType):
        children = [_converted(child) for child in field_type.fields]
        if all(new is old for new, old in zip(children, field_type.fields, strict=True)):
            return field_type
        return StructType(*children)
    return field_type  # a filter cannot read into a list or map element: those stay as they are


def _internal(field_type: IcebergType, value: Any) -> Any:
    known = _INTERNAL.get(type(field_type))
    if known is None or value is None:
        return value
    python_type, to_number = known
    # a datetime is a date too: only a value of exactly the expected kind is converted (an int already is one)
    if type(value) is python_type or (python_type is dt.datetime and isinstance(value, dt.datetime)):
        return to_number(value)
    return value
