"""Rendering Arrow results as an aligned text table, CSV or JSON lines.

The table is for a terminal: control characters (escape sequences, carriage returns, bidi overrides) in names
and values are shown escaped, so data cannot rewrite the user's screen. CSV and JSON keep every value exact.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Iterator
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, TextIO

import pyarrow as pa

from sqe._text import escape_unprintable
from sqe.errors import QueryError

MAX_CELL = 60
_LIST_TYPES = (pa.ListType, pa.LargeListType, pa.FixedSizeListType, pa.ListViewType, pa.LargeListViewType)
_CSV_SPECIAL = frozenset(',"\r\n')


def write_table(table: pa.Table, fmt: str, out: TextIO) -> None:
    if fmt == "csv":
        _write_csv(table, out)
    elif fmt == "json":
        _write_json(table, out)
    else:
        out.write(render_table(table))


def render_table(table: pa.Table) -> str:
    kinds, table = table.schema.types, _readable(table)
    names = [escape_unprintable(name) for name in table.column_names]
    rows = [[_cell(v, kind) for v, kind in zip(row, kinds, strict=True)] for row in _rows(table)]
    widths = [_width(n) for n in names]
    for row in rows:
        widths = [max(w, _width(c)) for w, c in zip(widths, row, strict=True)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, _row(names, widths), line]
    out += [_row(r, widths) for r in rows]
    out.append(line)
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out) + "\n"


def _readable(table: pa.Table) -> pa.Table:
    """DuckDB exports a BIGNUM (an integer literal beyond HUGEINT, say) as an opaque blob of its storage bytes:
    shown as hex it would be a wrong number, so it becomes the number's decimal text. A nanosecond timestamp or
    time, at any depth, becomes Arrow's text of it: Python's datetime holds microseconds, and pyarrow refuses to
    hand over one whose nanoseconds are not zero."""
    for i, field in enumerate(table.schema):
        if _is_bignum(field.type):
            blobs = [blob for chunk in table.column(i).chunks for blob in chunk.storage.to_pylist()]
            values = [None if blob is None else str(_bignum(blob)) for blob in blobs]
            table = table.set_column(i, pa.field(field.name, pa.string()), pa.array(values, pa.string()))
            continue
        if isinstance(field.type, pa.UnionType):  # Arrow casts no union: its members are cast one by one
            chunks = [_union_members_as_text(chunk) for chunk in table.column(i).chunks]
            if chunks and chunks[0].type != field.type:
                table = table.set_column(i, pa.field(field.name, chunks[0].type), pa.chunked_array(chunks))
            continue
        exact = _nanoseconds_as_text(field.type)
        if exact != field.type:
            table = table.set_column(i, pa.field(field.name, exact), table.column(i).cast(exact))
    return table


def _union_members_as_text(chunk: pa.UnionArray) -> pa.Array:
    """``chunk`` with every nanosecond timestamp or time in its members as text."""
    kind, chunk = chunk.type, pa.concat_arrays([chunk])  # a copy at offset 0: from_sparse/dense ignore a slice's
    members = [chunk.field(i) for i in range(kind.num_fields)]
    exact = [member.cast(_nanoseconds_as_text(member.type)) for member in members]
    if [member.type for member in exact] == [member.type for member in members]:
        return chunk
    names, codes = [f.name for f in kind], list(kind.type_codes)
    if kind.mode == "sparse":
        return pa.UnionArray.from_sparse(chunk.type_codes, exact, names, codes)
    return pa.UnionArray.from_dense(chunk.type_codes, chunk.offsets, exact, names, codes)


def _nanoseconds_as_text(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every nanosecond timestamp or time in it as text."""
    if isinstance(kind, pa.TimestampType | pa.Time64Type) and kind.unit == "ns":
        return pa.string()
    if isinstance(kind, pa.StructType):
        return pa.struct([f.with_type(_nanoseconds_as_text(f.type)) for f in kind])
    if isinstance(kind, pa.MapType):
        key, item = kind.key_field, kind.item_field
        return pa.map_(key.with_type(_nanoseconds_as_text(key.type)), item.with_type(_nanoseconds_as_text(item.type)))
    if isinstance(kind, pa.ListType | pa.LargeListType | pa.FixedSizeListType):
        value = kind.value_field.with_type(_nanoseconds_as_text(kind.value_type))
        if isinstance(kind, pa.FixedSizeListType):
            return pa.list_(value, kind.list_size)
        return pa.large_list(value) if isinstance(kind, pa.LargeListType) else pa.list_(value)
    return kind


def _is_bignum(kind: pa.DataType) -> bool:
    return isinstance(kind, pa.OpaqueType) and (kind.vendor_name, kind.type_name) == ("DuckDB", "bignum")


def _bignum(blob: bytes) -> int:
    """DuckDB's BIGNUM layout: 3 header bytes (top bit set for >= 0), then the magnitude big-endian; every byte
    of a negative number is inverted."""
    negative = not blob[0] & 0x80
    magnitude = bytes(~b & 0xFF for b in blob[3:]) if negative else blob[3:]
    value = int.from_bytes(magnitude, "big")
    return -value if negative else value


def _rows(table: pa.Table) -> Iterator[tuple[Any, ...]]:
    """Rows by position: a result may name two columns alike (``SELECT 1 AS a, 2 AS a``)."""
    return zip(*(column.to_pylist() for column in table.columns), strict=True)


def _row(cells: list[str], widths: list[int]) -> str:
    return "| " + " | ".join(c + " " * (w - _width(c)) for c, w in zip(cells, widths, strict=True)) + " |"


def _cell(value: Any, kind: pa.DataType) -> str:
    text = escape_unprintable(_shown(value, kind))
    return text if _width(text) <= MAX_CELL else _cut(text, MAX_CELL - 1) + "…"


def _shown(value: Any, kind: pa.DataType, *, nested: bool = False) -> str:
    """A value of Arrow type ``kind`` as SQL shows it, never as a Python repr (``Decimal('1.50')``,
    ``datetime.date(...)``). Inside a list, struct or map a string is quoted, so the string 'NULL' stays apart from
    NULL. The type, not the Python value, tells a MAP (a list of tuples, or an empty list) from a LIST."""
    if value is None:
        return "NULL"
    if isinstance(kind, pa.MapType):
        key, item = kind.key_type, kind.item_type
        return "{" + ", ".join(f"{_shown(k, key, nested=True)}={_shown(v, item, nested=True)}" for k, v in value) + "}"
    if isinstance(kind, pa.StructType):
        types = {field.name: field.type for field in kind}
        shown = (f"{_shown(k, pa.string(), nested=True)}: {_shown(v, types[k], nested=True)}" for k, v in value.items())
        return "{" + ", ".join(shown) + "}"
    if isinstance(kind, _LIST_TYPES):
        return "[" + ", ".join(_shown(item, kind.value_type, nested=True) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return str(_bignum(value)) if _is_bignum(kind) else value.hex()
    if isinstance(value, str):  # or a value _readable made text: shown as its type is, unquoted
        quoted = nested and not isinstance(kind, pa.TimestampType | pa.Time64Type)
        return "'" + value.replace("'", "''") + "'" if quoted else value
    if isinstance(value, pa.MonthDayNano):
        return _interval(value)
    if isinstance(value, Decimal):
        return format(value, "f")  # every digit of its scale, as DuckDB writes it (str() gives 0E-10 for 0)
    if isinstance(value, dict | list):  # a type that does not say it nests (a UNION's members, an extension type)
        return _shown_by_value(value, nested=nested)
    return str(value)


# A type that says nothing of its values (a union of no member): they are shown by what they are.
_UNTYPED = pa.sparse_union([])


def _shown_by_value(value: dict[Any, Any] | list[Any], *, nested: bool) -> str:
    """A nested value whose type is not known, as :func:`_shown` shows it: a dict is a struct, a non-empty list of
    (key, value) tuples a map (an INTERVAL is a tuple too, never an entry), any other list a list."""
    if isinstance(value, dict):
        return _shown(value, pa.struct([pa.field(str(k), _UNTYPED) for k in value]), nested=nested)
    if isinstance(value, list) and value and all(_is_entry(item) for item in value):
        return _shown(value, pa.map_(_UNTYPED, _UNTYPED), nested=nested)
    return _shown(value, pa.list_(_UNTYPED), nested=nested)


def _is_entry(item: Any) -> bool:
    return isinstance(item, tuple) and not isinstance(item, pa.MonthDayNano)


def _interval(value: pa.MonthDayNano) -> str:
    """``1 year 2 months 3 days 04:05:06.000007``, as DuckDB writes an INTERVAL."""
    years, months = divmod(abs(value.months), 12)
    sign = "-" if value.months < 0 else ""
    parts = [f"{sign}{n} {unit}{'s' if n != 1 else ''}" for n, unit in ((years, "year"), (months, "month")) if n]
    if value.days:
        parts.append(f"{value.days} day{'s' if abs(value.days) != 1 else ''}")
    if value.nanoseconds or not parts:
        micros = abs(value.nanoseconds) // 1000
        seconds, fraction = divmod(micros, 1_000_000)
        minutes, second = divmod(seconds, 60)
        hours, minute = divmod(minutes, 60)
        clock = f"{'-' if value.nanoseconds < 0 else ''}{hours:02d}:{minute:02d}:{second:02d}"
        parts.append(clock + (f".{fraction:06d}" if fraction else ""))
    return " ".join(parts)


def _char_width(char: str) -> int:
    """Terminal columns of one printable character: East Asian wide ones take two, combining marks none."""
    if unicodedata.category(char) in ("Mn", "Me"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _width(text: str) -> int:
    return sum(_char_width(char) for char in text)


def _cut(text: str, width: int) -> str:
    """The longest start of ``text`` that fits in ``width`` terminal columns."""
    used = 0
    for i, char in enumerate(text):
        used += _char_width(char)
        if used > width:
            return text[:i]
    return text


def _write_csv(table: pa.Table, out: TextIO) -> None:
    """RFC 4180 lines; NULL is an empty field and an empty string a quoted one (``""``), as DuckDB writes them."""
    out.write(",".join(_csv_field(name) for name in table.column_names) + "\r\n")
    kinds, table = table.schema.types, _readable(table)
    for row in _rows(table):
        fields = ("" if v is None else _csv_field(_shown(v, kind)) for v, kind in zip(row, kinds, strict=True))
        out.write(",".join(fields) + "\r\n")


def _csv_field(text: str) -> str:
    if text and not any(char in text for char in _CSV_SPECIAL):
        return text
    return '"' + text.replace('"', '""') + '"'


def _write_json(table: pa.Table, out: TextIO) -> None:
    names = table.column_names
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        shown = ", ".join(repr(name) for name in repeated)
        raise QueryError(f"JSON output needs distinct column names; give {shown} an alias in the query")
    kinds, table = table.schema.types, _readable(table)
    for row in _rows(table):
        record = {k: _jsonable(v, kind) for k, v, kind in zip(names, row, kinds, strict=True)}
        out.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")


def _jsonable(value: Any, kind: pa.DataType) -> Any:
    """A value of Arrow type ``kind`` as JSON; the type tells a BIGNUM nested in a list, struct or map from a BLOB."""
    if value is None:
        return None
    if isinstance(kind, pa.MapType):  # entries written as [key, value]
        return [[_jsonable(k, kind.key_type), _jsonable(v, kind.item_type)] for k, v in value]
    if isinstance(kind, pa.StructType):
        types = {field.name: field.type for field in kind}
        return {str(k): _jsonable(v, types[k]) for k, v in value.items()}
    if isinstance(kind, _LIST_TYPES):
        return [_jsonable(v, kind.value_type) for v in value]
    if isinstance(kind, pa.TimestampType) and isinstance(value, str):  # nanoseconds, made text by _readable
        return value.replace(" ", "T", 1)  # as isoformat() writes the others
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).replace("nan", "NaN").replace("inf", "Infinity")  # JSON has no such numbers
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, bytes):
        return str(_bignum(value)) if _is_bignum(kind) else value.hex()
    if isinstance(value, pa.MonthDayNano):
        return _interval(value)
    if isinstance(value, dict):  # a type that does not say it nests (a UNION's members, an extension type)
        return {str(k): _jsonable(v, _UNTYPED) for k, v in value.items()}
    if isinstance(value, list | tuple):  # a tuple: a MAP entry, written as [key, value]
        return [_jsonable(v, _UNTYPED) for v in value]
    return value
