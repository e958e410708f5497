"""Literal decoding per the spec's single-value JSON encoding, and the type names literals may declare."""

from __future__ import annotations

import datetime as dt
import re
import struct
import uuid
from decimal import Decimal
from typing import Any

import pytest
from pyiceberg.types import DecimalType, FixedType, IntegerType, ListType, StringType, StructType

from sqe.errors import InvalidRestrictionError, RestrictionError
from sqe.restrictions.literals import decode_literal, encode_literal, parse_type_name, type_name

EPOCH = dt.datetime(1970, 1, 1)


def micros(value: dt.datetime) -> int:
    delta = value - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@pytest.mark.parametrize(
    ("field_type", "raw", "expected"),
    [
        ("boolean", True, True),
        ("int", -(2**31), -(2**31)),
        ("int", 2**31 - 1, 2**31 - 1),
        ("long", 2**63 - 1, 2**63 - 1),
        ("double", 1.5, 1.5),
        ("float", 0.1, struct.unpack("<f", struct.pack("<f", 0.1))[0]),
        ("decimal(9,2)", "14.20", Decimal("14.20")),
        ("decimal(9,2)", "-0.05", Decimal("-0.05")),
        ("decimal(5,0)", "12345", Decimal("12345")),
        ("decimal(38,-20)", "2E+20", Decimal("2E+20")),
        ("date", "2017-11-16", (dt.date(2017, 11, 16) - dt.date(1970, 1, 1)).days),
        ("date", "1969-12-31", -1),
        ("time", "22:31:08.123456", ((22 * 60 + 31) * 60 + 8) * 1_000_000 + 123_456),
        ("time", "22:31:08", ((22 * 60 + 31) * 60 + 8) * 1_000_000),
        ("time", "22:31", (22 * 60 + 31) * 60 * 1_000_000),
        ("timestamp", "2017-11-16T22:31:08.123456", micros(dt.datetime(2017, 11, 16, 22, 31, 8, 123456))),
        ("timestamp", "1969-12-31T23:59:59.999999", -1),
        (
            "timestamptz",
            "2017-11-16T22:31:08.123456+00:00",
            micros(dt.datetime(2017, 11, 16, 22, 31, 8, 123456)),
        ),
        ("timestamp_ns", "1970-01-01T00:00:00.000000001", 1),
        (
            "timestamptz_ns",
            "2017-11-16T22:31:08.123456789+00:00",
            micros(dt.datetime(2017, 11, 16, 22, 31, 8)) * 1000 + 123456789,
        ),
        ("timestamptz_ns", "1969-12-31T23:59:59.999999999+00:00", -1),
        ("string", "iceberg", "iceberg"),
        ("string", "", ""),
        (
            "uuid",
            "f79c3e09-677c-4bbd-a479-3f349cb785e7",
            uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7").bytes,
        ),
        (
            "uuid",
            "F79C3E09-677C-4BBD-A479-3F349CB785E7",
            uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7").bytes,
        ),
        ("fixed[3]", "78797A", b"xyz"),
        ("fixed[3]", "78797a", b"xyz"),
        ("binary", "", b""),
        ("binary", "00ff", b"\x00\xff"),
    ],
)
def test_decodes_each_type_per_the_single_value_encoding(field_type: str, raw: Any, expected: Any) -> None:
    value = decode_literal(raw, field_type, "field id 1")
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("field_type", "raw", "reason"),
    [
        ("boolean", 1, "JSON boolean"),
        ("boolean", "true", "JSON boolean"),
        ("int", True, "JSON integer"),
        ("int", 1.0, "JSON integer"),
        ("int", "1", "JSON integer"),
        ("int", 2**31, "out of range"),
        ("long", 2**63, "out of range"),
        ("float", 1, "decimal point"),
        ("float", "1.0", "decimal point"),
        ("float", float("nan"), "NaN"),
        ("double", float("inf"), "NaN"),
        ("float", 1e39, "float range"),
        ("decimal(9,2)", "14.2", "scale"),
        ("decimal(9,2)", "14.200", "scale"),
        ("decimal(9,2)", 14.2, "decimal string"),
        ("decimal(9,2)", "NaN", "decimal string"),
        ("decimal(9,2)", "1,5", "decimal string"),
        ("decimal(3,2)", "14.20", "precision"),
        ("date", "2017-02-30", "calendar"),
        ("date", "20171116", "ISO date"),
        ("date", "2017-11-16T00:00:00", "ISO date"),
        ("time", "24:00:00", "time of day"),
        ("time", "22:31:08.1234567", "microseconds"),
        ("timestamp", "2017-11-16T22:31:08+00:00", "without an offset"),
        ("timestamp", "2017-11-16 22:31:08", "without an offset"),
        ("timestamptz", "2017-11-16T22:31:08", "+00:00"),
        ("timestamptz", "2017-11-16T22:31:08Z", "+00:00"),
        ("timestamptz", "2017-11-16T22:31:08-05:00", "+00:00"),
        ("timestamptz", "2017-11-16T22:31:08.000000001+00:00", "microseconds"),
        ("timestamp_ns", "2300-01-01T00:00:00", "nanosecond timestamp range"),
        ("uuid", "f79c3e09677c4bbda4793f349cb785e7", "UUID"),
        ("uuid", "{f79c3e09-677c-4bbd-a479-3f349cb785e7}", "UUID"),
        ("fixed[3]", "7879", "number of bytes"),
        ("binary", "abc", "hex"),
        ("binary", "zz", "hex"),
        ("binary", "78 79", "hex"),
        ("string", 5, "JSON string"),
    ],
)
def test_rejects_literals_that_do_not_fit(field_type: str, raw: Any, reason: str) -> None:
    with pytest.raises(InvalidRestrictionError, match=re.escape(reason)) as caught:
        decode_literal(raw, field_type, "field id 7")
    assert "field id 7" in str(caught.value)
    assert isinstance(caught.value, RestrictionError)


def test_error_messages_do_not_echo_the_literal() -> None:
    with pytest.raises(InvalidRestrictionError) as caught:
        decode_literal("secret-region-value", "date", "field id 3")
    assert "secret-region-value" not in str(caught.value)


def test_null_literal_is_rejected() -> None:
    with pytest.raises(InvalidRestrictionError, match="null literal"):
        decode_literal(None, "string", "field id 1")


@pytest.mark.parametrize("field_type", ["struct", "list", "map", "unknown", "geometry"])
def test_types_without_literals_are_rejected(field_type: str) -> None:
    with pytest.raises(InvalidRestrictionError, match="has no literals"):
        decode_literal("x", field_type, "field id 1")


@pytest.mark.parametrize(
    ("field_type", "raw"),
    [
        ("boolean", False),
        ("int", -7),
        ("long", 2**40),
        ("float", 0.5),
        ("double", -2.25),
        ("decimal(9,2)", "-14.20"),
        ("decimal(38,-20)", "2E+20"),
        ("date", "1900-02-28"),
        ("time", "00:00:00.000001"),
        ("timestamp", "1969-07-20T20:17:40.000000"),
        ("timestamptz", "2024-02-29T23:59:59.999999+00:00"),
        ("timestamp_ns", "1969-12-31T23:59:59.999999999"),
        ("timestamptz_ns", "2017-11-16T22:31:08.123456789+00:00"),
        ("string", "é😀"),
        ("uuid", "f79c3e09-677c-4bbd-a479-3f349cb785e7"),
        ("fixed[3]", "78797a"),
        ("binary", "00ff10"),
    ],
)
def test_encode_is_the_inverse_of_decode(field_type: str, raw: Any) -> None:
    value = decode_literal(raw, field_type, "f")
    encoded = encode_literal(value, field_type)
    assert encoded == raw
    assert decode_literal(encoded, field_type, "f") == value


def test_type_names_are_canonical_and_parse_back() -> None:
    assert type_name(DecimalType(9, 2)) == "decimal(9,2)"
    assert type_name(FixedType(16)) == "fixed[16]"
    assert type_name(StructType()) == "struct"
    assert type_name(ListType(1, StringType())) == "list"
    assert parse_type_name("decimal(9, 2)") == DecimalType(9, 2)
    assert parse_type_name("fixed[16]") == FixedType(16)
    assert parse_type_name("int") == IntegerType()


@pytest.mark.parametrize("name", ["struct", "list<int>", "decimal(0,1)", "fixed[0]", "INT", "varchar"])
def test_unknown_data_types_are_rejected(name: str) -> None:
    with pytest.raises(InvalidRestrictionError, match="data-type"):
        parse_type_name(name)


FULLWIDTH = {str(d): chr(0xFF10 + d) for d in range(10)}
ARABIC = {str(d): chr(0x0660 + d) for d in range(10)}


def _digits(text: str, table: dict[str, str]) -> str:
    return "".join(table.get(c, c) for c in text)


@pytest.mark.parametrize(
    ("field_type", "raw"),
    [
        ("date", _digits("2024-01-01", FULLWIDTH)),
        ("time", _digits("12:00:00", ARABIC)),
        ("timestamp", "2024-01-01T" + _digits("12", FULLWIDTH) + ":00:00"),
        ("timestamptz", "2024-01-01T00:00:00." + _digits("1", ARABIC) + "+00:00"),
        ("decimal(9,2)", _digits("12.30", ARABIC)),
        ("timestamp_ns", "2024-01-01T00:00:00.00000000" + _digits("1", ARABIC)),
    ],
)
def test_non_ascii_digits_are_not_iso_literals(field_type: str, raw: str) -> None:
    # Python's \d and int() accept any Unicode digit; the single-value encoding is ASCII only (fail closed)
    with pytest.raises(InvalidRestrictionError):
        decode_literal(raw, field_type, "field id 1")
