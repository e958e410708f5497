"""Read-restrictions conformance fixtures: loading, the typed JSON row encoding, and expected-value markers.

The format is documented in ``read_restrictions/README.md``. Nothing here imports SQE's restriction code: the
expected values (SHA-256 encodings included) are computed independently with ``hashlib`` and ``struct``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
import struct
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    ListType,
    MapType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

ROOT = Path(__file__).parent / "read_restrictions"
VERSIONS = ("v1",)
_FIXTURE_KEYS = {"name", "schema", "rows", "restrictions", "restrictions_text", "query", "expected", "note"}
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Fixture:
    version: str
    file: str  # stem of the JSON file
    name: str
    schema: dict[str, Any]
    rows: list[dict[str, Any]]
    restrictions: Any  # the read-restrictions object attached for the reader (None: no entry)
    restrictions_text: str | None  # raw text instead of ``restrictions`` (malformed JSON)
    query: str
    expected: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.version}/{self.file}/{self.name}"

    @property
    def table_key(self) -> str:
        """Fixtures with equal schema and rows share one table."""
        text = json.dumps([self.schema, self.rows], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def expected_error(self) -> str | None:
        error = self.expected.get("error")
        return str(error) if error is not None else None

    @property
    def error_stage(self) -> str:
        """``save``: only the catalog can be checked (the text cannot travel inside a JSON response)."""
        return str(self.expected.get("stage", "save" if self.restrictions_text is not None else "query"))

    def iceberg_schema(self) -> Schema:
        return Schema.model_validate(self.schema)


def load_fixtures(root: Path = ROOT) -> list[Fixture]:
    """Every fixture of every version: a file's shared ``schema``/``rows`` apply to each of its ``fixtures``."""
    found: list[Fixture] = []
    for version in VERSIONS:
        for path in sorted((root / version).glob("*.json")):
            document = json.loads(path.read_text(encoding="utf-8"))
            for entry in document["fixtures"]:
                unknown = set(entry) - _FIXTURE_KEYS
                if unknown:
                    raise ValueError(f"{path.name}: fixture {entry.get('name')!r} has unknown keys {sorted(unknown)}")
                found.append(
                    Fixture(
                        version=version,
                        file=path.stem,
                        name=entry["name"],
                        schema=entry.get("schema", document.get("schema")),
                        rows=entry.get("rows", document.get("rows", [])),
                        restrictions=entry.get("restrictions"),
                        restrictions_text=entry.get("restrictions_text"),
                        query=entry["query"],
                        expected=entry["expected"],
                    )
                )
    return found


def load_known_gaps(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """Fixture id -> {"reason": str, "modes": [mode, ...]}: fixtures expected to fail (strict xfail)."""
    gaps: dict[str, dict[str, Any]] = json.loads((root / "known_gaps.json").read_text(encoding="utf-8"))
    return {key: value for key, value in gaps.items() if not key.startswith("_")}


# ----------------------------------------------------------------------------------------------------
# Rows: fixture JSON -> Arrow (input), Arrow -> canonical JSON (results)


_NANO_TIMESTAMP = re.compile(
    r"(?P<base>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(?P<fraction>\d{1,9}))?(?P<offset>[+-]\d{2}:\d{2}|Z)?"
)
_EPOCH = dt.datetime(1970, 1, 1)
NANOS_PER_SECOND = 1_000_000_000


def nanos_since_epoch(value: str, *, with_offset: bool) -> int:
    """An ISO timestamp with up to 9 fractional digits as the exact int64 Iceberg stores (no float, no datetime
    rounding). ``timestamp_ns`` is a wall-clock value without zone (nanoseconds from 1970-01-01T00:00:00, no
    offset allowed); ``timestamptz_ns`` is an instant (an offset is required and the value is stored as UTC)."""
    match = _NANO_TIMESTAMP.fullmatch(value)
    if match is None:
        raise ValueError(f"not a timestamp with at most 9 fractional digits: {value!r}")
    offset = match["offset"]
    if with_offset and offset is None:
        raise ValueError(f"timestamptz_ns row value {value!r} needs an offset")
    if not with_offset and offset is not None:
        raise ValueError(f"timestamp_ns row value {value!r} must not carry an offset")
    seconds = (dt.datetime.fromisoformat(match["base"]) - _EPOCH) // dt.timedelta(seconds=1)
    if offset not in (None, "Z"):
        sign = -1 if offset[0] == "-" else 1
        hours, minutes = int(offset[1:3]), int(offset[4:6])
        seconds -= sign * (hours * 3600 + minutes * 60)
    return seconds * NANOS_PER_SECOND + int((match["fraction"] or "").ljust(9, "0"))


def format_nanos(nanos: int, *, utc: bool) -> str:
    """The output encoding of a nanosecond timestamp: 9 fractional digits, ``+00:00`` for timestamptz_ns."""
    seconds, fraction = divmod(nanos, NANOS_PER_SECOND)
    text = (_EPOCH + dt.timedelta(seconds=seconds)).isoformat(timespec="seconds") + f".{fraction:09d}"
    return text + "+00:00" if utc else text


def decode_value(field_type: IcebergType, value: Any) -> Any:
    """A fixture row value as the Python value pyarrow expects for the Iceberg type."""
    if value is None:
        return None
    if isinstance(field_type, FloatType | DoubleType):
        return float(value) if isinstance(value, str) else value  # "NaN", "Infinity", "-Infinity"
    if isinstance(field_type, DecimalType):
        return Decimal(value)
    if isinstance(field_type, DateType):
        return dt.date.fromisoformat(value)
    if isinstance(field_type, TimeType):
        return dt.time.fromisoformat(value)
    if isinstance(field_type, TimestampNanoType):
        return nanos_since_epoch(value, with_offset=False)
    if isinstance(field_type, TimestamptzNanoType):
        return nanos_since_epoch(value, with_offset=True)
    if isinstance(field_type, TimestampType):
        return dt.datetime.fromisoformat(value)
    if isinstance(field_type, TimestamptzType):
        parsed = dt.datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            raise ValueError(f"timestamptz row value {value!r} needs an offset")
        return parsed.astimezone(dt.UTC)
    if isinstance(field_type, UUIDType):
        return uuid.UUID(value).bytes
    if isinstance(field_type, BinaryType | FixedType):
        return bytes.fromhex(value)
    if isinstance(field_type, StructType):
        return {f.name: decode_value(f.field_type, value.get(f.name)) for f in field_type.fields}
    if isinstance(field_type, ListType):
        return [decode_value(field_type.element_type, item) for item in value]
    if isinstance(field_type, MapType):
        return [(decode_value(field_type.key_type, k), decode_value(field_type.value_type, v)) for k, v in value]
    return value


def rows_to_arrow(schema: Schema, arrow_schema: pa.Schema, rows: list[dict[str, Any]]) -> pa.Table:
    decoded = [{f.name: decode_value(f.field_type, row.get(f.name)) for f in schema.columns} for row in rows]
    return pa.Table.from_pylist(decoded, schema=arrow_schema)


def encode_value(arrow_type: pa.DataType, value: Any) -> Any:
    """A result value in the canonical JSON encoding of the README."""
    if value is None:
        return None
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return ("Infinity" if value > 0 else "-Infinity") if math.isinf(value) else value
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            return value.astimezone(dt.UTC).isoformat(timespec="microseconds")
        return value.isoformat(timespec="microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.time):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if pa.types.is_struct(arrow_type):
        return {f.name: encode_value(f.type, value.get(f.name)) for f in arrow_type}
    if pa.types.is_map(arrow_type):
        return [[encode_value(arrow_type.key_type, k), encode_value(arrow_type.item_type, v)] for k, v in value]
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return [encode_value(arrow_type.value_type, item) for item in value]
    raise TypeError(f"no canonical encoding for {type(value).__name__} in a {arrow_type} column")


def _is_nano_timestamp(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(arrow_type) and arrow_type.unit == "ns")


def result_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Result rows in the output encoding; nanosecond timestamp columns are read as their exact int64 values
    (Python's datetime stops at microseconds)."""
    types = {f.name: f.type for f in table.schema}
    nano_columns = [name for name, arrow_type in types.items() if _is_nano_timestamp(arrow_type)]
    # to_pylist itself refuses sub-microsecond digits (datetime), so those columns go through int64 first.
    as_int64 = {name: table.column(name).cast(pa.int64()) for name in nano_columns}
    rows = table.drop_columns(nano_columns).to_pylist() if nano_columns else table.to_pylist()
    if not rows and table.num_rows:
        rows = [{} for _ in range(table.num_rows)]  # every column was a nanosecond timestamp
    for name in nano_columns:
        utc = types[name].tz is not None
        for row, value in zip(rows, as_int64[name].to_pylist(), strict=True):
            row[name] = None if value is None else format_nanos(value, utc=utc)
    rows = [{name: row[name] for name in types} for row in rows]  # the result's column order
    return [
        {
            name: value if _is_nano_timestamp(types[name]) else encode_value(types[name], value)
            for name, value in row.items()
        }
        for row in rows
    ]


# ----------------------------------------------------------------------------------------------------
# Expected values: markers computed here, independently of the engine


def sha256_string(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_int(value: int) -> int:
    digest = hashlib.sha256(struct.pack("<i", value)).digest()
    return int(struct.unpack("<i", digest[:4])[0])


def sha256_long(value: int) -> int:
    digest = hashlib.sha256(struct.pack("<q", value)).digest()
    return int(struct.unpack("<q", digest[:8])[0])


def sha256_binary(hex_value: str) -> str:
    return hashlib.sha256(bytes.fromhex(hex_value)).hexdigest()


_MARKERS: dict[str, Callable[[Any], Any]] = {
    "$sha256_string": sha256_string,
    "$sha256_int": sha256_int,
    "$sha256_long": sha256_long,
    "$sha256_binary": sha256_binary,
}


def _is_marker(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)).startswith("$")


def matches(expected: Any, actual: Any) -> bool:
    """``actual`` (canonical JSON) against ``expected`` (canonical JSON with markers)."""
    if _is_marker(expected):
        [(marker, argument)] = expected.items()
        if marker == "$hex64":
            return isinstance(actual, str) and _HEX64.fullmatch(actual) is not None
        return bool(actual == _MARKERS[marker](argument))
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(matches(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(matches(e, a) for e, a in zip(expected, actual, strict=True))
    return bool(expected == actual) and type(expected) is type(actual)


def resolve_markers(expected: Any) -> Any:
    """For failure messages: markers replaced by the value they stand for."""
    if _is_marker(expected):
        [(marker, argument)] = expected.items()
        return f"<{marker}>" if marker not in _MARKERS else _MARKERS[marker](argument)
    if isinstance(expected, dict):
        return {k: resolve_markers(v) for k, v in expected.items()}
    if isinstance(expected, list):
        return [resolve_markers(v) for v in expected]
    return expected


# ----------------------------------------------------------------------------------------------------
# Coverage: which (action, type) pairs the fixtures exercise


def type_label(field_type: IcebergType) -> str:
    if isinstance(field_type, DecimalType):
        return "decimal"
    if isinstance(field_type, FixedType):
        return "fixed"
    if isinstance(field_type, StructType | ListType | MapType):
        return type(field_type).__name__.removesuffix("Type").lower()
    return str(field_type)


def action_coverage(fixtures: list[Fixture]) -> Iterator[tuple[str, str]]:
    """(action, type label) for every projection of every fixture that expects rows."""
    for fixture in fixtures:
        if fixture.expected_error is not None or not isinstance(fixture.restrictions, dict):
            continue
        schema = fixture.iceberg_schema()
        for projection in fixture.restrictions.get("required-column-projections", []):
            yield projection["action"], type_label(schema.find_field(projection["field-id"]).field_type)


ALL_TYPES = (
    "boolean",
    "int",
    "long",
    "float",
    "double",
    "decimal",
    "date",
    "time",
    "timestamp",
    "timestamptz",
    "timestamp_ns",
    "timestamptz_ns",
    "string",
    "uuid",
    "fixed",
    "binary",
    "struct",
    "list",
    "map",
)
APPLICABLE: dict[str, tuple[str, ...]] = {
    "mask-alphanum": ("string",),
    "show-first-4": ("string",),
    "show-last-4": ("string",),
    "mask-to-fixed-value": ALL_TYPES,
    "replace-with-null": ALL_TYPES,
    "truncate-to-year": ("date", "timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns"),
    "truncate-to-month": ("date", "timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns"),
    "sha-256-global": ("string", "int", "long", "binary"),
    "sha-256-query-local": ("string", "int", "long", "binary"),
}
