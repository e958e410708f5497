"""What an ORC file's footer states about its rows and their decoded size, read before any stripe is decoded.

pyiceberg reads an ORC position delete file whole into one Arrow table, its ``file_path`` strings one per row (not
dictionary-encoded): a few KiB of dictionary- and run-length-encoded stripes can decode to gigabytes. pyarrow
hands over the file's tail (``ORCReader.serialized_file_tail``: the postscript and the footer, inflated), a
protobuf message; only the few fields needed here are read, with a minimal protobuf wire reader:

- the rows: the footer's count and its stripes' (the larger: a reader reads what the stripes state);
- the decoded size: each string, varchar, char or binary column's stated total length of its values (its column
  statistics' ``sum``), and a fixed width for each value of every column (8 bytes; 16 for decimals), covering
  Arrow's offsets and fixed-width values. A string or binary column without a stated total cannot be sized and
  is refused (ORC's writers state it), unless it states no values at all (null in every row): ORC's Java writer
  then states no total, and there are no bytes to size.

Malformed bytes are :class:`ValueError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["OrcRows", "OrcStated", "stated", "stated_rows"]

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
# FileTail: 2 footer. Footer: 3 stripes, 4 types, 6 numberOfRows, 7 statistics. StripeInformation: 5 rows.
_TAIL_FOOTER, _STRIPES, _TYPES, _ROWS, _STATISTICS, _STRIPE_ROWS = 2, 3, 4, 6, 7, 5
# Type: 1 kind. ColumnStatistics: 1 numberOfValues, 4 stringStatistics (3 sum), 8 binaryStatistics (1 sum).
_KIND, _VALUES, _STRING_STATISTICS, _STRING_SUM, _BINARY_STATISTICS, _BINARY_SUM = 1, 1, 4, 3, 8, 1
_STRING, _BINARY, _DECIMAL, _VARCHAR, _CHAR = 7, 8, 14, 16, 17
_VARIABLE_WIDTH = frozenset({_STRING, _BINARY, _VARCHAR, _CHAR})
_VALUE_BYTES, _DECIMAL_BYTES = 8, 16


@dataclass(frozen=True)
class OrcStated:
    """The rows an ORC file's stripes and footer state (the larger), and the bytes its values decode to."""

    rows: int
    decoded_bytes: int


@dataclass(frozen=True)
class OrcRows:
    """The rows an ORC file's footer states, and the sum of the rows its stripes state (what a reader reads)."""

    footer: int
    stripes: int


def stated(tail: bytes) -> OrcStated:
    """What the ORC file tail ``tail`` (pyarrow's ``serialized_file_tail``) states; ValueError if malformed."""
    footer = _footer(tail)
    rows = max(footer.rows.footer, footer.rows.stripes)
    if len(footer.statistics) != len(footer.kinds):
        raise ValueError("column statistics do not match the columns")
    columns = zip(footer.kinds, footer.statistics, strict=True)
    return OrcStated(rows, sum(_column_bytes(kind, statistics, rows) for kind, statistics in columns))


def stated_rows(tail: bytes) -> OrcRows:
    """The rows the ORC file tail ``tail`` states, in its footer and in its stripes; ValueError if malformed."""
    return _footer(tail).rows


@dataclass(frozen=True)
class _Footer:
    rows: OrcRows
    kinds: list[int]
    statistics: list[bytes]


def _footer(tail: bytes) -> _Footer:
    rows, stripe_rows, kinds, statistics = 0, 0, [], []
    for number, _wire, value in _fields(_only(tail, _TAIL_FOOTER)):
        if number == _ROWS:
            rows = _int(value)
        elif number == _STRIPES:
            stripe_rows += _int(_first(_bytes(value), _STRIPE_ROWS, 0))
        elif number == _TYPES:
            kinds.append(_int(_first(_bytes(value), _KIND, 0)))
        elif number == _STATISTICS:
            statistics.append(_bytes(value))
    return _Footer(OrcRows(rows, stripe_rows), kinds, statistics)


def _column_bytes(kind: int, statistics: bytes, rows: int) -> int:
    """A column's decoded size: its values at a fixed width (at least one per row), and its stated total length
    for a string or binary column."""
    stated_values = _first(statistics, _VALUES, None)
    values = max(rows, _int(stated_values or 0))
    size = values * (_DECIMAL_BYTES if kind == _DECIMAL else _VALUE_BYTES)
    if kind in _VARIABLE_WIDTH and stated_values != 0:  # none (all null): ORC's Java writer states no total then
        which, field = (_BINARY_STATISTICS, _BINARY_SUM) if kind == _BINARY else (_STRING_STATISTICS, _STRING_SUM)
        nested = _first(statistics, which, None)
        total = None if nested is None else _first(_bytes(nested), field, None)
        if total is None:
            raise ValueError("a string or binary column states no total length")
        length = _zigzag(_int(total))
        if length < 0:
            raise ValueError("a negative total length")
        size += length
    return size


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """Each field of the protobuf message ``data``: its number, wire type and value (a varint, or the bytes of
    a length-delimited or fixed-width field)."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(data, pos)
            yield number, wire, value
            continue
        if wire == _LENGTH:
            size, pos = _varint(data, pos)
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
        else:
            raise ValueError("an unknown protobuf wire type")
        if pos + size > len(data):
            raise ValueError("a protobuf field runs past its message")
        yield number, wire, data[pos : pos + size]
        pos += size


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("a protobuf varint runs past its message")
        byte = data[pos]
        value, pos, shift = value | (byte & 0x7F) << shift, pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _first(data: bytes, wanted: int, default: int | bytes | None) -> int | bytes | None:
    return next((value for number, _wire, value in _fields(data) if number == wanted), default)


def _only(data: bytes, wanted: int) -> bytes:
    found = _first(data, wanted, None)
    if found is None:
        raise ValueError("no such field")
    return _bytes(found)


def _int(value: int | bytes | None) -> int:
    if not isinstance(value, int):
        raise ValueError("not a varint field")
    return value


def _bytes(value: int | bytes | None) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError("not a length-delimited field")
    return value


def _zigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)
