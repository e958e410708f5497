"""The file table functions' glob matcher: DuckDB's semantics (compared with DuckDB's own ``glob()``), time
polynomial in the path for any pattern, and a cancel check between listed files."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import pyarrow.fs as pafs
import pytest

from sqe.errors import QueryError
from sqe.execution.tvf import compile_glob, expand


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("b/x/*.parquet", "b/x/a.parquet", True),
        ("b/x/*.parquet", "b/x/sub/a.parquet", False),
        ("b/x/**/*.parquet", "b/x/sub/deeper/a.parquet", True),
        ("b/x/**/*.parquet", "b/x/a.parquet", True),  # a `**` segment is any number of segments, none too
        ("b/x/**", "b/x/a/b/c", True),
        ("b/x/**", "b/x", False),  # a last `**` is at least one segment
        ("b/**/x/**/y/*", "b/1/2/x/x/y/z", True),
        ("b/**/x/**/y/*", "b/1/2/x/y", False),
        ("b/x/***", "b/x/a/b/c", False),  # only a whole-segment `**` crosses segments
        ("b/x/a**z", "b/x/a/m/z", False),
        ("b/x/a**z", "b/x/amz", True),
        ("b/x/*a*b*", "b/x/ab", True),
        ("b/x/*a*b", "b/x/aab", True),
        ("b/x/*a*b", "b/x/a/b", False),
        ("b/x/?", "b/x/a", True),
        ("b/x/?", "b/x/", False),
        ("b/x?y", "b/x/y", False),  # `?` stays in its segment
        ("b/x/part=[12]/?.csv", "b/x/part=2/a.csv", True),
        ("b/x/part=[12]/?.csv", "b/x/part=3/a.csv", False),
        ("b/x/[a-c]", "b/x/b", True),
        ("b/x/[a-c]", "b/x/d", False),
        ("b/x/[!a-c]", "b/x/d", True),
        ("b/x/[^a-c]", "b/x/^", True),  # `^` is itself, not a negation
        ("b/x[!a]y", "b/x/y", False),  # a class stays in its segment, negated or not
        ("b/x[!-a]y", "b/x/y", False),  # even when a range holds '/'
        ("b/x/[-a]", "b/x/-", True),  # '-' first or last is itself
        ("b/x/[a-]", "b/x/-", True),
        ("b/x/[\\]", "b/x/\\", True),  # no escapes: a backslash is itself
        ("b/x/\\*", "b/x/\\y", True),
        ("b/x/[a", "b/x/[a", False),  # an unclosed class matches nothing (expansion then tries the plain path)
        ("b/x/a.csv", "b/x/aXcsv", False),  # '.' is itself, not any character
        ("b/x/*", "b/x/line\nbreak", True),
        ("b/*/*/*", "b/x/y", False),
    ],
)
def test_glob_semantics(pattern: str, path: str, matches: bool) -> None:
    assert compile_glob(pattern).match(path) is matches


def test_no_pattern_makes_matching_slow() -> None:
    """The review's pattern froze ``sqe serve`` for 40 s in ``re``; here much worse ones take milliseconds, on
    paths that pass every cheap literal test first."""
    name = "b/exports/part-00000-3f2a9c1e-8d7b-4c52-a1e0-5b6f2d9e7c41-c000.snappy.parquet"
    started = time.perf_counter()
    for pattern in ("b/exports/" + "**?" * 7 + "**Z", "b/exports/" + "*?" * 30 + "Z", "b/" + "**a" * 40 + "Z"):
        glob = compile_glob(pattern)
        assert not glob.match(name)
        assert not glob.match("b/" + "a" * 2000)
    long_segments = "b/" + "a" * 30 + "/" + "a" * 30 + "Z"
    for pattern, matching in (
        ("b/" + "*a" * 30 + "*Z", "b/" + "a" * 30 + "Z"),
        ("b/" + "**/" * 30 + "a*a*a*a*Z", long_segments),
        ("b/" + "**/*a*a*a" * 20 + "Z", "b/" + "aaa/" * 19 + "aaaZ"),
        ("b/**/" + "*a*/" * 30 + "Z", "b/" + "a/" * 30 + "Z"),
    ):
        glob = compile_glob(pattern)
        assert not glob.match("b/" + "a" * 2000 + "Y")
        assert not glob.match("b/" + "a/" * 1000 + "Y")
        assert glob.match(matching)
    assert time.perf_counter() - started < 1.0


# -- DuckDB's own glob() over the same directory ---------------------------------------------------------------

# Names DuckDB's glob() lists as they are (it fails on a name with a backslash: it reads '\' as a separator).
_NAMES = ("]", "!", "^", "-", "a", "b", "z", "x", "[", "[]", "[a", "a]", "ab", "a[b", "[z-a]", "*", "?")
_NESTED = ("sub/a", "sub/z", "sub/[a", "sub/deep/a", "sub/deep/b")


@pytest.fixture(scope="module")
def names(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("glob_names")
    for name in (*_NAMES, *_NESTED):
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text("a\n1\n", encoding="utf-8")
    return base


@pytest.mark.parametrize(
    "pattern",
    [
        "[]]",  # ']' first is itself
        "[!]]",  # anything but ']'
        "[]a]",
        "[]-a]",  # a range from ']'
        "sub/[z-a]",  # a downward range matches nothing, not an error
        "[z-a]",  # ... and then the pattern may name a file
        "[z-a-b]",
        "[^a]",  # '^' is itself
        "[!a]",
        "[!ab]",
        "[]",  # ']' first is itself, so the class is unclosed: the plain file "[]"
        "[!]",
        "[",
        "[a",
        "a[b",
        "sub/[a",
        "*[a",  # an unclosed class in a glob: nothing
        "[a*",
        "[-a]",
        "[a-]",
        "[--a]",
        "[a-c-]",
        "\\a",  # a backslash escapes nothing
        "\\]",
        "\\[a",
        "?",
        "*",
        "***",
        "**",
        "**/a",
        "**/deep/a",
        "sub/**",
        "sub/**/a",
        "sub/*/**",
        "s**/a",
        "***/a",
    ],
)
def test_expansion_is_duckdbs(names: Path, pattern: str) -> None:
    listed = duckdb.connect().execute("SELECT file FROM glob(?)", [f"{names}/{pattern}"]).fetchall()
    try:
        files, _ = expand("read_csv", [f"{names}/{pattern}"], pafs.LocalFileSystem(), lambda _: None)
    except QueryError as exc:
        assert str(exc) == f"read_csv: no file matches {names}/{pattern}"
        files = []
    assert sorted(files) == sorted(row[0] for row in listed)


class _Cancelled(Exception):
    pass


def test_expansion_stops_between_files_once_cancelled(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}.csv").write_text("a\n1\n", encoding="utf-8")
    calls: list[int] = []

    def cancel_check() -> None:
        calls.append(1)
        if len(calls) > 2:
            raise _Cancelled

    with pytest.raises(_Cancelled):
        expand("read_csv", [f"{tmp_path}/*.csv"], pafs.LocalFileSystem(), lambda _: None, cancel_check)
    assert len(calls) == 3
