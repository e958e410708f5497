"""Rendering Arrow results as an aligned text table, CSV or JSON lines.

Every value goes one way: :func:`_nodes` walks an Arrow array by its type, at any depth, into plain nodes (a
leaf's SQL text and JSON value, a list, a struct, a map), and each format writes those nodes. The walk never
raises. Dates, times and timestamps are written by Arrow's kernels, column by column, as DuckDB's VARCHAR cast
writes them: a second's fraction without trailing zeros (``12:00:00.5``), a zone's offset as ``+00``, ``+05:30``
or ``-04:56:02``. One Python's datetime cannot hold (before year 1 or after 9999) is written from its integer here,
in the same form: ``0045-03-15 (BC)``, ``294247-01-10 04:00:54.775806``. JSON holds them in ISO 8601 instead: a
fraction of 6 digits (9 for nanoseconds) when not zero, an offset as ``+HH:MM``.

The table is for a terminal: control characters (escape sequences, carriage returns, bidi overrides) in names
and values are shown escaped, and a backslash doubled, so data cannot rewrite the user's screen and escaped text
never reads as a control character. CSV and JSON keep every value exact.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TextIO, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from sqe._text import escape_for_terminal
from sqe.errors import QueryError

MAX_CELL = 60
NULL_TEXT = "NULL"  # the table format's NULL unless --null names another, as DuckDB's CLI has .nullvalue
# Select Graphic Rendition: bright black (grey), as DuckDB's CLI shows a NULL; then back to the default.
_GREY, _PLAIN = "\x1b[90m", "\x1b[0m"
_CSV_SPECIAL = frozenset(',"\r\n')
# What pyarrow raises for a value it cannot hand over or a cast it lacks: the walk then falls back to text.
_UNREADABLE = (pa.ArrowException, ValueError, TypeError, OverflowError, ArithmeticError)
# The space between a timestamp's date and time in Arrow's text of it (not in its "<value out of range: ...>").
_ISO_SEPARATOR = re.compile(r"^(-?\d+-\d\d-\d\d) ")
# The strftime format of a date and time: Arrow adds the fraction's digits of the timestamp's unit to %S.
_DATE_TIME = "%Y-%m-%d %H:%M:%S"
# Digits of a second's fraction each Arrow time unit holds.
_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}
# Python's datetime range, years 1 to 9999, in days since the epoch; a zone's shift may take a day more.
_PYTHON_DAYS = (-719162, 2932896)
# The proleptic Gregorian calendar repeats every 400 years, in days; and 0000-03-01 in days since the epoch.
_CYCLE_DAYS = 146097
_MARCH_OF_YEAR_0 = -719468
_MICROS_PER_DAY, _MILLIS_PER_DAY = 86400 * 10**6, 86400 * 10**3
_NANOS_PER_DAY = 86400 * 10**9
_INT32 = (-(2**31), 2**31 - 1)


def _python_range(unit: str, zoned: bool) -> tuple[int, int]:
    """The first and last value of Arrow time ``unit`` ("day" or a timestamp's) Python's datetime holds. For a
    nanosecond one (years 1677 to 2262), those :func:`_timestamp_leaves` writes: all but the last day at either
    end of int64, where a zone's shift would overflow."""
    first, last = (_PYTHON_DAYS[0] + 1, _PYTHON_DAYS[1] - 1) if zoned else _PYTHON_DAYS
    if unit == "day":
        return first, last
    if unit == "ns":
        return -(2**63) + _NANOS_PER_DAY, 2**63 - 1 - _NANOS_PER_DAY
    per_day = 86400 * 10 ** _DIGITS[unit]
    return first * per_day, (last + 1) * per_day - 1


@dataclass(slots=True)
class _Leaf:
    text: str  # as SQL shows it
    json: Any  # as JSON holds it
    quoted: bool = False  # a string: quoted inside a list, struct or map, so 'NULL' stays apart from NULL


@dataclass(slots=True)
class _List:
    items: list[_Node]


@dataclass(slots=True)
class _Struct:
    fields: list[tuple[str, _Node]]


@dataclass(slots=True)
class _Map:
    entries: list[tuple[_Node, _Node]]


_Node: TypeAlias = "_Leaf | _List | _Struct | _Map | None"


def write_table(table: pa.Table, fmt: str, out: TextIO, *, null: str | None = None, grey_null: bool = False) -> None:
    """``null`` and ``grey_null``: the table format's top-level NULL, see :func:`render_table`."""
    if fmt == "csv":
        _write_csv(table, out)
    elif fmt == "json":
        _write_json(table, out)
    else:
        _write_in_pieces(out, render_table(table, null=null, grey_null=grey_null))


_WRITE_PIECE_CHARS = 4096  # below a BufferedWriter's buffer: it then reports a closed pipe instead of a short write


def _write_in_pieces(out: TextIO, text: str) -> None:
    """Write ``text`` a piece at a time. CPython writes one text larger than its buffer straight to the file, and
    when the reader goes away during that write (``sqe -e ... | head``) it returns the short count without an
    error, which TextIOWrapper drops: the rest was lost and ``sqe`` ended with status 0, not SIGPIPE's 141."""
    for start in range(0, len(text), _WRITE_PIECE_CHARS):
        out.write(text[start : start + _WRITE_PIECE_CHARS])


def render_table(table: pa.Table, *, null: str | None = None, grey_null: bool = False) -> str:
    """A top-level NULL is ``null`` (``NULL`` unless given; escaped and cut like a value), and with ``grey_null``
    (a colour terminal) it is grey: as DuckDB's CLI shows its ``.nullvalue``, so NULL and the string 'NULL'
    differ at a glance."""
    names = [escape_for_terminal(name) for name in table.column_names]
    nodes = list(_rows(table))
    shown_null = _fit(escape_for_terminal(NULL_TEXT if null is None else null))
    rows = [[shown_null if node is None else _cell(node) for node in row] for row in nodes]
    widths = [_width(n) for n in names]
    for row in rows:
        widths = [max(w, _width(c)) for w, c in zip(widths, row, strict=True)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, _row(names, widths), line]
    out += [
        _row(r, widths, [n is None for n in row] if grey_null else None) for r, row in zip(rows, nodes, strict=True)
    ]
    out.append(line)
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out) + "\n"


def _rows(table: pa.Table) -> Iterator[tuple[_Node, ...]]:
    """Rows by position: a result may name two columns alike (``SELECT 1 AS a, 2 AS a``)."""
    columns = ([node for chunk in column.chunks for node in _nodes(chunk)] for column in table.columns)
    return zip(*columns, strict=True)


def _nodes(array: pa.Array) -> list[_Node]:
    """One node per value of ``array``, whatever its type and depth; never raises."""
    try:
        return _walk(array)
    except _UNREADABLE:  # a layout this walk did not foresee: Arrow's own text of each value
        return _arrow_text(array)


def _walk(array: pa.Array) -> list[_Node]:
    kind = array.type
    if isinstance(kind, pa.DictionaryType):
        values = _nodes(array.dictionary)
        return [None if i is None else values[i] for i in array.indices.to_pylist()]
    if isinstance(kind, pa.RunEndEncodedType):
        return _nodes(pc.run_end_decode(array))
    if isinstance(kind, pa.BaseExtensionType):
        return _extension(array)
    if isinstance(kind, pa.UnionType):
        return _union(array)
    if isinstance(kind, pa.StructType):
        fields = [(kind.field(i).name, _nodes(array.field(i))) for i in range(kind.num_fields)]
        return [_Struct([(name, nodes[r]) for name, nodes in fields]) if ok else None for r, ok in _valid(array)]
    if isinstance(kind, pa.MapType | pa.ListType | pa.LargeListType | pa.ListViewType | pa.LargeListViewType):
        return _lists(array)
    if isinstance(kind, pa.FixedSizeListType):
        size = kind.list_size
        items = _nodes(array.values.slice(array.offset * size, len(array) * size))
        return [_List(items[r * size : (r + 1) * size]) if ok else None for r, ok in _valid(array)]
    return _leaves(array)


def _valid(array: pa.Array) -> Iterator[tuple[int, bool]]:
    return enumerate(array.is_valid().to_pylist())


def _lists(array: pa.ListArray | pa.MapArray) -> list[_Node]:
    """Lists, list views and maps: each row's items are a range of the child array."""
    starts = array.offsets.to_pylist()
    if isinstance(array.type, pa.ListViewType | pa.LargeListViewType):
        child, ends = array.values, [s + n for s, n in zip(starts, array.sizes.to_pylist(), strict=True)]
    else:  # offsets hold one more entry than rows; only the rows' range of the child is read
        first, ends, starts = starts[0], starts[1:], starts[:-1]
        child = array.values.slice(first, ends[-1] - first if ends else 0)
        starts, ends = [s - first for s in starts], [e - first for e in ends]
    if isinstance(array.type, pa.MapType):
        keys, items = _nodes(child.field(0)), _nodes(child.field(1))
        return [
            _Map(list(zip(keys[s:e], items[s:e], strict=True))) if ok else None
            for (_, ok), s, e in zip(_valid(array), starts, ends, strict=True)
        ]
    nodes = _nodes(child)
    return [_List(nodes[s:e]) if ok else None for (_, ok), s, e in zip(_valid(array), starts, ends, strict=True)]


def _union(array: pa.UnionArray) -> list[_Node]:
    """A union's value is its member's: the type codes say which member each row holds."""
    kind = array.type
    if array.offset:  # pyarrow reads a slice's type codes (and dense offsets) from their buffers' start
        array = pa.concat_arrays([array])
    members = [_nodes(array.field(i)) for i in range(kind.num_fields)]
    member_of = {code: i for i, code in enumerate(kind.type_codes)}
    codes = array.type_codes.to_pylist()
    rows = array.offsets.to_pylist() if kind.mode == "dense" else range(len(array))
    return [members[member_of[code]][row] for code, row in zip(codes, rows, strict=True)]


def _extension(array: pa.ExtensionArray) -> list[_Node]:
    """A DuckDB BIGNUM is an opaque blob of its storage bytes, shown as its number (its hex would be a wrong one);
    a UUID as its canonical text; any other extension type as its storage."""
    kind, storage = array.type, array.storage
    if isinstance(kind, pa.OpaqueType) and (kind.vendor_name, kind.type_name) == ("DuckDB", "bignum"):
        return [None if blob is None else _text_leaf(str(_bignum(blob))) for blob in storage.to_pylist()]
    if isinstance(kind, pa.UuidType):
        return [None if raw is None else _text_leaf(str(uuid.UUID(bytes=raw))) for raw in storage.to_pylist()]
    return _nodes(storage)


def _bignum(blob: bytes) -> int:
    """DuckDB's BIGNUM layout: 3 header bytes (top bit set for >= 0), then the magnitude big-endian; every byte
    of a negative number is inverted."""
    negative = not blob[0] & 0x80
    magnitude = bytes(~b & 0xFF for b in blob[3:]) if negative else blob[3:]
    value = int.from_bytes(magnitude, "big")
    return -value if negative else value


def _leaves(array: pa.Array) -> list[_Node]:
    """Values of a type that does not nest. Dates, times and timestamps are written by Arrow's kernels, column by
    column; a duration is a clock, as DuckDB shows an INTERVAL."""
    kind = array.type
    if pa.types.is_date64(kind):
        return _date64_leaves(array)
    special = _beyond_python(array)
    if special is not None:  # the other values as usual, each of these by its name or Arrow's text
        usual = pc.if_else(pa.array([leaf is not None for leaf in special]), pa.scalar(None, kind), array)
        return [node if leaf is None else leaf for leaf, node in zip(special, _nodes(usual), strict=True)]
    if isinstance(kind, pa.DurationType):
        counts = pc.cast(array, pa.int64()).to_pylist()
        return [None if n is None else _clock_leaf(n, _DIGITS[kind.unit]) for n in counts]
    if isinstance(kind, pa.TimestampType):
        return _timestamp_leaves(array)
    if pa.types.is_date32(kind):
        return [None if t is None else _text_leaf(t) for t in pc.cast(array, pa.string()).to_pylist()]
    if pa.types.is_time(kind):
        return _time_leaves(array)
    values = array.to_pylist()
    if pa.types.is_integer(kind):  # the commonest columns, made without _leaf's tests
        return [None if value is None else _Leaf(str(value), value) for value in values]
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return [None if value is None else _Leaf(value, value, quoted=True) for value in values]
    return [None if value is None else _leaf(value) for value in values]


def _beyond_python(array: pa.Array) -> list[_Node] | None:
    """The timestamps and dates of ``array`` Python cannot hold, each as a leaf (None for every other value); None
    if it holds none. DuckDB writes an infinity as the largest value of its storage (minus it for -infinity), shown
    by its name; any other is written from its integer (:func:`_temporal`): it alone, not its whole column."""
    kind = array.type
    if isinstance(kind, pa.TimestampType):
        storage, top, unit, zone = pa.int64(), 2**63 - 1, kind.unit, kind.tz
    elif pa.types.is_date32(kind):
        storage, top, unit, zone = pa.int32(), 2**31 - 1, "day", None
    else:
        return None
    low, high = _python_range(unit, zone is not None)
    raw = array.view(storage)
    if not pc.any(pc.or_(pc.less(raw, low), pc.greater(raw, high))).as_py():
        return None
    counts = raw.to_pylist()
    beyond = [None if n is None or low <= n <= high or abs(n) == top else n for n in counts]
    names = {top: _text_leaf("infinity"), -top: _text_leaf("-infinity")}
    leaves = _temporal(beyond, unit, zone)
    return [names[n] if n is not None and abs(n) == top else leaf for n, leaf in zip(counts, leaves, strict=True)]


def _temporal(counts: list[int | None], unit: str, zone: str | None) -> list[_Node]:
    """Dates (``unit`` "day") or timestamps of ``counts`` units since the epoch, each written from its integer; a
    zoned one in ``zone`` with its offset there."""
    offsets = _zone_offsets(counts, unit, zone) if zone else [None] * len(counts)
    return [None if n is None else _temporal_leaf(n, unit, off) for n, off in zip(counts, offsets, strict=True)]


def _temporal_leaf(count: int, unit: str, offset: int | None) -> _Leaf:
    """As DuckDB writes it (``0045-03-15 (BC) 10:00:00.5+00``) for SQL; as ISO 8601 for JSON, in astronomical
    years (year 0 is 1 BC: ``-0044-03-15T10:00:00.500000+00:00``), a second's fraction of 6 digits (9 for a
    nanosecond timestamp) when not zero, as Python writes one it holds."""
    if unit == "day":
        day, clock = count, ""
    else:
        digits = _DIGITS[unit]
        shown = max(digits, 6)
        local = count + (offset or 0) * 10**digits
        day, rest = divmod(local, 86400 * 10**digits)
        clock = _clock(rest * 10 ** (shown - digits), shown)
    year, month, mday = _calendar(day)
    month_day = f"-{month:02d}-{mday:02d}"
    sql = f"{year:04d}{month_day}" if year > 0 else f"{1 - year:04d}{month_day} (BC)"
    iso = f"{'-' if year < 0 else ''}{abs(year):04d}{month_day}"
    if not clock:
        return _Leaf(sql, iso)
    sql_zone, iso_zone = ("", "") if offset is None else (_duckdb_offset_text(offset), _offset_text(offset))
    return _Leaf(f"{sql} {_trimmed(clock)}{sql_zone}", f"{iso}T{clock}{iso_zone}")


def _calendar(days: int) -> tuple[int, int, int]:
    """(year, month, day) of ``days`` since 1970-01-01 in the proleptic Gregorian calendar, exact for any integer.
    Years are counted from 1 March, so a leap day ends its year and each month's start follows one formula."""
    cycle, day = divmod(days - _MARCH_OF_YEAR_0, _CYCLE_DAYS)
    # Years into the cycle: every 4th year, but not the 100th unless the 400th, has a leap day.
    year = (day - day // 1460 + day // 36524 - day // (_CYCLE_DAYS - 1)) // 365
    day -= 365 * year + year // 4 - year // 100
    march_month = (5 * day + 2) // 153  # 0 is March, 11 February: month lengths repeat 31, 30, 31, 30, 31
    mday = day - (153 * march_month + 2) // 5 + 1
    month = march_month + 3 if march_month < 10 else march_month - 9
    return 400 * cycle + year + (month <= 2), month, mday


def _zone_offsets(counts: list[int | None], unit: str, zone: str) -> list[int | None]:
    """Each timestamp's offset from UTC in ``zone``, in seconds, as pyarrow's conversion to Python gives it.
    A moment Python cannot hold is moved by whole 400-year cycles into its years first: a zone keeps its first
    offset before its first change and repeats its yearly rule after its last, both the same a cycle away."""
    digits = _DIGITS[unit]  # to microseconds: a nanosecond count's fraction plays no part in its offset
    micros = [None if n is None else _in_python_years(_micros(n, digits)) for n in counts]
    moments = pa.array(micros, pa.timestamp("us", zone)).to_pylist()
    offsets = [None if moment is None else moment.utcoffset() for moment in moments]
    return [None if offset is None else int(offset.total_seconds()) for offset in offsets]


def _timestamp_leaves(array: pa.TimestampArray) -> list[_Node]:
    """Timestamps Python's datetime holds (for nanoseconds, all but int64's last day at either end), written as
    :func:`_temporal_leaf` writes them but by Arrow's kernels, column-wise: a million print in a second or two."""
    kind = array.type
    digits, zone = _DIGITS[kind.unit], kind.tz
    local = array.view(pa.int64())
    if zone:
        offsets = _hourly_zone_offsets(array, zone)
        local = pc.add(local, pc.multiply(offsets, 10**digits))
    if digits < 6:  # Python's 6 digits for JSON; no overflow: Python's years fit in int64 microseconds
        local = pc.multiply(local, 10 ** (6 - digits))
    shown_unit = "ns" if digits == 9 else "us"
    texts = pc.strftime(local.view(pa.timestamp(shown_unit)), format=_DATE_TIME)  # always with a fraction
    sql = _trimmed_texts(texts)
    iso = pc.replace_substring(texts, "." + "0" * _DIGITS[shown_unit], "")  # the fraction only when not zero
    iso = pc.replace_substring(iso, " ", "T", max_replacements=1)
    if zone:
        sql = _with_offsets(sql, offsets, _duckdb_offset_text)
        iso = _with_offsets(iso, offsets, _offset_text)
    return _paired_leaves(sql, iso)


def _with_offsets(texts: pa.Array, offsets: pa.Array, written: Callable[[int], str]) -> pa.Array:
    """Each of ``texts`` followed by its offset (seconds) as ``written`` writes it: once per distinct offset."""
    distinct = pc.unique(offsets)
    names = pa.array([None if n is None else written(n) for n in distinct.to_pylist()], pa.string())
    return pc.binary_join_element_wise(texts, pc.take(names, pc.index_in(offsets, distinct)), "")


def _trimmed_texts(texts: pa.Array) -> pa.Array:
    """Clocks that all have a fraction, without its trailing zeros (and its point when it is zero), as DuckDB
    writes a second's fraction: ``12:00:00.5``, ``12:00:00``."""
    return pc.utf8_rtrim(pc.utf8_rtrim(texts, characters="0"), characters=".")


def _trimmed(clock: str) -> str:
    """:func:`_trimmed_texts` of one clock, which may have no fraction."""
    return clock.rstrip("0").rstrip(".") if "." in clock else clock


def _paired_leaves(sql: pa.Array, iso: pa.Array) -> list[_Node]:
    return [None if s is None else _Leaf(s, j) for s, j in zip(sql.to_pylist(), iso.to_pylist(), strict=True)]


def _time_leaves(array: pa.Array) -> list[_Node]:
    """Times of day, column-wise, as DuckDB writes them (``12:00:00.5``, and ``24:00:00``, its last one, which
    Python's time cannot hold); JSON as ``isoformat()`` writes them, 6 digits when not zero, and a nanosecond time
    with all 9 digits always, as Arrow writes it."""
    digits = _DIGITS[array.type.unit]
    storage = pa.int32() if pa.types.is_time32(array.type) else pa.int64()
    counts = pc.cast(array.view(storage), pa.int64())
    shown = 9 if digits == 9 else 6
    texts = _clock_texts(pc.multiply(counts, 10 ** (shown - digits)), shown)
    iso = texts if shown == 9 else pc.replace_substring(texts, ".000000", "")
    return _paired_leaves(_trimmed_texts(texts), iso)


def _clock_texts(counts: pa.Array, digits: int) -> pa.Array:
    """:func:`_clock` of int64 ``counts`` of 10**-digits seconds (6 or 9 digits), column-wise, each with all
    ``digits`` of its fraction; hours past 23 too (``24:00:00``). Checked arithmetic: a count too large fails
    the column over to Arrow's text (:func:`_nodes`) rather than wrap."""
    per_hour = 3600 * 10**digits
    magnitude = pc.abs_checked(counts)
    hours = pc.divide(magnitude, per_hour)
    within_hour = pc.subtract(magnitude, pc.multiply(hours, per_hour))
    minutes = pc.strftime(within_hour.view(pa.timestamp("ns" if digits == 9 else "us")), format="%M:%S")
    sign = pc.if_else(pc.less(counts, 0), "-", "")
    hours_text = pc.binary_join_element_wise(sign, pc.utf8_lpad(pc.cast(hours, pa.string()), 2, "0"), "")
    return pc.binary_join_element_wise(hours_text, minutes, ":")


def _date64_leaves(array: pa.Array) -> list[_Node]:
    """DuckDB reads a date64 as its milliseconds' whole days (divided toward zero) in a date32, written as that
    date32 is; a day count no date32 holds (past year 5 million) from its integer, in the same form."""
    days = pc.divide(array.view(pa.int64()), _MILLIS_PER_DAY)
    beyond = pc.or_(pc.less(days, _INT32[0]), pc.greater(days, _INT32[1]))
    as_date32 = pc.if_else(beyond, pa.scalar(None, pa.int64()), days).cast(pa.int32()).view(pa.date32())
    nodes = _nodes(as_date32)
    if not pc.any(beyond).as_py():
        return nodes
    far = _temporal(pc.if_else(beyond, days, pa.scalar(None, pa.int64())).to_pylist(), "day", None)
    return [node if leaf is None else leaf for node, leaf in zip(nodes, far, strict=True)]


def _hourly_zone_offsets(array: pa.TimestampArray, zone: str) -> pa.Array:
    """:func:`_zone_offsets` of timestamps, asked once per hour they fall in where ``zone``'s offset is the same
    at that hour's start and end (no zone changes its offset twice within an hour), else per value in that hour;
    per value throughout when they fall in hours of their own.
    Arrow's own zone kernels are not asked: they keep the last offset after 2037, where DST rules go on."""
    unit = array.type.unit
    raw = array.view(pa.int64())
    starts = pc.floor_temporal(array.view(pa.timestamp(unit)), unit="hour").view(pa.int64())
    hours = pc.unique(starts).drop_null().to_pylist()
    if 2 * len(hours) >= len(array) - array.null_count:  # sparse: asking per value is less work
        return pa.array(_zone_offsets(raw.to_pylist(), unit, zone), pa.int64())
    first = _zone_offsets(hours, unit, zone)
    last = _zone_offsets([h + 3600 * 10 ** _DIGITS[unit] - 1 for h in hours], unit, zone)
    steady = pa.array([a if a == b else None for a, b in zip(first, last, strict=True)], pa.int64())
    offsets = pc.take(steady, pc.index_in(starts, pa.array(hours, pa.int64())))
    uneven = pc.and_(pc.is_null(offsets), array.is_valid())
    if not pc.any(uneven).as_py():
        return offsets
    each = _zone_offsets(pc.filter(raw, uneven).to_pylist(), unit, zone)
    return pc.replace_with_mask(offsets, uneven, pa.array(each, pa.int64()))


def _micros(count: int, digits: int) -> int:
    """``count`` units of 10**-digits seconds in whole microseconds, rounded down."""
    scale: int = 10 ** abs(6 - digits)
    return count * scale if digits <= 6 else count // scale


def _in_python_years(micros: int) -> int:
    """``micros`` since the epoch moved by whole 400-year cycles to between years 2 and 9998."""
    cycle = _CYCLE_DAYS * _MICROS_PER_DAY
    low, high = (_PYTHON_DAYS[0] + 366) * _MICROS_PER_DAY, (_PYTHON_DAYS[1] - 366) * _MICROS_PER_DAY
    if micros < low:
        return micros + -((micros - low) // cycle) * cycle
    if micros > high:
        return micros - -((high - micros) // cycle) * cycle
    return micros


def _offset_text(seconds: int) -> str:
    """``+HH:MM``, and ``:SS`` when not zero, as Python (and so JSON) writes a UTC offset."""
    minutes, second = divmod(abs(seconds), 60)
    hour, minute = divmod(minutes, 60)
    return f"{'-' if seconds < 0 else '+'}{hour:02d}:{minute:02d}" + (f":{second:02d}" if second else "")


def _duckdb_offset_text(seconds: int) -> str:
    """``+HH``, with ``:MM`` and ``:SS`` only as far as needed, as DuckDB writes a UTC offset (``+00``,
    ``+05:30``, ``-04:56:02``)."""
    text = _offset_text(seconds)
    return text[:3] if seconds % 3600 == 0 else text


def _arrow_text(array: pa.Array) -> list[_Node]:
    """Arrow's text of each value: for a value Python cannot hold. A timestamp's JSON is ISO 8601, as
    ``isoformat()`` writes the others."""
    try:
        texts = pc.cast(array, pa.string()).to_pylist()
    except _UNREADABLE:
        texts = [None if valid is False else f"<{array.type}>" for valid in _validity(array)]
    iso = isinstance(array.type, pa.TimestampType)
    return [None if t is None else _Leaf(t, _ISO_SEPARATOR.sub(r"\1T", t) if iso else t) for t in texts]


def _validity(array: pa.Array) -> list[bool | None]:
    try:
        return list(array.is_valid().to_pylist())
    except _UNREADABLE:  # a type with no validity of its own: every value is shown
        return [True] * len(array)


def _leaf(value: Any) -> _Leaf:
    """A Python value of a type that does not nest as a leaf: as SQL shows it, never as a Python repr
    (``Decimal('1.50')``). Dates, times and timestamps never come here: :func:`_leaves` writes them column-wise."""
    if isinstance(value, bool):
        return _Leaf("true" if value else "false", value)
    if isinstance(value, float) and not math.isfinite(value):
        return _Leaf(str(value), str(value).replace("nan", "NaN").replace("inf", "Infinity"))  # JSON has no such
    if isinstance(value, int | float):
        return _Leaf(str(value), value)
    if isinstance(value, str):
        return _Leaf(value, value, quoted=True)
    if isinstance(value, bytes):
        return _text_leaf(value.hex())
    if isinstance(value, Decimal):
        return _text_leaf(format(value, "f"))  # every digit of its scale, as DuckDB writes it (not 0E-10)
    if isinstance(value, pa.MonthDayNano):  # its clock, last, trimmed as DuckDB writes it; JSON keeps 6 digits
        text = _interval(value)
        return _Leaf(_trimmed(text), text)
    return _text_leaf(str(value))


def _text_leaf(text: str) -> _Leaf:
    return _Leaf(text, text)


def _interval(value: pa.MonthDayNano) -> str:
    """``1 year 2 months 3 days 04:05:06.000007``, as DuckDB writes an INTERVAL."""
    years, months = divmod(abs(value.months), 12)
    sign = "-" if value.months < 0 else ""
    parts = [f"{sign}{n} {unit}{'s' if n != 1 else ''}" for n, unit in ((years, "year"), (months, "month")) if n]
    if value.days:
        parts.append(f"{value.days} day{'s' if abs(value.days) != 1 else ''}")
    # DuckDB's INTERVAL holds microseconds: it drops a sub-microsecond rest (toward zero), and with it a clock
    # that is then zero (``1 month``, not ``1 month 00:00:00``).
    micros = abs(value.nanoseconds) // 1000
    if micros or not parts:
        parts.append(_clock(-micros if value.nanoseconds < 0 else micros, 6))
    return " ".join(parts)


def _clock(count: int, digits: int) -> str:
    """``count`` units of 10**-digits seconds as ``[-]HH:MM:SS[.fraction]``; the fraction only when not zero."""
    seconds, fraction = divmod(abs(count), 10**digits)
    minutes, second = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    clock = f"{'-' if count < 0 else ''}{hours:02d}:{minute:02d}:{second:02d}"
    return clock + (f".{fraction:0{digits}d}" if fraction else "")


def _clock_leaf(count: int, digits: int) -> _Leaf:
    """A duration or an interval's time: trimmed as DuckDB writes an INTERVAL (``00:00:01.5``); JSON keeps every
    digit of its unit."""
    clock = _clock(count, digits)
    return _Leaf(_trimmed(clock), clock)


def _shown(node: _Node, *, nested: bool = False) -> str:
    """A node as SQL shows it: ``[1.50, NULL]``, ``{'a': 'x'}``, ``{'k'=1}``."""
    if node is None:
        return "NULL"
    if isinstance(node, _Leaf):
        return _quote(node.text) if nested and node.quoted else node.text
    if isinstance(node, _List):
        return "[" + ", ".join(_shown(item, nested=True) for item in node.items) + "]"
    if isinstance(node, _Struct):
        return "{" + ", ".join(f"{_quote(name)}: {_shown(v, nested=True)}" for name, v in node.fields) + "}"
    return "{" + ", ".join(f"{_shown(k, nested=True)}={_shown(v, nested=True)}" for k, v in node.entries) + "}"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _jsonable(node: _Node) -> Any:
    """A node as JSON: a map's entries are written as ``[key, value]`` (a key need not be a string)."""
    if node is None:
        return None
    if isinstance(node, _Leaf):
        return node.json
    if isinstance(node, _List):
        return [_jsonable(item) for item in node.items]
    if isinstance(node, _Struct):
        return {name: _jsonable(v) for name, v in node.fields}
    return [[_jsonable(k), _jsonable(v)] for k, v in node.entries]


def _row(cells: Sequence[str], widths: list[int], grey: Sequence[bool] | None = None) -> str:
    """Cells padded to ``widths``; each ``grey`` one wrapped in the terminal's grey (which takes no column)."""
    painted = [f"{_GREY}{c}{_PLAIN}" if grey and grey[i] else c for i, c in enumerate(cells)]
    padded = (p + " " * (w - _width(c)) for p, c, w in zip(painted, cells, widths, strict=True))
    return "| " + " | ".join(padded) + " |"


def _cell(node: _Node) -> str:
    return _fit(escape_for_terminal(_shown(node)))


def _fit(text: str) -> str:
    return text if _width(text) <= MAX_CELL else _cut(text, MAX_CELL - 1) + "…"


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
    for row in _rows(table):
        out.write(",".join("" if node is None else _csv_field(_shown(node)) for node in row) + "\r\n")


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
    for row in _rows(table):
        record = {name: _jsonable(node) for name, node in zip(names, row, strict=True)}
        out.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
