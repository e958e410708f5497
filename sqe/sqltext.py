"""Splitting SQL text into statements (strings, quoted identifiers, dollar-quoted strings and comments respected)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

# $$...$$ or $tag$...$tag$ (DuckDB's dollar-quoted strings); `$1` (a parameter) is not one.
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")

Kind = Literal["code", "literal", "comment"]


def split_statements(text: str) -> list[str]:
    """Split on top-level semicolons; comments and empty statements are dropped."""
    statements: list[str] = []
    current: list[str] = []
    for kind, start, end, _closed in _scan(text):
        if kind == "comment":
            current.append(" ")  # `1/*x*/AS a` stays two words
            continue
        if kind == "code" and text[start] == ";":
            _flush(current, statements)
            current = []
        else:
            current.append(text[start:end])
    _flush(current, statements)
    return statements


def is_complete(text: str) -> bool:
    """True when the text ends a statement (for the interactive shell's multi-line input): its last character
    outside comments is a top-level ';' and no string or comment is left open; or it is a backslash command."""
    significant: list[str] = []  # code characters other than white space, and "literal" for each string
    all_closed = True
    for kind, start, _end, closed in _scan(text):
        all_closed = all_closed and closed
        if kind == "literal":
            significant.append("literal")
        elif kind == "code" and not text[start].isspace():
            significant.append(text[start])
    if not significant:
        return False
    return significant[0] == "\\" or (all_closed and significant[-1] == ";")


def code_and_pieces(text: str) -> tuple[str, list[str]]:
    """The text outside strings and comments (each string and comment replaced by a space, so a comment between
    two words still separates them, as in DuckDB), and the text of each string, quoted identifier, dollar-quoted
    string and comment, quotes and comment marks included."""
    code: list[str] = []
    pieces: list[str] = []
    for kind, start, end, _closed in _scan(text):
        if kind == "code":
            code.append(text[start:end])
        else:
            code.append(" ")
            pieces.append(text[start:end])
    return "".join(code), pieces


def _scan(text: str) -> Iterator[tuple[Kind, int, int, bool]]:
    """The text as pieces: one code character, or a whole literal or comment, with whether it is closed."""
    i, n = 0, len(text)
    while i < n:
        if text.startswith("--", i):
            end = text.find("\n", i)
            yield "comment", i, n if end < 0 else end, True
            i = n if end < 0 else end
            continue
        if text.startswith("/*", i):
            end, closed = _block_comment_end(text, i)
            yield "comment", i, end, closed
            i = end
            continue
        literal = _literal_end(text, i)
        if literal is not None:
            end, closed = literal
            yield "literal", i, end, closed
            i = end
            continue
        yield "code", i, i + 1, True
        i += 1


def _block_comment_end(text: str, start: int) -> tuple[int, bool]:
    """Where the ``/* */`` comment at ``start`` ends: comments nest, as in DuckDB (``/* a /* b */ ; */`` is one)."""
    depth, i = 0, start
    while i < len(text):
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i, True
        else:
            i += 1
    return len(text), False


def _literal_end(text: str, start: int) -> tuple[int, bool] | None:
    """Where the string, quoted identifier or dollar-quoted string at ``start`` ends, and whether it is closed;
    None if none starts there."""
    ch = text[start]
    after_word = start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_$")
    if ch == "'" and after_word and text[start - 1] in "eE" and not _word_before(text, start - 1):
        return _escaped_end(text, start)  # E'it\'s': a backslash escapes the next character
    if ch in ("'", '"'):
        return _closing_quote(text, start)
    if ch == "$" and not after_word:
        match = _DOLLAR.match(text, start)
        if match:
            end = text.find(match.group(0), match.end())
            return (len(text), False) if end < 0 else (end + len(match.group(0)), True)
    return None


def _word_before(text: str, at: int) -> bool:
    return at > 0 and (text[at - 1].isalnum() or text[at - 1] in "_$")


def _closing_quote(text: str, start: int) -> tuple[int, bool]:
    quote = text[start]
    i = start + 1
    while i < len(text):
        if text[i] == quote:
            if i + 1 < len(text) and text[i + 1] == quote:  # doubled quote escapes itself
                i += 2
                continue
            return i + 1, True
        i += 1
    return len(text), False


def _escaped_end(text: str, start: int) -> tuple[int, bool]:
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "'":
            if i + 1 < len(text) and text[i + 1] == "'":
                i += 2
                continue
            return i + 1, True
        i += 1
    return len(text), False


def _flush(current: list[str], statements: list[str]) -> None:
    statement = "".join(current).strip()
    if statement:
        statements.append(statement)
