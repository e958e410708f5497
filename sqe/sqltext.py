"""Splitting SQL text into statements (quotes, identifiers and comments respected)."""

from __future__ import annotations


def split_statements(text: str) -> list[str]:
    """Split on top-level semicolons; empty statements are dropped."""
    statements: list[str] = []
    current: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in ("'", '"'):
            end = _closing_quote(text, i)
            current.append(text[i:end])
            i = end
            continue
        if text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        if ch == ";":
            _flush(current, statements)
            current = []
        else:
            current.append(ch)
        i += 1
    _flush(current, statements)
    return statements


def is_complete(text: str) -> bool:
    """True when the text ends a statement (for the interactive shell's multi-line input)."""
    stripped = _strip_trailing_comments(text).rstrip()
    if not stripped:
        return False
    if stripped.startswith("\\"):
        return True
    return stripped.endswith(";") and _quotes_balanced(stripped)


def _closing_quote(text: str, start: int) -> int:
    quote = text[start]
    i = start + 1
    while i < len(text):
        if text[i] == quote:
            if i + 1 < len(text) and text[i + 1] == quote:  # doubled quote escapes itself
                i += 2
                continue
            return i + 1
        i += 1
    return len(text)


def _flush(current: list[str], statements: list[str]) -> None:
    statement = "".join(current).strip()
    if statement:
        statements.append(statement)


def _quotes_balanced(text: str) -> bool:
    i = 0
    while i < len(text):
        if text[i] in ("'", '"'):
            end = _closing_quote(text, i)
            if end >= len(text) and (end - 1 == i or text[end - 1] != text[i]):
                return False
            i = end
            continue
        i += 1
    return True


def _strip_trailing_comments(text: str) -> str:
    lines = [line for line in text.splitlines() if not line.strip().startswith("--")]
    return "\n".join(lines)
