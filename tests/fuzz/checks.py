"""Assertions shared by the fuzz tests."""

from __future__ import annotations


def assert_one_line(message: str) -> None:
    """A typed error's text is one non-empty line (no newline, no other line separator)."""
    assert message.strip(), "empty error message"
    assert len(message.splitlines()) == 1, f"multi-line error: {message!r}"
