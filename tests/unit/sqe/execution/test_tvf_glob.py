"""The file table functions' glob matcher: README semantics (``*``, ``?``, ``[...]`` in a segment, ``**`` across),
time linear in the path for any pattern, typed errors for bad classes, and a cancel check between listed files."""

from __future__ import annotations

import time
from pathlib import Path

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
        ("b/x/**/*.parquet", "b/x/a.parquet", False),  # `**` is `.*`: the '/' after it is still needed
        ("b/x/**", "b/x/a/b/c", True),
        ("b/x/***", "b/x/a/b/c", True),  # a run of stars with `**` in it is `**`
        ("b/x/a**z", "b/x/a/m/z", True),
        ("b/x/a**z", "b/x/amz", True),
        ("b/x/?", "b/x/a", True),
        ("b/x/?", "b/x/", False),
        ("b/x?y", "b/x/y", False),  # `?` stays in its segment
        ("b/x/part=[12]/?.csv", "b/x/part=2/a.csv", True),
        ("b/x/part=[12]/?.csv", "b/x/part=3/a.csv", False),
        ("b/x/[a-c]", "b/x/b", True),
        ("b/x/[a-c]", "b/x/d", False),
        ("b/x/[!a-c]", "b/x/d", True),
        ("b/x/[^a-c]", "b/x/b", False),
        ("b/x[!a]y", "b/x/y", False),  # a class stays in its segment, negated or not
        ("b/x/[-a]", "b/x/-", True),  # '-' first or last is itself
        ("b/x/[a-]", "b/x/-", True),
        ("b/x/[\\]", "b/x/\\", True),  # no escapes: a backslash is itself
        ("b/x/[a", "b/x/[a", True),  # '[' without ']' is itself
        ("b/x/a.csv", "b/x/aXcsv", False),  # '.' is itself, not any character
        ("b/x/*", "b/x/line\nbreak", True),
        ("b/*/*/*", "b/x/y", False),
    ],
)
def test_glob_semantics(pattern: str, path: str, matches: bool) -> None:
    assert compile_glob(pattern).match(path) is matches


def test_no_pattern_makes_matching_slow() -> None:
    """The review's pattern froze ``sqe serve`` for 40 s in ``re``; here a much worse one takes milliseconds."""
    name = "b/exports/part-00000-3f2a9c1e-8d7b-4c52-a1e0-5b6f2d9e7c41-c000.snappy.parquet"
    started = time.perf_counter()
    for pattern in ("b/exports/" + "**?" * 7 + "**Z", "b/exports/" + "*?" * 30 + "Z", "b/" + "**a" * 40 + "Z"):
        glob = compile_glob(pattern)
        assert not glob.match(name)
        assert not glob.match("b/" + "a" * 2000)
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("b/x/[]x.csv", "read_csv: the glob b/x/[]x.csv has an empty character class []"),
        ("b/x/[!].csv", "read_csv: the glob b/x/[!].csv has an empty character class [!]"),
        ("b/x/[z-a].csv", "read_csv: the glob b/x/[z-a].csv has a backward range z-a in [z-a]"),
    ],
)
def test_bad_character_classes_are_query_errors(pattern: str, message: str) -> None:
    with pytest.raises(QueryError) as caught:
        compile_glob(pattern, "read_csv")
    assert str(caught.value) == message


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
