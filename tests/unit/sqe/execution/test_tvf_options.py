"""File table function options over local files: a bad option or an unreadable combination is a one-line
QueryError naming it (the CLI prints SQE's errors on one line, anything else as a traceback), and ``filename``
reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sqe.errors import QueryError
from sqe.execution.tvf import FileStream, GovernedLocations, TvfPolicy, resolve_call


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    (tmp_path / "x.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    pq.write_table(pa.table({"a": [1]}), tmp_path / "p1.parquet")
    pq.write_table(pa.table({"a": ["s"]}), tmp_path / "p2.parquet")
    (tmp_path / "part=7").mkdir()
    pq.write_table(pa.table({"a": [2]}), tmp_path / "part=7" / "p.parquet")
    return tmp_path


def _read(allowed: Path, function: str, paths: list[str], options: dict[str, Any]) -> pa.Table:
    file_format = {"read_csv": "csv", "read_parquet": "parquet", "read_json": "json"}[function]
    governed = GovernedLocations(None, ())  # type: ignore[arg-type]  # no catalog: no governed table to avoid
    source = resolve_call(function, file_format, paths, options, TvfPolicy((), (str(allowed),)), governed, None)
    return pa.RecordBatchReader.from_stream(FileStream(source)).read_all()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"skip": "abc"}, "read_csv: option skip takes a whole number of rows from 0 to 2147483647"),
        ({"skip": -3}, "read_csv: option skip takes a whole number of rows from 0 to 2147483647"),
        ({"skip": 99999999999999999999}, "read_csv: option skip takes a whole number of rows from 0 to 2147483647"),
        ({"skip": True}, "read_csv: option skip takes a whole number of rows from 0 to 2147483647"),
        ({"nullstr": 42}, "read_csv: option nullstr takes a string or a list of strings"),
        ({"nullstr": ["x", 1]}, "read_csv: option nullstr takes a string or a list of strings"),
        ({"delim": "ab"}, "read_csv: option delim takes one character"),
        ({"delim": ""}, "read_csv: option delim takes one character"),
        ({"sep": "ab"}, "read_csv: option sep takes one character"),
        ({"quote": "ab"}, "read_csv: option quote takes one character, or '' for none"),
        ({"escape": "ab"}, "read_csv: option escape takes one character, or '' for none"),
    ],
)
def test_bad_csv_options_are_one_line_query_errors(allowed: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(QueryError) as caught:
        _read(allowed, "read_csv", [f"{allowed}/x.csv"], options)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "options", [{"skip": "1", "header": False}, {"skip": 0}, {"quote": "", "escape": ""}, {"nullstr": ["2", "x"]}]
)
def test_good_csv_options_still_read(allowed: Path, options: dict[str, Any]) -> None:
    assert _read(allowed, "read_csv", [f"{allowed}/x.csv"], options).num_rows == 1


def test_union_by_name_of_incompatible_columns_names_the_option(allowed: Path) -> None:
    with pytest.raises(QueryError) as caught:
        _read(allowed, "read_parquet", [f"{allowed}/p1.parquet", f"{allowed}/p2.parquet"], {"union_by_name": True})
    message = str(caught.value)
    assert message.startswith("read_parquet: union_by_name cannot combine the files' columns: ") and "\n" not in message


def test_union_by_name_over_a_file_of_another_format_is_a_query_error(allowed: Path) -> None:
    with pytest.raises(QueryError, match=r"^read_parquet: cannot read .*x\.csv"):
        _read(allowed, "read_parquet", [f"{allowed}/x.csv", f"{allowed}/p1.parquet"], {"union_by_name": True})


@pytest.mark.parametrize("hive", [True, False])
def test_filename_adds_each_row_s_file(allowed: Path, hive: bool) -> None:
    got = _read(allowed, "read_parquet", [f"{allowed}/p1.parquet"], {"filename": True, "hive_partitioning": hive})
    assert got.to_pylist() == [{"a": 1, "filename": f"{allowed}/p1.parquet"}]
    partitioned = _read(allowed, "read_parquet", [f"{allowed}/part=*/*.parquet"], {"filename": True})
    assert partitioned.to_pylist() == [{"a": 2, "part": 7, "filename": f"{allowed}/part=7/p.parquet"}]


def test_filename_over_files_with_a_filename_column_is_refused(allowed: Path) -> None:
    pq.write_table(pa.table({"filename": ["mine"]}), allowed / "named.parquet")
    with pytest.raises(QueryError, match="option filename adds a column filename, and the files have one"):
        _read(allowed, "read_parquet", [f"{allowed}/named.parquet"], {"filename": True})
