"""Small text helpers shared by every package: one-line error text and UTC timestamps for messages."""

from __future__ import annotations

from datetime import UTC, datetime


def first_line(value: BaseException | str, *, limit: int | None = None) -> str:
    """The first non-empty line of an exception's (or a string's) text; the exception's type name if empty.

    Errors are shown to users on one line, so multi-line library messages are cut here, never re-wrapped.
    """
    text = str(value).strip()
    if not text:
        return type(value).__name__ if isinstance(value, BaseException) else ""
    line = text.splitlines()[0].strip()
    return line if limit is None else line[:limit]


def terminal_line(value: BaseException | str) -> str:
    """:func:`first_line` with control characters escaped: for a terminal, where an error echoing a table name
    or a catalog's message must not move the cursor, recolour or rewrite the screen."""
    return escape_unprintable(first_line(value))


def escape_for_terminal(text: str) -> str:
    """:func:`escape_unprintable` with a backslash doubled, so the text ``\\x1b`` never reads as an escaped ESC.

    For values and names shown on a terminal (the table format), where the escaping must be unambiguous.
    """
    return escape_unprintable(text.replace("\\", "\\\\"))


def iso_utc(epoch_seconds: float | None, *, zulu: bool = False) -> str | None:
    """Epoch seconds as an ISO-8601 UTC timestamp to the second; None stays None. ``zulu`` writes the zone as
    ``Z`` (as Java's ``Instant`` does, for Gravitino-shaped answers) instead of ``+00:00``."""
    if epoch_seconds is None:
        return None
    text = datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="seconds")
    return text.removesuffix("+00:00") + "Z" if zulu else text


def escape_unprintable(text: str) -> str:
    """``text`` with line breaks and other unprintable characters escaped as Python does (``\\n``, ``\\x1f``).

    For errors that echo client input (a key, a path segment): the message must stay one line.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
