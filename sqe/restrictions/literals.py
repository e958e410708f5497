"""Iceberg type names and the single-value JSON encoding of literals (Iceberg spec, Appendix D).

In memory a literal is a plain Python value in the type's physical unit, so it compares directly with Arrow
buffers: date -> days since epoch, time -> microseconds since midnight, timestamp(tz) -> microseconds since
epoch, the ``_ns`` variants -> nanoseconds, uuid/fixed/binary -> bytes, decimal -> ``Decimal`` carrying the
column's scale, float -> a Python float already rounded to float32.

Error messages never echo a literal's value: restriction contents are policy data.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import struct
import uuid
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    PrimitiveType,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from sqe.errors import InvalidRestrictionError

LiteralValue = bool | int | float | Decimal | str | bytes

_SIMPLE_TYPES: dict[str, PrimitiveType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "date": DateType(),
    "time": TimeType(),
    "timestamp": TimestampType(),
    "timestamptz": TimestamptzType(),
    "timestamp_ns": TimestampNanoType(),
    "timestamptz_ns": TimestamptzNanoType(),
    "string": StringType(),
    "uuid": UUIDType(),
    "binary": BinaryType(),
}
_DECIMAL_NAME = re.compile(r"decimal\((\d+),(-?\d+)\)", re.ASCII)
_FIXED_NAME = re.compile(r"fixed\[(\d+)\]", re.ASCII)

TEMPORAL_MICROS = frozenset({"time", "timestamp", "timestamptz"})
TEMPORAL_NANOS = frozenset({"timestamp_ns", "timestamptz_ns"})
TIMESTAMP_TYPES = frozenset({"timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns"})
FLOAT_TYPES = frozenset({"float", "double"})

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_EPOCH = dt.date(1970, 1, 1)
_MICROS_PER_DAY = 86_400_000_000
_NANOS_PER_DAY = 86_400_000_000_000

# re.ASCII: without it \d (and then int() and Decimal()) accept any Unicode digit, which the encoding does not
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_TIME = r"(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?"
_TIME_ONLY = re.compile(_TIME, re.ASCII)
_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})T" + _TIME, re.ASCII)
_TIMESTAMPTZ = re.compile(r"(\d{4})-(\d{2})-(\d{2})T" + _TIME + r"\+00:00", re.ASCII)
_DECIMAL = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", re.ASCII)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")


# --------------------------------------------------------------------------------------- type names


def type_name(field_type: IcebergType) -> str:
    """Canonical, whitespace-free name of an Iceberg type ("decimal(9,2)", "fixed[16]", "struct", ...)."""
    if isinstance(field_type, DecimalType):
        return f"decimal({field_type.precision},{field_type.scale})"
    if isinstance(field_type, FixedType):
        return f"fixed[{len(field_type)}]"
    if isinstance(field_type, StructType):
        return "struct"
    if isinstance(field_type, ListType):
        return "list"
    if isinstance(field_type, MapType):
        return "map"
    return str(field_type)


def parse_type_name(name: str) -> PrimitiveType:
    """The primitive Iceberg type a literal's ``data-type`` names; anything else is invalid."""
    compact = "".join(name.split())
    if compact in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[compact]
    if match := _DECIMAL_NAME.fullmatch(compact):
        precision, scale = int(match.group(1)), int(match.group(2))
        if 1 <= precision <= 38:
            return DecimalType(precision, scale)
    if (match := _FIXED_NAME.fullmatch(compact)) and int(match.group(1)) > 0:
        return FixedType(int(match.group(1)))
    raise InvalidRestrictionError("read-restrictions: a literal names an unknown data-type")


def is_literal_type(name: str) -> bool:
    """Whether a column of this Iceberg type can be compared with a literal."""
    return name in _SIMPLE_TYPES or bool(_DECIMAL_NAME.fullmatch(name) or _FIXED_NAME.fullmatch(name))


def decimal_scale(name: str) -> int:
    match = _DECIMAL_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"not a decimal type: {name}")
    return int(match.group(2))


def decimal_precision(name: str) -> int:
    match = _DECIMAL_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"not a decimal type: {name}")
    return int(match.group(1))


def fixed_length(name: str) -> int:
    match = _FIXED_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"not a fixed type: {name}")
    return int(match.group(1))


def compatible_literal_type(literal_type: str, field_type: str) -> bool:
    """A declared literal type may differ from the column's only where the value converts without loss."""
    if literal_type == field_type:
        return True
    widening = ({"int", "long"}, {"float", "double"})
    if any({literal_type, field_type} <= group for group in widening):
        return True
    both_decimal = literal_type.startswith("decimal(") and field_type.startswith("decimal(")
    return both_decimal and decimal_scale(literal_type) == decimal_scale(field_type)


# ----------------------------------------------------------------------------------------- decoding


def decode_literal(value: object, field_type: str, what: str) -> LiteralValue:
    """Decode a JSON single value for a column of ``field_type``; ``what`` names the field in errors."""
    if value is None:
        raise InvalidRestrictionError(f"read-restrictions: null literal for {what}; use is-null/not-null")
    decoder = _decoder_for(field_type)
    if decoder is None:
        raise InvalidRestrictionError(f"read-restrictions: {what} has type {field_type}, which has no literals")
    try:
        return decoder(value, field_type)
    except _NoFit as exc:
        raise InvalidRestrictionError(
            f"read-restrictions: literal for {what} does not fit type {field_type}: {exc}"
        ) from None


class _NoFit(Exception):
    pass


def _decoder_for(field_type: str) -> Callable[[object, str], LiteralValue] | None:
    if field_type.startswith("decimal("):
        return _decode_decimal
    if field_type.startswith("fixed["):
        return _decode_fixed
    return _DECODERS.get(field_type)


def _decode_boolean(value: object, _: str) -> LiteralValue:
    if not isinstance(value, bool):
        raise _NoFit("expected a JSON boolean")
    return value


def _decode_integer(value: object, field_type: str) -> LiteralValue:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _NoFit("expected a JSON integer")
    low, high = _INT32 if field_type == "int" else _INT64
    if not low <= value <= high:
        raise _NoFit("out of range")
    return value


def _decode_floating(value: object, field_type: str) -> LiteralValue:
    if not isinstance(value, float):
        raise _NoFit("expected a JSON number with a decimal point")
    if not math.isfinite(value):
        raise _NoFit("NaN and infinity are not literals; use is-nan/not-nan")
    if field_type == "double":
        return value
    try:
        rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        raise _NoFit("out of float range") from None
    return rounded


def _decode_decimal(value: object, field_type: str) -> LiteralValue:
    if not isinstance(value, str) or not _DECIMAL.fullmatch(value):
        raise _NoFit("expected a decimal string")
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise _NoFit("expected a decimal string") from None
    sign_digits_exponent = number.as_tuple()
    exponent = sign_digits_exponent.exponent
    assert isinstance(exponent, int)  # finite by the regex
    if -exponent != decimal_scale(field_type):
        raise _NoFit("scale differs from the column's scale")
    if len(sign_digits_exponent.digits) > decimal_precision(field_type):
        raise _NoFit("too many digits for the column's precision")
    return number


def _decode_string(value: object, _: str) -> LiteralValue:
    if not isinstance(value, str):
        raise _NoFit("expected a JSON string")
    return value


def _decode_uuid(value: object, _: str) -> LiteralValue:
    if not isinstance(value, str) or not _UUID.fullmatch(value):
        raise _NoFit("expected a 36-character UUID string")
    return uuid.UUID(value).bytes


def _decode_hex(value: object) -> bytes:
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        raise _NoFit("expected a hex string")
    return bytes.fromhex(value)


def _decode_fixed(value: object, field_type: str) -> LiteralValue:
    decoded = _decode_hex(value)
    if len(decoded) != fixed_length(field_type):
        raise _NoFit("wrong number of bytes")
    return decoded


def _decode_binary(value: object, _: str) -> LiteralValue:
    return _decode_hex(value)


def _decode_date(value: object, _: str) -> LiteralValue:
    if not isinstance(value, str) or not (match := _DATE.fullmatch(value)):
        raise _NoFit("expected an ISO date YYYY-MM-DD")
    return _days(match.group(1), match.group(2), match.group(3))


def _decode_time(value: object, _: str) -> LiteralValue:
    if not isinstance(value, str) or not (match := _TIME_ONLY.fullmatch(value)):
        raise _NoFit("expected an ISO time HH:MM:SS[.ffffff]")
    return _to_micros(_nanos_of_day(*match.groups()))


def _decode_timestamp(value: object, field_type: str) -> LiteralValue:
    pattern = _TIMESTAMPTZ if field_type.startswith("timestamptz") else _TIMESTAMP
    if not isinstance(value, str) or not (match := pattern.fullmatch(value)):
        expected = "ending in +00:00" if pattern is _TIMESTAMPTZ else "without an offset"
        raise _NoFit(f"expected an ISO timestamp {expected}")
    year, month, day, *clock = match.groups()
    nanos = _days(year, month, day) * _NANOS_PER_DAY + _nanos_of_day(*clock)
    if field_type not in TEMPORAL_NANOS:
        return _to_micros(nanos)
    if not _INT64[0] <= nanos <= _INT64[1]:
        raise _NoFit("outside the nanosecond timestamp range")
    return nanos


def _days(year: str, month: str, day: str) -> int:
    try:
        return (dt.date(int(year), int(month), int(day)) - _EPOCH).days
    except ValueError:
        raise _NoFit("not a calendar date") from None


def _nanos_of_day(hour: str, minute: str, second: str | None, fraction: str | None) -> int:
    h, m, s = int(hour), int(minute), int(second or 0)
    if h > 23 or m > 59 or s > 59:
        raise _NoFit("not a valid time of day")
    return ((h * 60 + m) * 60 + s) * 1_000_000_000 + int((fraction or "").ljust(9, "0"))


def _to_micros(nanos: int) -> int:
    if nanos % 1000:
        raise _NoFit("more precise than microseconds")
    return nanos // 1000


_DECODERS: dict[str, Callable[[object, str], LiteralValue]] = {
    "boolean": _decode_boolean,
    "int": _decode_integer,
    "long": _decode_integer,
    "float": _decode_floating,
    "double": _decode_floating,
    "date": _decode_date,
    "time": _decode_time,
    "timestamp": _decode_timestamp,
    "timestamptz": _decode_timestamp,
    "timestamp_ns": _decode_timestamp,
    "timestamptz_ns": _decode_timestamp,
    "string": _decode_string,
    "uuid": _decode_uuid,
    "binary": _decode_binary,
}


# ----------------------------------------------------------------------------------------- encoding


def encode_literal(value: LiteralValue, field_type: str) -> bool | int | float | str:
    """The JSON single-value form of a decoded literal; ``decode_literal`` reads it back unchanged."""
    if field_type in ("boolean", "int", "long", "float", "double", "string"):
        assert isinstance(value, bool | int | float | str)
        return value
    if field_type.startswith("decimal("):
        return str(value)
    if field_type == "uuid":
        assert isinstance(value, bytes)
        return str(uuid.UUID(bytes=value))
    if field_type == "binary" or field_type.startswith("fixed["):
        assert isinstance(value, bytes)
        return value.hex()
    assert isinstance(value, int) and not isinstance(value, bool)
    if field_type == "date":
        return (_EPOCH + dt.timedelta(days=value)).isoformat()
    if field_type == "time":
        return _clock(value * 1000, digits=6)
    nanos = value if field_type in TEMPORAL_NANOS else value * 1000
    days, nanos_of_day = divmod(nanos, _NANOS_PER_DAY)
    text = f"{(_EPOCH + dt.timedelta(days=days)).isoformat()}T"
    text += _clock(nanos_of_day, digits=9 if field_type in TEMPORAL_NANOS else 6)
    return text + "+00:00" if field_type.startswith("timestamptz") else text


def _clock(nanos_of_day: int, digits: int) -> str:
    seconds, nanos = divmod(nanos_of_day, 1_000_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    fraction = f"{nanos:09d}"[:digits]
    return f"{hour:02d}:{minute:02d}:{second:02d}.{fraction}"
