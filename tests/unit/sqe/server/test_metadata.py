"""Flight SQL metadata filter patterns (``sqe.server.metadata``)."""

from __future__ import annotations

import itertools
import re
import time

import pytest

from sqe.errors import QueryError
from sqe.server import metadata


def _matches(pattern: str | None, value: str) -> bool:
    return metadata._matches(metadata.like(pattern), value)


def _reference(pattern: str, value: str) -> bool:
    """LIKE by a regex: right on small inputs, exponential on the pathological ones."""
    regex = "".join("." if c == "_" else ".*" if c == "%" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.DOTALL) is not None


def test_like_patterns_match_as_flight_sql_defines_them() -> None:
    for pattern in ["", "%", "_", "a%", "%a", "a_c", "%b%", "a%c%", "%_%", "a%%c", "_%_", "ab", "%.%"]:
        for value in ["", "a", "ab", "abc", "acbc", "a.b", "bab", "aXc\n", "\nabc"]:
            assert _matches(pattern, value) == _reference(pattern, value), (pattern, value)
    for size in range(6):  # every pattern over a, b, %, _ up to 5 long, against every a/b value up to 4 long
        for chars in itertools.product("ab%_", repeat=size):
            pattern = "".join(chars)
            for value in ("".join(v) for n in range(5) for v in itertools.product("ab", repeat=n)):
                assert _matches(pattern, value) == _reference(pattern, value), (pattern, value)
    assert _matches(None, "anything")


def test_a_pathological_pattern_is_matched_quickly() -> None:
    """Found by review: ``%`` became ``.*`` in a backtracking regex, so GetDbSchemas/GetTables with a filter of
    many ``%`` and no match (``%%%…%x``) took exponential time, holding the GIL: one user's metadata call froze
    the whole server."""
    started = time.monotonic()
    assert not _matches("%" * 45 + "x", "default")  # seconds before (the rest below: hours)
    assert time.monotonic() - started < 1.0
    for pattern in ["%" * 45 + "x", "%_" * 40 + "x", "".join(itertools.repeat("%a", 40)) + "x"]:
        assert not _matches(pattern, "default_namespace")
        assert not _matches((pattern * 20)[: metadata.MAX_PATTERN_CHARS], "a" * 500)
    assert time.monotonic() - started < 1.0
    with pytest.raises(QueryError, match="at most 1024 characters"):
        metadata.like("%" * 1025)


def test_an_escaped_wildcard_matches_only_itself() -> None:
    """Found by review: no escape existed, so ``a_b`` could not be asked for without also matching ``axb``."""
    assert _matches(r"a\_b", "a_b") and not _matches(r"a\_b", "axb")
    assert _matches(r"100\%", "100%") and not _matches(r"100\%", "1000")
    assert _matches(r"a\\b", "a\\b") and not _matches(r"a\\b", "ab")
    assert _matches(r"\a%", "abc")  # an escaped ordinary character is that character
    assert _matches(r"%\_%", "x_y") and not _matches(r"%\_%", "xy")
    assert metadata.sql_info([513]).column("value").to_pylist() == ["\\"]  # advertised as SQL_SEARCH_STRING_ESCAPE
    with pytest.raises(QueryError, match="ends with the escape character"):
        metadata.like("a\\")
