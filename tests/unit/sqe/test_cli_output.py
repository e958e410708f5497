"""What the ``sqe`` program prints: the table format is safe on a terminal and aligned; CSV and JSON stay exact.

Each case runs the real program (``python -m sqe.cli``) in a subprocess on literal SQL: the config names a
catalog on a closed port, and no statement here reads a table.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import select
import subprocess
import sys
import uuid
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sqe.cli import FORMATS
from sqe.console import write_result
from sqe.errors import QueryError
from sqe.formatting import render_table
from sqe.session import Session
from sqe.shell import Shell, holds_secret
from tests.e2e.test_engine_tty import PROMPT, Setup, spawn
from tests.unit.sqe.iceberg_local import LocalProvider
from tests.unit.sqe.test_cli_exit_paths import _sqe, config

__all__ = ["config"]  # the fixture, shared with the exit-path tests

# ESC [31m (colour), CR (back to column 0), CSI as one C1 byte, a right-to-left override, a NUL-free BEL.
HOSTILE = "a\x1b[31mred\rX\x9b2J\u202eabc\x07"
HOSTILE_SQL = "'a' || chr(27) || '[31mred' || chr(13) || 'X' || chr(155) || '2J' || chr(8238) || 'abc' || chr(7)"
CONTROLS = ("\x1b", "\r", "\x9b", "\u202e", "\x07")


def _stdout(tmp_path: Path, *argv: str) -> str:
    """The program's stdout exactly as written (no newline translation: a carriage return stays one)."""
    done = subprocess.run(
        [sys.executable, "-m", "sqe.cli", *argv], capture_output=True, timeout=60, cwd=tmp_path, check=True
    )
    return done.stdout.decode()


def test_control_characters_in_a_value_or_a_name_are_escaped_in_the_table(tmp_path: Path, config: Path) -> None:
    statement = f'SELECT {HOSTILE_SQL} AS v, 1 AS "x{HOSTILE}"'
    out = _stdout(tmp_path, "-c", str(config), "-e", statement)
    assert not any(control in out for control in CONTROLS)
    assert "| a\\x1b[31mred\\rX\\x9b2J\\u202eabc\\x07 |" in out
    assert "| xa\\x1b[31mred\\rX\\x9b2J\\u202eabc\\x07 |" in out


def test_csv_and_json_keep_control_characters_exact(tmp_path: Path, config: Path) -> None:
    statement = f"SELECT {HOSTILE_SQL} AS v"
    as_csv = _stdout(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert list(csv.reader(io.StringIO(as_csv, newline=""))) == [["v"], [HOSTILE]]
    as_json = _stdout(tmp_path, "-c", str(config), "-e", statement, "-f", "json")
    assert json.loads(as_json) == {"v": HOSTILE}


def test_wide_and_combining_characters_keep_the_columns_aligned(tmp_path: Path, config: Path) -> None:
    statement = "SELECT '日本語' AS w, 'e' || chr(769) AS c UNION ALL SELECT 'abcdefgh', 'xy'"
    done = _sqe(tmp_path, "-c", str(config), "-e", statement)
    assert done.stdout.splitlines()[:5] == [
        "+----------+----+",
        "| w        | c  |",
        "+----------+----+",
        "| 日本語   | e\u0301  |",
        "| abcdefgh | xy |",
    ]


def test_a_long_wide_value_is_cut_to_the_cell_width(tmp_path: Path, config: Path) -> None:
    done = _sqe(tmp_path, "-c", str(config), "-e", "SELECT repeat('漢', 40) AS long")
    row = done.stdout.splitlines()[3]
    assert row == "| " + "漢" * 29 + "… |"  # 58 columns of 漢 and the ellipsis: the 60-column cell
    assert done.stdout.splitlines()[0] == "+" + "-" * 61 + "+"


def test_columns_sharing_a_name_keep_their_own_values(tmp_path: Path, config: Path) -> None:
    statement = "SELECT 1 AS a, 2 AS a, 3 AS b"
    table = _sqe(tmp_path, "-c", str(config), "-e", statement)
    assert table.returncode == 0 and "Traceback" not in table.stderr
    assert "| 1 | 2 | 3 |" in table.stdout
    as_csv = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert as_csv.stdout.splitlines() == ["a,a,b", "1,2,3"]
    as_json = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "json")
    assert as_json.returncode == 1 and as_json.stdout == ""
    expected = "sqe: error: JSON output needs distinct column names; give 'a' an alias in the query"
    assert as_json.stderr.strip() == expected


def test_an_error_echoing_a_name_with_control_characters_is_escaped(tmp_path: Path, config: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sqe.cli", "-c", str(config), "-e", 'SELECT * FROM "a\x1b[31mb\rc"'],
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 1
    [line] = done.stderr.decode().splitlines()
    assert line.startswith("sqe: error: ") and "a\\x1b[31mb" in line and "\x1b" not in line


def _piped(tmp_path: Path, config: Path, script: str) -> subprocess.CompletedProcess[str]:
    """The shell with ``script`` on stdin (a pipe, not a terminal), as ``sqe -c config < script.sql`` runs it."""
    return subprocess.run(
        [sys.executable, "-m", "sqe.cli", "-c", str(config)],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
        env={**os.environ, "SQE_HISTORY": str(tmp_path / "history")},
    )


def test_a_piped_script_with_a_failed_statement_ends_with_status_1(tmp_path: Path, config: Path) -> None:
    done = _piped(tmp_path, config, "SELECT 1 AS a;\nSELECT nosuch;\nSELECT 2 AS b;\n")
    assert done.returncode == 1
    table = "+---+\n| {0} |\n+---+\n| {1} |\n+---+\n(1 row)\n"
    assert done.stdout == table.format("a", 1) + table.format("b", 2)  # no prompts; it carried on
    [line] = done.stderr.splitlines()
    assert line.startswith("error: Binder Error: ") and "nosuch" in line


def test_a_piped_script_runs_a_last_statement_without_semicolon(tmp_path: Path, config: Path) -> None:
    done = _piped(tmp_path, config, "SELECT 1 AS a;\nSELECT 2\n  AS b")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.count("(1 row)") == 2 and "| b |" in done.stdout and "sqe>" not in done.stdout


def test_csv_tells_a_null_from_an_empty_string(tmp_path: Path, config: Path) -> None:
    out = tmp_path / "out.csv"
    statement = "SELECT NULL::VARCHAR AS n, '' AS e, 'x,\"y\"' AS q UNION ALL SELECT '', NULL, 'z'"
    done = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == b'n,e,q\r\n,"","x,""y"""\r\n"",,z\r\n'
    with duckdb.connect() as db:  # DuckDB reads a quoted "" as '' only with allow_quoted_nulls off
        read_back = db.execute(
            f"SELECT * FROM read_csv('{out}', header = true, all_varchar = true, allow_quoted_nulls = false)"
        ).fetchall()
    assert read_back == [(None, "", 'x,"y"'), ("", None, "z")]


NULL_AND_STRING = "SELECT NULL AS n, 'NULL' AS s, [NULL, 'NULL'] AS l"


def _on_a_terminal(tmp_path: Path, *argv: str, **env: str) -> bytes:
    """The program's stdout when it is a terminal (a pty's end), as it writes it: ``env`` added to its own."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sqe.cli", *argv],
            stdin=subprocess.DEVNULL,
            stdout=follower,
            stderr=subprocess.PIPE,
            timeout=60,
            cwd=tmp_path,
            check=False,
            env={**{k: v for k, v in os.environ.items() if k != "NO_COLOR"}, "TERM": "xterm", **env},
        )
    finally:
        os.close(follower)
    assert (done.returncode, done.stderr) == (0, b""), done.stderr
    written = b""
    while select.select([leader], [], [], 1)[0]:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's other end is closed: all is read
            break
        if not chunk:
            break
        written += chunk
    os.close(leader)
    return written.replace(b"\r\n", b"\n")


def test_null_and_the_string_null_differ_on_a_colour_terminal(tmp_path: Path, config: Path) -> None:
    """Found by review: NULL and the string 'NULL' were shown alike at the top level of the table. On a terminal
    a NULL is now grey, as DuckDB's CLI shows it (a string inside a list is quoted already); NO_COLOR, TERM=dumb
    and a pipe keep plain text, so a script's output is the same as before."""
    shown = _on_a_terminal(tmp_path, "-c", str(config), "-e", NULL_AND_STRING)
    assert shown.splitlines()[3] == b"| \x1b[90mNULL\x1b[0m | NULL | [NULL, 'NULL'] |"
    plain = b"| NULL | NULL | [NULL, 'NULL'] |"
    assert _on_a_terminal(tmp_path, "-c", str(config), "-e", NULL_AND_STRING, NO_COLOR="1").splitlines()[3] == plain
    assert _on_a_terminal(tmp_path, "-c", str(config), "-e", NULL_AND_STRING, TERM="dumb").splitlines()[3] == plain
    assert _stdout(tmp_path, "-c", str(config), "-e", NULL_AND_STRING).splitlines()[3] == plain.decode()


def test_null_shows_as_the_text_given_by_the_null_option(tmp_path: Path, config: Path) -> None:
    """``--null TEXT`` (DuckDB's CLI ``.nullvalue``) names the table format's NULL, so the two differ in a pipe
    too, in ``-e`` and in the shell; the text is escaped like a value, and the option is refused for a format that
    has its own NULL (CSV's empty field, JSON's null)."""
    out = _stdout(tmp_path, "-c", str(config), "-e", NULL_AND_STRING, "--null", "∅")
    assert out.splitlines()[3] == "| ∅ | NULL | [NULL, 'NULL'] |"
    out = _stdout(tmp_path, "-c", str(config), "-e", NULL_AND_STRING, "--null", "\x1b[2J")
    assert out.splitlines()[3] == "| \\x1b[2J | NULL | [NULL, 'NULL'] |"
    shell = subprocess.run(  # the shell (here a piped script) takes it too
        [sys.executable, "-m", "sqe.cli", "-c", str(config), "--null", "(null)"],
        input=NULL_AND_STRING + ";",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert shell.stdout.splitlines()[3] == "| (null) | NULL | [NULL, 'NULL'] |", shell.stderr
    refused = _sqe(tmp_path, "-c", str(config), "-e", NULL_AND_STRING, "--null", "-", "-f", "csv")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == "sqe: --null applies to the table format, not --format csv\n"


def _no_constants(name: str) -> None:
    raise AssertionError(f"not JSON: {name}")


def test_json_output_is_strict_json_for_non_finite_floats(tmp_path: Path, config: Path) -> None:
    statement = "SELECT 'nan'::DOUBLE AS f, 'inf'::DOUBLE AS i, [1.5, '-inf'::DOUBLE] AS l"
    done = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout, parse_constant=_no_constants) == {
        "f": "NaN",
        "i": "Infinity",
        "l": [1.5, "-Infinity"],
    }


def test_semicolons_inside_dollar_quoted_and_escaped_strings_do_not_split_statements(
    tmp_path: Path, config: Path
) -> None:
    statement = "SELECT $$a;b$$ AS x, $t$c';d$t$ AS y, E'it\\'s; fine' AS z; SELECT 2 AS two"
    done = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == ["x,y,z", "a;b,c';d,it's; fine", "two", "2"]


def test_a_quote_inside_a_comment_does_not_hold_the_shell_waiting(tmp_path: Path, config: Path) -> None:
    """The statement ends at its ';' although the comment before it has a lone quote: ``\\q`` then quits."""
    done = _piped(tmp_path, config, "SELECT 1 AS a -- don't\n;\n\\q\nSELECT 2 AS b;\n")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "+---+\n| a |\n+---+\n| 1 |\n+---+\n(1 row)\n"


NESTED_SQL = (
    "SELECT [TIMESTAMP '2024-01-01 10:00:00'] AS ts, [1.50::DECIMAL(4,2), NULL] AS d, "
    "{'a': DATE '2024-01-02', 'b': 'x'} AS s, MAP {'k': 1} AS m, ['NULL', NULL] AS l, true AS b, "
    "INTERVAL '14 months 3 days 04:05:06.000007' AS i"
)
NESTED_SHOWN = [
    "[2024-01-01 10:00:00]",
    "[1.50, NULL]",
    "{'a': 2024-01-02, 'b': 'x'}",
    "{'k'=1}",
    "['NULL', NULL]",
    "true",
    "1 year 2 months 3 days 04:05:06.000007",
]


def test_nested_values_intervals_and_booleans_show_as_sql_not_python(tmp_path: Path, config: Path) -> None:
    table = _sqe(tmp_path, "-c", str(config), "-e", NESTED_SQL)
    assert [cell.strip() for cell in table.stdout.splitlines()[3].split(" | ")] == [
        "| " + NESTED_SHOWN[0],
        *NESTED_SHOWN[1:-1],
        NESTED_SHOWN[-1] + " |",
    ]
    as_csv = _sqe(tmp_path, "-c", str(config), "-e", NESTED_SQL, "-f", "csv")
    assert list(csv.reader(io.StringIO(as_csv.stdout)))[1] == NESTED_SHOWN
    as_json = _sqe(tmp_path, "-c", str(config), "-e", NESTED_SQL, "-f", "json")
    assert json.loads(as_json.stdout)["i"] == NESTED_SHOWN[-1]


def test_a_semicolon_inside_a_nested_block_comment_does_not_split_the_statement(tmp_path: Path, config: Path) -> None:
    """DuckDB nests ``/* */`` comments: the ';' after the inner ``*/`` is still commented out."""
    statement = "SELECT 1 AS a /* outer /* inner */ ; still a comment */; SELECT 2 AS b"
    done = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == ["a", "1", "b", "2"]
    piped = _piped(tmp_path, config, "SELECT 3 AS c /* /* */ ; */\n;\n")  # the shell waits for the real ';'
    assert (piped.returncode, piped.stderr) == (0, "")
    assert piped.stdout == "+---+\n| c |\n+---+\n| 3 |\n+---+\n(1 row)\n"


def test_lists_of_intervals_and_maps_of_dates_render_in_every_format(tmp_path: Path, config: Path) -> None:
    """An INTERVAL is a tuple in Python, as a MAP entry is: a list of intervals was taken for a map and failed with
    an untyped ValueError in table and CSV output; JSON failed on a date or interval inside a map."""
    statement = "SELECT [INTERVAL 1 DAY, INTERVAL 2 HOUR] AS l, MAP {DATE '2024-01-02': INTERVAL 3 MONTH} AS m"
    table = _sqe(tmp_path, "-c", str(config), "-e", statement)
    assert (table.returncode, table.stderr) == (0, "")
    assert table.stdout.splitlines()[3] == "| [1 day, 02:00:00] | {2024-01-02=3 months} |"
    as_csv = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert as_csv.stdout.splitlines() == ["l,m", '"[1 day, 02:00:00]",{2024-01-02=3 months}']
    as_json = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == {"l": ["1 day", "02:00:00"], "m": [["2024-01-02", "3 months"]]}


def test_an_empty_map_shows_as_a_map_not_as_a_list(tmp_path: Path, config: Path) -> None:
    """A MAP's Python value is a list of entries, so an empty one looked like an empty LIST: the type tells them."""
    statement = "SELECT MAP {}::MAP(INT, INT) AS m, []::INT[] AS l, [MAP {}::MAP(INT, INT)] AS lm"
    table = _sqe(tmp_path, "-c", str(config), "-e", statement)
    assert table.stdout.splitlines()[3] == "| {} | [] | [{}] |"
    as_csv = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert as_csv.stdout.splitlines() == ["m,l,lm", "{},[],[{}]"]


def test_results_of_several_statements_all_reach_the_output_file_as_on_stdout(tmp_path: Path, config: Path) -> None:
    statements = "SELECT 1 AS a; SELECT 'two' AS b"
    out = tmp_path / "out.csv"
    _stdout(tmp_path, "-c", str(config), "-e", statements, "-f", "csv", "-o", str(out))
    written = out.read_bytes().decode()
    assert written == _stdout(tmp_path, "-c", str(config), "-e", statements, "-f", "csv")
    assert list(csv.reader(io.StringIO(written, newline=""))) == [["a"], ["1"], ["b"], ["two"]]
    _stdout(tmp_path, "-c", str(config), "-e", "SELECT 3 AS c", "-f", "csv", "-o", str(out))
    assert list(csv.reader(io.StringIO(out.read_bytes().decode(), newline=""))) == [["c"], ["3"]]  # a new run


def test_a_parquet_file_holds_the_last_result(tmp_path: Path, config: Path) -> None:
    out = tmp_path / "out.parquet"
    done = _sqe(tmp_path, "-c", str(config), "-e", "SELECT 1 AS a; SELECT 2 AS b", "-f", "parquet", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert duckdb.sql(f"SELECT * FROM '{out}'").fetchall() == [(2,)]  # one table: the last statement's, whole


def test_nested_values_inside_a_union_show_as_sql_not_python(tmp_path: Path, config: Path) -> None:
    """Found by review: nested values are rendered by their Arrow type, and a UNION's type does not say which member
    a row holds, so a list or struct in one came out as a Python repr (``[datetime.date(2020, 1, 1), None]``)."""
    statement = "SELECT union_value(a := [DATE '2020-01-01', NULL]) AS u, [union_value(s := {'k': MAP {1: 'x'}})] AS lu"
    table = _sqe(tmp_path, "-c", str(config), "-e", statement)
    assert (table.returncode, table.stderr) == (0, "")
    assert table.stdout.splitlines()[3] == "| [2020-01-01, NULL] | [{'k': {1='x'}}] |"
    as_csv = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert list(csv.reader(io.StringIO(as_csv.stdout))) == [["u", "lu"], ["[2020-01-01, NULL]", "[{'k': {1='x'}}]"]]


def test_a_bignum_nested_in_a_list_struct_or_map_is_its_number_in_every_format(tmp_path: Path, config: Path) -> None:
    """Found by review: only a top-level BIGNUM column became its number; one inside a list, struct or map came
    out as the hex of DuckDB's storage bytes (a wrong value) in table, CSV and JSON output alike."""
    big = "123456789012345678901234567890123456789012345678901"
    statement = f"SELECT [-{big}] AS l, {{'x': MAP {{'k': {big}}}}} AS s"
    table = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert (table.returncode, table.stderr) == (0, "")
    assert list(csv.reader(io.StringIO(table.stdout))) == [["l", "s"], [f"[-{big}]", f"{{'x': {{'k'={big}}}}}"]]
    as_json = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "json")
    assert json.loads(as_json.stdout) == {"l": [f"-{big}"], "s": {"x": [["k", big]]}}


def test_a_small_decimal_is_written_with_its_digits_not_in_exponent_notation(tmp_path: Path, config: Path) -> None:
    """Found by review: a DECIMAL went through str(), so zero at scale 10 came out as 0E-10 and 0.0000001 as
    1.000E-7 in table, CSV and JSON output; DuckDB writes every digit of the scale (0.0000000000)."""
    statement = "SELECT 0::DECIMAL(18,10) AS z, 0.0000001::DECIMAL(18,10) AS s, [0::DECIMAL(9,3)] AS l"
    as_csv = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert (as_csv.returncode, as_csv.stderr) == (0, "")
    assert as_csv.stdout.splitlines() == ["z,s,l", "0.0000000000,0.0000001000,[0.000]"]
    as_json = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "json")
    assert json.loads(as_json.stdout) == {"z": "0.0000000000", "s": "0.0000001000", "l": ["0.000"]}


def test_nanosecond_timestamps_are_written_exactly_in_every_format(tmp_path: Path, config: Path) -> None:
    """Found by review: pyarrow refuses to hand over a nanosecond timestamp whose nanoseconds are not zero as a
    Python datetime, so table, CSV and JSON output of one (top level or nested) ended in a ValueError traceback."""
    statement = (
        "SELECT '2020-01-01 00:00:00.123456789'::TIMESTAMP_NS AS t,"
        " {'k': ['2020-01-01 00:00:00.000000001'::TIMESTAMP_NS]} AS s"
    )
    table = _sqe(tmp_path, "-c", str(config), "-e", statement)
    assert (table.returncode, table.stderr) == (0, "")
    assert table.stdout.splitlines()[3] == "| 2020-01-01 00:00:00.123456789 | {'k': [2020-01-01 00:00:00.000000001]} |"
    as_csv = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert as_csv.stdout.splitlines()[1] == "2020-01-01 00:00:00.123456789,{'k': [2020-01-01 00:00:00.000000001]}"
    as_json = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "json")
    assert json.loads(as_json.stdout) == {
        "t": "2020-01-01T00:00:00.123456789",
        "s": {"k": ["2020-01-01T00:00:00.000000001"]},
    }


def test_nanosecond_timestamps_inside_a_union_are_written_exactly(tmp_path: Path, config: Path) -> None:
    """Found by review: Arrow casts no UNION, so a nanosecond member was left to pyarrow's datetime conversion and
    the output ended in a ValueError traceback."""
    statement = (
        "SELECT union_value(t := '2020-01-01 00:00:00.123456789'::TIMESTAMP_NS)::UNION(t TIMESTAMP_NS, n INT) AS u"
        " UNION ALL SELECT union_value(n := 7)"
    )
    table = _sqe(tmp_path, "-c", str(config), "-e", statement)
    assert (table.returncode, table.stderr) == (0, "")
    assert table.stdout.splitlines()[3:5] == ["| 2020-01-01 00:00:00.123456789 |", "| 7                             |"]
    as_csv = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert as_csv.stdout.splitlines() == ["u", "2020-01-01 00:00:00.123456789", "7"]


def test_a_sliced_union_column_keeps_its_values() -> None:
    """A union rebuilt from a slice's type codes and members must keep the slice's rows (pyarrow's constructors
    read a slice's buffers from their start)."""
    statement = (
        "SELECT CASE WHEN i % 2 = 0 THEN union_value(t := make_timestamp_ns(i))::UNION(t TIMESTAMP_NS, n INT)"
        " ELSE union_value(n := i::INT) END AS u FROM range(4) r(i)"
    )
    sliced = duckdb.sql(statement).to_arrow_table().slice(1, 2)
    assert render_table(sliced).splitlines()[3:5] == [
        "| 1                             |",
        "| 1970-01-01 00:00:00.000000002 |",
    ]


def test_a_backslash_is_escaped_so_escaped_text_never_reads_as_a_control_character(
    tmp_path: Path, config: Path
) -> None:
    """Found by review: the four characters ``\\x1b`` and one ESC were shown alike in the table format. A backslash
    is now doubled wherever control characters are escaped (values and names); CSV and JSON stay exact."""
    statement = "SELECT '\\x1b' AS \"t\\\", chr(27) AS e, 'a\\b' AS p"
    out = _stdout(tmp_path, "-c", str(config), "-e", statement)
    assert out.splitlines()[1] == "| t\\\\   | e    | p    |"
    assert out.splitlines()[3] == "| \\\\x1b | \\x1b | a\\\\b |"
    as_csv = _stdout(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert list(csv.reader(io.StringIO(as_csv, newline=""))) == [["t\\", "e", "p"], ["\\x1b", "\x1b", "a\\b"]]


NS = 1_577_836_800_123_456_789  # 2020-01-01 00:00:00.123456789: no Python datetime holds it
NS_TEXT = "2020-01-01 00:00:00.123456789"


def _nested_table() -> pa.Table:
    """Nanosecond timestamps (and other types the renderer treats apart) at every depth and in every container."""
    ts = pa.timestamp("ns")
    sparse = pa.UnionArray.from_sparse(
        pa.array([0, 1], pa.int8()), [pa.array([NS, None], ts), pa.array([None, 7], pa.int32())], ["t", "n"]
    )
    dense = pa.UnionArray.from_dense(
        pa.array([0, 1], pa.int8()), pa.array([0, 0], pa.int32()), [pa.array([NS], ts), pa.array(["x"])], ["t", "s"]
    )
    uuid_type = pa.uuid()
    uuids = pa.ExtensionArray.from_storage(uuid_type, pa.array([uuid.UUID(int=1).bytes], pa.binary(16)))
    return pa.table(
        {
            "lu": pa.ListArray.from_arrays(pa.array([0, 2, 2], pa.int32()), sparse, mask=pa.array([False, True])),
            "su": pa.StructArray.from_arrays([dense], ["u"]),
            "ll": pa.array([[1], []], pa.large_list(pa.time64("ns"))),
            "fl": pa.array([[NS], None], pa.list_(ts, 1)),
            "m": pa.MapArray.from_arrays(pa.array([0, 1, 1], pa.int32()), pa.array(["k"]), dense.slice(0, 1)),
            "d": pa.DictionaryArray.from_arrays(pa.array([0, None], pa.int32()), pa.array([NS], ts)),
            "r": pa.RunEndEncodedArray.from_arrays(pa.array([2], pa.int32()), pa.array([NS], ts)),
            "x": pa.ListArray.from_arrays(pa.array([0, 1, 1], pa.int32()), uuids),
            "far": pa.array([[3_000_000], [None]], pa.list_(pa.date32())),
            "dur": pa.array([5, 26 * 3600 * 10**9], pa.duration("ns")),
            "lv": pa.array([[1, 2], [3]], pa.list_view(pa.int64())),
        }
    )


NESTED_ROWS = [
    [
        f"[{NS_TEXT}, 7]",
        f"{{'u': {NS_TEXT}}}",
        "[00:00:00.000000001]",
        f"[{NS_TEXT}]",
        f"{{'k'={NS_TEXT}}}",
        NS_TEXT,
        NS_TEXT,
        "[00000000-0000-0000-0000-000000000001]",
        "[10183-09-21]",
        "00:00:00.000000005",
        "[1, 2]",
    ],
    ["", "{'u': 'x'}", "[]", "", "{}", "", NS_TEXT, "[]", "[NULL]", "26:00:00", "[3]"],
]
ISO = NS_TEXT.replace(" ", "T")
NESTED_JSON = [
    {
        "lu": [ISO, 7],
        "su": {"u": ISO},
        "ll": ["00:00:00.000000001"],
        "fl": [ISO],
        "m": [["k", ISO]],
        "d": ISO,
        "r": ISO,
        "x": ["00000000-0000-0000-0000-000000000001"],
        "far": ["10183-09-21"],
        "dur": "00:00:00.000000005",
        "lv": [1, 2],
    },
    {
        "lu": None,
        "su": {"u": "x"},
        "ll": [],
        "fl": None,
        "m": [],
        "d": None,
        "r": ISO,
        "x": [],
        "far": [None],
        "dur": "26:00:00",
        "lv": [3],
    },
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_arrow_type_at_any_depth_renders_in_every_output_format(tmp_path: Path, fmt: str) -> None:
    """Found by review: a nanosecond timestamp in a union inside a list or struct (and in a dictionary, a run-end
    encoded column, a duration, a date beyond year 9999) ended in a ValueError or OverflowError traceback."""
    table = _nested_table()
    target = tmp_path / "out"
    if fmt == "parquet":  # Parquet holds no union: one typed error line, not a traceback
        with pytest.raises(QueryError, match=r"--format parquet cannot hold column 'lu' of type list<.*union"):
            write_result(table, fmt, str(target))
        held = table.select(["ll", "fl", "d", "far", "dur", "lv"])
        write_result(held, fmt, str(target))
        assert render_table(pq.read_table(target)) == render_table(held)  # the same values, as shown
        return
    write_result(table, fmt, str(target))
    written = target.read_text(encoding="utf-8")
    if fmt == "json":
        assert [json.loads(line) for line in written.splitlines()] == NESTED_JSON
    elif fmt == "csv":
        assert list(csv.reader(io.StringIO(written, newline="")))[1:] == NESTED_ROWS
    else:
        rows = [line[2:-2].split(" | ") for line in written.splitlines()[3:5]]
        assert [[cell.rstrip() for cell in row] for row in rows] == [
            NESTED_ROWS[0],
            [cell or "NULL" for cell in NESTED_ROWS[1]],
        ]
    assert fmt in ("table", "csv", "json"), "a new output format: add its expected rendering here"


def test_a_sliced_nested_column_renders_its_own_rows() -> None:
    """Lists, fixed-size lists, list views, maps, unions and run-end encoded arrays read a slice's rows, not their
    buffers' first ones."""
    table = _nested_table().slice(1, 1)
    row = render_table(table).splitlines()[3]
    assert [cell.strip() for cell in row[1:-1].split(" | ")] == [cell or "NULL" for cell in NESTED_ROWS[1]]


# Statements carrying a credential in forms the shell's old keyword rule (secret|password|token) let into the
# history file; each holds a marker (LEAK...) that must not reach it.
LEAKING = (
    "SET s3_access_key_id = 'AKIALEAK000000000001';",
    "SET azure_storage_connection_string = 'AccountName=a;AccountKey=LEAK2';",
    "ATTACH 'host=127.0.0.1 user=root passwd=LEAK3' AS m (TYPE mysql);",
    "ATTACH 'Driver=x;Uid=u;Pwd=LEAK4' AS o;",
    "SELECT * FROM read_csv('http://alice:LEAK5@127.0.0.1:9/x.csv');",
    "SELECT * FROM read_parquet('s3://b/k.parquet?X-Amz-Credential=x&X-Amz-Signature=LEAK6');",
    "SELECT http_get('http://127.0.0.1:9', headers := MAP {'Authorization': 'Bearer LEAK7'});",
    "SELECT upper('eyJhbGciOiJIUzI1NiJ9.eyJLEAK8IjoxfQ.x') AS j;",
    "SELECT upper('ghp_LEAK9e42F292c6912E7710c838347Ae178B4a') AS t;",
)
# Statements the old rule did keep out, in forms a rule on words outside strings and comments must still catch.
CAUGHT_BEFORE = (
    "SELECT 1 AS one -- s3 key LEAK10 is my PassWord\r;",
    "CrEaTe /* LEAK11 */ SeCrEt s (TYPE s3, KEY_ID 'x');",
)


def test_the_shell_keeps_statements_with_credentials_out_of_its_history(tmp_path: Path, config: Path) -> None:
    """Found by review: the history filter looked for the words secret, password and token anywhere, so a key id,
    a MySQL passwd=, an Azure AccountKey=, a URL's user:password@, a presigned URL's signature, a Bearer header or a
    bare token given to a function reached the history file. Statements without one are kept."""
    shell = spawn(Setup(config, table="unused"), tmp_path)
    try:
        shell.wait_for(PROMPT, timeout=30)
        kept = ("SELECT 'EU' AS region, 1 AS key;", "SELECT map_keys(MAP {'k': 1}) AS primary_keys;")
        for statement in (kept[0], *LEAKING, *CAUGHT_BEFORE, kept[1]):
            shell.type(statement + "\r")
            shell.wait_for(PROMPT, timeout=30)
        shell.type("\\q\r")
        assert shell.exit_code(timeout=15) == 0, shell.text
    finally:
        shell.close()
    history = (tmp_path / "history").read_text()
    assert all(statement in history for statement in kept), history
    assert "LEAK" not in history, history


def test_infinite_and_far_timestamps_and_dates_render_in_every_format(tmp_path: Path, config: Path) -> None:
    """Found by review: DuckDB's infinite timestamps and dates, and a date past year 9999, ended in an
    OverflowError traceback; an infinity is now named as DuckDB names it, and a value past Python's years is
    written from its integer as DuckDB writes it (JSON with its ``T``)."""
    statement = (
        "SELECT 'infinity'::TIMESTAMP AS t, ['-infinity'::DATE, DATE '2020-01-02'] AS d,"
        " 'infinity'::TIMESTAMPTZ AS tz, '-infinity'::TIMESTAMP_NS AS ns, '294000-01-01'::TIMESTAMP AS far,"
        " DATE '10000-01-01' AS y"
    )
    as_csv = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "csv")
    assert (as_csv.returncode, as_csv.stderr) == (0, "")
    far = "294000-01-01 00:00:00"
    assert list(csv.reader(io.StringIO(as_csv.stdout))) == [
        ["t", "d", "tz", "ns", "far", "y"],
        ["infinity", "[-infinity, 2020-01-02]", "infinity", "-infinity", far, "10000-01-01"],
    ]
    as_json = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "json")
    assert json.loads(as_json.stdout) == {
        "t": "infinity",
        "d": ["-infinity", "2020-01-02"],
        "tz": "infinity",
        "ns": "-infinity",
        "far": "294000-01-01T00:00:00",
        "y": "10000-01-01",
    }
    table = _sqe(tmp_path, "-c", str(config), "-e", statement)
    assert (table.returncode, table.stderr) == (0, "")
    assert "| infinity | [-infinity, 2020-01-02] | infinity | -infinity |" in table.stdout


# Key-named words that name a credential (each a real option or connection-string field), and ordinary schema words
# holding "key" that name none: a statement with one of the latter stays in the history.
CREDENTIAL_KEYS = (
    "s3_access_key_id",
    "KEY_ID",
    "AccountKey",
    "SharedAccessKey",
    "api_key",
    "private_key",
    "ENCRYPTION_KEY",
    "client_key",
    "hmac_key",
    "secret_key",
    "accesskey",
    "x_api_key",
)
SCHEMA_KEYS = (
    "sort_key",
    "partition_key",
    "primary_key",
    "foreign_key",
    "lookup_key",
    "customer_key",
    "KeyName",
    "information_schema.key_column_usage",
    "key",
    "primary_keys",
)


def test_a_key_named_column_is_not_taken_for_a_credential() -> None:
    """Found by review: every word with a part "key" but KEY itself counted as a credential's name, so ordinary
    queries on sort, partition or primary keys (or information_schema.key_column_usage) never reached the history."""
    assert all(holds_secret(f"SET {name} = 'x'") for name in CREDENTIAL_KEYS)
    assert all(holds_secret(f"SELECT 1 AS {name.split('.')[-1]}") for name in CREDENTIAL_KEYS)
    kept = [name for name in SCHEMA_KEYS if holds_secret(f"SELECT {name} FROM t WHERE region = 'eu'")]
    assert kept == []


def test_the_history_leaves_out_every_credential_shape_redaction_knows_and_a_passphrase() -> None:
    """Found by review: the shell kept its own copy of three credential shapes, so a token used as a URL's whole
    userinfo, a credential header or a passphrase reached the history file although errors hid them."""
    for statement in (
        "SELECT * FROM read_csv('https://ghp_abc123@git.example/r.csv')",
        "SELECT 'X-Amz-Security-Token: FQoGZXIvYXdz'",
        "SET pgp_passphrase = 'correct horse'",
        "SELECT 'go?next=https%3A%2F%2Fu%3Apw%40host'",
        # the shapes the shell had before stay
        "SELECT 'x://u:p@h', 1",
        "SELECT 'AKIAABCDEFGHIJKLMNOP'",
        "SELECT 'x-eyJhbGci.eyJzdWIi'",
    ):
        assert holds_secret(statement), statement
    assert not holds_secret("SELECT * FROM read_csv('https://git.example/r.csv') WHERE phrase = 'pass'")


@pytest.mark.parametrize(
    ("statement", "named"),
    [
        ("SELECT 1 AS ok, [MAP {}] AS m", "column 'm' of type list<"),  # a map of DuckDB's NULL type
        ("SELECT 1 AS ok, '-infinity'::TIMESTAMP_S AS t", "this result"),  # seconds past Parquet's milliseconds
    ],
)
def test_a_result_parquet_cannot_hold_is_one_error_line(
    tmp_path: Path, config: Path, statement: str, named: str
) -> None:
    """Found by review: Parquet output turned only ArrowNotImplementedError into an error naming the column; an
    empty map's null-typed key or a seconds timestamp out of Parquet's range ended in an ArrowInvalid traceback."""
    out = tmp_path / "out.parquet"
    done = _sqe(tmp_path, "-c", str(config), "-e", statement, "-f", "parquet", "-o", str(out))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"sqe: error: --format parquet cannot hold {named}"), line
    assert not out.exists()  # no file Parquet readers would reject


def test_a_far_date_leaves_the_other_values_of_its_column_as_they_are(tmp_path: Path, config: Path) -> None:
    """Found by review: one value Python cannot hold (a date past year 9999) made its whole column Arrow's text,
    so a neighbour row's timestamp gained six zeros and its time zone lost its colon (+0000) in every format."""
    near = "(TIMESTAMP '2024-01-01 01:02:03', DATE '2024-01-01', TIMESTAMPTZ '2024-01-01 00:00:00+00')"
    far = "(TIMESTAMP '12000-01-01', DATE '12000-01-01', TIMESTAMPTZ '12000-01-01 00:00:00+00')"
    for fmt in ("csv", "json", "table"):
        rows = {}
        for values in (near, f"{near}, {far}"):  # one VALUES list: one Arrow array per column
            done = _sqe(tmp_path, "-c", str(config), "-e", f"SELECT * FROM (VALUES {values}) v(t, d, z)", "-f", fmt)
            assert done.returncode == 0, done.stderr
            rows[values] = [" ".join(line.split()) for line in done.stdout.splitlines()]  # table: padding aside
        first = {"csv": 1, "json": 0, "table": 3}[fmt]
        assert rows[f"{near}, {far}"][first] == rows[near][first]
        assert "12000-01-01" in rows[f"{near}, {far}"][first + 1]


class _ListingsWithNulls(Session):
    """A real session over the local catalog whose listings gain a column of NULLs: no listing holds one today (a
    column without a mask is ``''``), so only with one does it show whether ``\\dt`` and ``\\d`` honour --null."""

    def list_tables(self, namespace: str | None = None) -> pa.Table:
        listed = super().list_tables(namespace)
        return listed.append_column("comment", pa.nulls(listed.num_rows, pa.string()))

    def describe_table(self, name: str) -> pa.Table:
        described = super().describe_table(name)
        return described.append_column("comment", pa.nulls(described.num_rows, pa.string()))


def test_the_shells_listings_show_null_as_the_null_option_says(
    provider: LocalProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by review: ``\\dt`` and ``\\d`` wrote their listings with the table format's own ``NULL``, ignoring
    ``--null`` (and the grey NULL of a colour terminal); they are now written as a query's result is."""
    session = _ListingsWithNulls(provider)
    try:
        shell = Shell(session, null="∅")
        assert shell.command("\\dt ns") is None
        listed = capsys.readouterr().out.splitlines()
        assert "| wh        | ns        | numbers      | TABLE | ∅       |" in listed, listed
        assert shell.command("\\d ns.numbers") is None
        described = capsys.readouterr().out.splitlines()
        assert described[3].startswith("| id ") and described[3].endswith(" | ∅       |"), described
        assert not any("NULL" in line for line in listed + described)
    finally:
        session.close()


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "parquet"])
def test_prepare_and_deallocate_show_nothing(tmp_path: Path, config: Path, fmt: str) -> None:
    """PREPARE and DEALLOCATE have no result: the table format drew an empty box for each, CSV wrote a blank line
    before the header, and a Parquet file held DEALLOCATE's empty table instead of EXECUTE's rows."""
    sql = "PREPARE p AS SELECT 42 AS answer; EXECUTE p; DEALLOCATE p"
    out = tmp_path / "out.parquet"
    done = _sqe(tmp_path, "-c", str(config), "-e", sql, "-f", fmt, *(["-o", str(out)] if fmt == "parquet" else []))
    assert done.returncode == 0, done.stderr
    if fmt == "parquet":
        assert pq.read_table(out).to_pylist() == [{"answer": 42}]
    else:
        assert (
            done.stdout
            == {
                "table": "+--------+\n| answer |\n+--------+\n| 42     |\n+--------+\n(1 row)\n",
                "csv": "answer\n42\n",  # CRLF, read back as text
                "json": '{"answer": 42}\n',
            }[fmt]
        )
