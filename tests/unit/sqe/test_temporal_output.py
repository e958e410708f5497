"""Dates and timestamps in the CLI's output: written as DuckDB writes them at any value DuckDB holds, BC and past
Python's years 1 to 9999 included, with the session zone's offset for a zoned one.

The wide checks compare SQE's rendering of DuckDB's own Arrow results with DuckDB's text of the same values; the
rest run the real program (``python -m sqe.cli``) on literal SQL, as tests/unit/sqe/test_cli_output.py does.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa

from sqe.formatting import write_table
from tests.unit.sqe.test_cli_exit_paths import config

__all__ = ["config"]  # the fixture, shared with the exit-path tests

TOP = 2**63 - 1  # DuckDB's infinity; the largest finite timestamp is one less
DAY = 86_400_000_000
CYCLE = 146_097 * DAY  # 400 years


def _micros() -> list[int]:
    """Timestamps (microseconds since the epoch) over DuckDB's whole range: its ends, Python's ends, leap days
    and 400-year cycle edges, and a seeded spread."""
    rng = random.Random(20261207)
    edges = [-TOP + 1, TOP - 1, 0, -1, 1, -62135596800000000, -62135596800000001, 253402300800000000]
    edges += [253402300799999999, 951782400000000 - 1, 951782400000000 + DAY, -62162035200000000]  # 2000-02-29
    edges += [k * CYCLE + d for k in (-5, -1, 1, 700) for d in (-DAY, -1, 0, 1, DAY)]
    spread = [rng.randint(-TOP + 1, TOP - 1) for _ in range(3000)]
    return edges + spread + [rng.randint(-(10**15), 10**15) for _ in range(500)]


def _python_text(text: str, digits: int = 6) -> str:
    """DuckDB's text with a second's fraction at 6 ``digits`` (9 for nanoseconds; DuckDB drops trailing zeros,
    Python, and so SQE's JSON, keeps them) and a whole-hour offset as ``+HH:MM`` (DuckDB writes ``+HH``)."""
    text = re.sub(r"\.(\d+)", lambda m: "." + m.group(1).ljust(digits, "0"), text)
    return re.sub(r"(:\d\d(?:\.\d+)?[+-]\d\d)$", r"\1:00", text)


def _iso(sql_text: str) -> str:
    """The ISO 8601 form SQE's JSON holds for DuckDB's text of a date or timestamp: astronomical years (year 0 is
    1 BC, -1 is 2 BC), a ``T`` between date and time."""
    match = re.fullmatch(r"(\d+)(-\d\d-\d\d)( \(BC\))?(?: (.*))?", sql_text)
    assert match, sql_text
    year = int(match.group(1))
    year = 1 - year if match.group(3) else year
    date = f"{'-' if year < 0 else ''}{abs(year):04d}{match.group(2)}"
    return date if match.group(4) is None else f"{date}T{match.group(4)}"


def _rendered(table: pa.Table, fmt: str) -> list[list[str]]:
    out = io.StringIO()
    write_table(table, fmt, out)
    if fmt == "json":
        return [list(json.loads(line).values()) for line in out.getvalue().splitlines()]
    return list(csv.reader(io.StringIO(out.getvalue(), newline="")))[1:]


def _compare(statement: str, values: list[int], zone: str = "UTC", digits: int = 6) -> None:
    """``statement`` selects a value ``v`` and DuckDB's text of it ``s`` for each ``x`` of ``values``: SQE's CSV
    (the table's text) is DuckDB's text exactly, and its JSON that text in ISO form, as Python writes it."""
    with duckdb.connect() as con:
        con.execute(f"SET TimeZone = '{zone}'")
        table = con.sql(statement, params=[values]).to_arrow_table()
    expected = table.column("s").to_pylist()
    shown = [row[0] for row in _rendered(table.select(["v"]), "csv")]
    wrong = [(x, got, want) for x, got, want in zip(values, shown, expected, strict=True) if got != want]
    assert wrong == [], wrong[:5]
    as_json = [row[0] for row in _rendered(table.select(["v"]), "json")]
    iso = [_iso(_python_text(text, digits)) for text in expected]
    wrong = [(x, got, want) for x, got, want in zip(values, as_json, iso, strict=True) if got != want]
    assert wrong == [], wrong[:5]


def test_a_timestamp_at_any_value_duckdb_holds_is_written_as_duckdb_writes_it() -> None:
    """Found by review: a timestamp past Python's years (from year 294247 down to 290309 BC) was Arrow's
    ``<value out of range: N>``, and one BC was written as Arrow's negative year (``-0043-03-15 10:00:00.000000``
    for 44 BC); each is now computed from its integer, as DuckDB writes it."""
    statement = "SELECT make_timestamp(x) AS v, make_timestamp(x)::VARCHAR AS s FROM unnest($1::BIGINT[]) u(x)"
    _compare(statement, _micros())


def test_a_date_at_any_value_duckdb_holds_is_written_as_duckdb_writes_it() -> None:
    """Found by review: a BC date was written ``-0044-03-15`` (Arrow's year), not DuckDB's ``0045-03-15 (BC)``."""
    rng = random.Random(7)
    days = [-(2**31) + 2, 2**31 - 2, -719162, -719163, -719528, -719529, 2932896, 2932897, 0, -1]
    days += [rng.randint(-(2**31) + 2, 2**31 - 2) for _ in range(3000)]
    statement = "SELECT DATE '1970-01-01' + x AS v, (DATE '1970-01-01' + x)::VARCHAR AS s FROM unnest($1::INT[]) u(x)"
    _compare(statement, days)


def test_a_zoned_timestamp_has_its_zones_offset_at_any_value() -> None:
    """Found by review: a zoned timestamp past Python's years was Arrow's text in UTC with the wrong offset
    (``12000-06-30T19:00:00.000000-0500`` in New York, where July keeps daylight time, -04:00) and a colon-less
    ``+0000`` where SQE writes ``+00:00``. Its offset is now the session zone's, as DuckDB computes it, both for
    the zone's first (local mean time) offset long ago and for its yearly rule far ahead."""
    statement = (
        "SELECT make_timestamp(x)::TIMESTAMPTZ AS v, make_timestamp(x)::TIMESTAMPTZ::VARCHAR AS s"
        " FROM unnest($1::BIGINT[]) u(x)"
    )
    inner = [x for x in _micros() if abs(x) < TOP - 2 * DAY]  # the zone's shift must not pass DuckDB's ends
    _compare(statement, inner, zone="America/New_York")
    _compare(statement, inner[:200], zone="Asia/Kolkata")


def _nanos() -> tuple[list[int], list[int]]:
    """Nanosecond timestamps over DuckDB's range for them, but its last two days at either end (the session zone's
    shift must not pass them): many close together around zone changes (New York's local mean time ending in
    1883, Kathmandu's +05:30 to +05:45 in 1986 at a half hour, daylight time in 2024 and in 2100, past the zone
    files' last listed change) to the nanosecond; and a seeded spread, each in an hour of its own."""
    rng = random.Random(20261208)
    hour = 3600 * 10**9
    changes = [-2717650800, 504901800, 1710054000, 1730613600, 4108690800, 4129250400]  # seconds since the epoch
    near = [s * 10**9 + d for s in changes for d in (-hour, -(10**9), -1, 0, 1, 10**9 - 1, hour - 1, hour)]
    near += [s * 10**9 + rng.randint(-2 * hour, 2 * hour) for s in changes for _ in range(50)]
    end = TOP - 2 * 86_400 * 10**9
    return near, [0, -1, 1, -end, end] + [rng.randint(-end, end) for _ in range(2000)]


def test_a_zoned_nanosecond_timestamp_is_written_as_duckdb_writes_it() -> None:
    """A nanosecond TIMESTAMPTZ (DuckDB's TIMESTAMPTZ_NS, Iceberg's timestamptz_ns) is written with all 9
    digits and its zone's offset at that instant, in zones that change at a half hour or by odd minutes too:
    whether its zone's offset is asked once an hour (values close together) or per value (far apart)."""
    statement = (
        "SELECT make_timestamp_ns(x)::TIMESTAMPTZ_NS AS v, make_timestamp_ns(x)::TIMESTAMPTZ_NS::VARCHAR AS s"
        " FROM unnest($1::BIGINT[]) u(x)"
    )
    for values in _nanos():
        for zone in ("America/New_York", "Asia/Kathmandu", "Australia/Lord_Howe", "UTC"):
            _compare(statement, values, zone=zone, digits=9)


def _sqe(tmp_path: Path, config: Path, statement: str, fmt: str, zone: str = "UTC") -> str:
    done = subprocess.run(
        [sys.executable, "-m", "sqe.cli", "-c", str(config), "-e", statement, "-f", fmt],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
        env={**os.environ, "TZ": zone},
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout


BC_AND_FAR = (
    "SELECT DATE '-0044-03-15' AS d, TIMESTAMP '0044-03-15 (BC) 10:00:00' AS t,"
    " TIMESTAMPTZ '0044-03-15 (BC) 10:00:00+00' AS z, make_timestamp(9223372036854775806) AS far,"
    " [make_timestamp(-9223372036854775806)] AS l, TIMESTAMP_MS '100000-01-01 00:00:00.5' AS ms,"
    " TIMESTAMP_S '5000-01-01 (BC) 00:00:01' AS s"
)
BC_AND_FAR_TEXT = [
    "0045-03-15 (BC)",
    "0044-03-15 (BC) 10:00:00",
    "0044-03-15 (BC) 10:00:00+00",
    "294247-01-10 04:00:54.775806",
    "[290309-12-21 (BC) 19:59:05.224194]",
    "100000-01-01 00:00:00.5",
    "5000-01-01 (BC) 00:00:01",
]


def test_bc_and_far_dates_and_timestamps_in_every_text_format(tmp_path: Path, config: Path) -> None:
    """The program's table and CSV show a BC or far value as DuckDB does; JSON keeps ISO 8601's astronomical
    years (``-0044`` is 45 BC) with a ``T``, as it writes every other timestamp."""
    as_csv = _sqe(tmp_path, config, BC_AND_FAR, "csv")
    assert list(csv.reader(io.StringIO(as_csv, newline="")))[1] == BC_AND_FAR_TEXT
    table = _sqe(tmp_path, config, BC_AND_FAR, "table")
    assert [cell.strip() for cell in table.splitlines()[3][1:-1].split(" | ")] == BC_AND_FAR_TEXT
    assert json.loads(_sqe(tmp_path, config, BC_AND_FAR, "json")) == {
        "d": "-0044-03-15",
        "t": "-0043-03-15T10:00:00",
        "z": "-0043-03-15T10:00:00+00:00",
        "far": "294247-01-10T04:00:54.775806",
        "l": ["-290308-12-21T19:59:05.224194"],
        "ms": "100000-01-01T00:00:00.500000",
        "s": "-4999-01-01T00:00:01",
    }


def test_a_far_zoned_timestamp_in_json_has_the_session_zones_offset(tmp_path: Path, config: Path) -> None:
    """Found by review: the program wrote ``12000-06-30T19:00:00.000000-0500`` in New York for an instant DuckDB
    shows as ``12000-06-30 20:00:00-04`` (July is daylight time), and a nanosecond one ``+0000``."""
    statement = (
        "SELECT TIMESTAMPTZ '12000-07-01 00:00:00+00' AS far, TIMESTAMPTZ '2024-07-01 00:00:00+00' AS near,"
        " '2024-07-01 00:00:00.5+00'::TIMESTAMPTZ_NS AS ns"
    )
    assert json.loads(_sqe(tmp_path, config, statement, "json", zone="America/New_York")) == {
        "far": "12000-06-30T20:00:00-04:00",
        "near": "2024-06-30T20:00:00-04:00",
        "ns": "2024-06-30T20:00:00.500000000-04:00",
    }
    assert json.loads(_sqe(tmp_path, config, statement, "json")) == {
        "far": "12000-07-01T00:00:00+00:00",
        "near": "2024-07-01T00:00:00+00:00",
        "ns": "2024-07-01T00:00:00.500000000+00:00",
    }


def _round_micros() -> list[int]:
    """Microsecond timestamps over Python's years whose second's fraction ends in every count of zeros, from
    none (``.123457``) to all (a whole second), and whole hours, minutes and days."""
    rng = random.Random(20261209)
    first, last = -62135596800000000 + 2 * DAY, 253402300799999999 - 2 * DAY  # a zone's shift stays in them
    values = [rng.randint(first, last) // 10**z * 10**z for z in range(7) for _ in range(300)]
    return [*values, 0, 500_000, 120_000, 1, 10, 3_600_000_000, 60_000_000, DAY, -500_000, -DAY]


def test_a_seconds_fraction_is_written_without_trailing_zeros_as_duckdb_writes_it() -> None:
    """Found by review: SQE wrote a second's fraction with all 6 digits (9 for nanoseconds) where DuckDB drops
    its trailing zeros (``12:00:00.500000`` for ``12:00:00.5``) and a whole-hour offset as ``+00:00`` where
    DuckDB writes ``+00``. Now the table's and CSV's text is DuckDB's, for a timestamp of every unit, in zones
    whose offset has half hours or seconds; JSON keeps ISO 8601 as Python writes it."""
    values = _round_micros()
    for cast in ("TIMESTAMP", "TIMESTAMP_MS", "TIMESTAMP_S"):
        statement = f"SELECT make_timestamp(x)::{cast} AS v, make_timestamp(x)::{cast}::VARCHAR AS s"
        _compare(statement + " FROM unnest($1::BIGINT[]) u(x)", values)
    zoned = (
        "SELECT make_timestamp(x)::TIMESTAMPTZ AS v, make_timestamp(x)::TIMESTAMPTZ::VARCHAR AS s"
        " FROM unnest($1::BIGINT[]) u(x)"
    )
    for zone in ("UTC", "Asia/Kolkata", "America/New_York", "Asia/Kathmandu"):
        _compare(zoned, values, zone=zone)
    nanos = [x * 1000 + z for x in values if abs(x) < 9 * 10**15 for z in (0, 100, 120, 5)]
    statement = "SELECT make_timestamp_ns(x) AS v, make_timestamp_ns(x)::VARCHAR AS s FROM unnest($1::BIGINT[]) u(x)"
    _compare(statement, nanos, digits=9)


def test_a_time_and_an_interval_are_written_as_duckdb_writes_them() -> None:
    """Found by review: a TIME or INTERVAL's fraction kept its trailing zeros (``12:00:00.500000``), and DuckDB's
    last time of day, ``24:00:00``, came out as ``00:00:00`` (Python's time holds no 24th hour) in every format.
    The table's and CSV's text is now DuckDB's; JSON keeps a time's 6 digits (all 9 for a nanosecond one)."""
    day = [x % DAY for x in _round_micros()] + [DAY]
    with duckdb.connect() as con:
        table = con.sql(
            "SELECT v, v::VARCHAR AS s, v::TIME_NS AS n, v::TIME_NS::VARCHAR AS ns, i, i::VARCHAR AS si FROM ("
            f" SELECT CASE x WHEN {DAY} THEN TIME '24:00:00' ELSE TIME '00:00:00' + to_microseconds(x) END AS v,"
            " to_microseconds(x * 37 - 5 * x) AS i FROM unnest($1::BIGINT[]) u(x))",
            params=[day],
        ).to_arrow_table()
    assert table.column("s").to_pylist()[-1] == "24:00:00"  # DuckDB's Arrow time holds it: 86,400 s
    shown = _rendered(table.select(["v", "n", "i"]), "csv")
    expected = [list(row) for row in zip(*(table.column(c).to_pylist() for c in ("s", "ns", "si")), strict=True)]
    wrong = [(got, want) for got, want in zip(shown, expected, strict=True) if got != want]
    assert wrong == [], wrong[:5]
    as_json = _rendered(pa.table({"v": table.column("v").slice(len(day) - 1)}), "json")
    assert as_json == [["24:00:00"]]
    literal = pa.table({"t": pa.array([500_000, 0], pa.time64("us")), "n": pa.array([5 * 10**8, 0], pa.time64("ns"))})
    assert _rendered(literal, "json") == [["00:00:00.500000", "00:00:00.500000000"], ["00:00:00", "00:00:00.000000000"]]
    assert _rendered(literal, "csv") == [["00:00:00.5", "00:00:00.5"], ["00:00:00", "00:00:00"]]


def test_an_intervals_sub_microsecond_rest_is_dropped_as_duckdb_drops_it() -> None:
    """Found by review: an Arrow month_day_nano interval whose nanoseconds are less than a microsecond (but not
    zero) was written ``1 month 2 days 00:00:00`` where DuckDB, whose INTERVAL holds microseconds, writes
    ``1 month 2 days``; in JSON alike. The rest is dropped toward zero, as DuckDB drops it."""
    rng = random.Random(20261211)
    parts = [(1, 2, 3), (-1, -2, -3), (0, 5, 999), (13, 0, -999), (0, 0, 999), (0, 0, -999), (2, 0, 1_999)]
    parts += [(0, 1, -1_000_001), (-14, 3, 86_400 * 10**9 + 500)]
    parts += [(rng.randint(-30, 30), rng.randint(-30, 30), rng.randint(-(10**6), 10**6)) for _ in range(500)]
    arrow = pa.table({"v": pa.array([pa.MonthDayNano(list(p)) for p in parts], pa.month_day_nano_interval())})
    with duckdb.connect() as con:
        expected = [text for (text,) in con.sql("SELECT v::VARCHAR FROM arrow").fetchall()]
    assert expected[:2] == ["1 month 2 days", "-1 month -2 days"]
    assert [row[0] for row in _rendered(arrow, "csv")] == expected
    assert [row[0] for row in _rendered(arrow.slice(0, 2), "json")] == expected[:2]


def test_a_date64_at_any_value_is_written_as_duckdb_writes_the_date() -> None:
    """Found by review: an Arrow date64 past Python's years was Arrow's ``<value out of range: ...>`` text, in
    every format. It is now the date DuckDB reads (the milliseconds' whole days, divided toward zero), written as
    DuckDB writes it (``0045-03-15 (BC)``; JSON in ISO 8601's astronomical years), and past any date DuckDB holds
    (2**31 days) the date itself, in the same form."""
    rng = random.Random(20261210)
    ms_per_day = 86_400_000
    days = [rng.randint(-(2**31) + 2, 2**31 - 2) for _ in range(2000)] + [-719162, -719163, 2932896, 2932897, 0, -1]
    millis = [d * ms_per_day for d in days] + [5, -5, -ms_per_day - 5, 3 * ms_per_day + 7]
    millis += [rng.randint(-(2**31) * ms_per_day, 2**31 * ms_per_day) for _ in range(500)]
    arrow = pa.table({"v": pa.array(millis, pa.int64()).view(pa.date64())})
    with duckdb.connect() as con:
        expected = [text for (text,) in con.sql("SELECT v::VARCHAR FROM arrow").fetchall()]
    assert [row[0] for row in _rendered(arrow, "csv")] == expected
    assert [row[0] for row in _rendered(arrow, "json")] == [_iso(text) for text in expected]
    # DuckDB writes 2**31 - 2 days from 1970-01-01 as 5881580-07-10, and as many before as 5877642-06-25 (BC):
    # two days further, and (before) five 400-year cycles more.
    far = [2**31 * ms_per_day, -(2**31 + 146_097 * 5) * ms_per_day]
    beyond = pa.table({"v": pa.array(far, pa.int64()).view(pa.date64())})
    assert _rendered(beyond, "csv") == [["5881580-07-12"], ["5879642-06-23 (BC)"]]


NEAR = (
    "SELECT TIMESTAMP '2024-01-01 12:00:00.5' AS t, TIMESTAMPTZ '2024-01-01 12:00:00.25+00' AS z,"
    " TIME '24:00:00' AS c, '2024-01-01 12:00:00.1'::TIMESTAMP_NS AS ns, INTERVAL '1.5 seconds' AS i,"
    " [TIMESTAMP '2024-01-01 00:00:00.120'] AS l"
)


def test_the_program_writes_fractions_and_offsets_as_duckdb_in_table_and_csv(tmp_path: Path, config: Path) -> None:
    """Found by review: ``sqe -e`` wrote ``2024-01-01 12:00:00.500000`` and ``+00:00`` where DuckDB writes
    ``2024-01-01 12:00:00.5`` and ``+00``, and ``00:00:00`` for ``24:00:00``; JSON keeps ISO 8601."""
    utc = ["2024-01-01 12:00:00.5", "2024-01-01 12:00:00.25+00", "24:00:00", "2024-01-01 12:00:00.1", "00:00:01.5"]
    utc.append("[2024-01-01 00:00:00.12]")
    assert list(csv.reader(io.StringIO(_sqe(tmp_path, config, NEAR, "csv"), newline="")))[1] == utc
    table = _sqe(tmp_path, config, NEAR, "table", zone="Asia/Kolkata")
    kolkata = [*utc[:1], "2024-01-01 17:30:00.25+05:30", *utc[2:]]
    assert [cell.strip() for cell in table.splitlines()[3][1:-1].split(" | ")] == kolkata
    assert json.loads(_sqe(tmp_path, config, NEAR, "json")) == {
        "t": "2024-01-01T12:00:00.500000",
        "z": "2024-01-01T12:00:00.250000+00:00",
        "c": "24:00:00",
        "ns": "2024-01-01T12:00:00.100000000",
        "i": "00:00:01.500000",
        "l": ["2024-01-01T00:00:00.120000"],
    }
