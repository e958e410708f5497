"""Small text helpers shared by every package: one-line error text and UTC timestamps for messages."""

from __future__ import annotations

from datetime import UTC, datetime


def first_line(value: BaseException | str, *, limit: int | None = None) -> str:
    """The first non-empty line of an exception's (or a string's) text; the exception's type name if empty.

    Errors are shown to users on one line, so multi-line library messages are cut here, never re-wrapped.
    """
    text = str(value).strip()
    line = text.splitlines()[0].strip() if text else type(value).__name__ if isinstance(value, BaseException) else ""
    return line if limit is None else line[:limit]


def iso_utc(epoch_seconds: float | None) -> str | None:
    """Epoch seconds as an ISO-8601 UTC timestamp to the second; None stays None."""
    if epoch_seconds is None:
        return None
    return datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="seconds")
