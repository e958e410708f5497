"""DuckDB's tokenizer with character offsets.

``duckdb.tokenize`` reports where each token starts as a UTF-8 *byte* offset; Python slices strings by
character. Every planner module that cuts SQL text at token boundaries goes through here, so a non-ASCII name
or literal never shifts a cut.
"""

from __future__ import annotations

import duckdb


def sql_tokens(text: str) -> list[tuple[int, str]]:
    """(character offset, kind) of every token of ``text``, comments included; kinds as DuckDB names them."""
    raw = [(start, str(kind).rsplit(".", 1)[-1]) for start, kind in duckdb.tokenize(text)]
    if text.isascii():
        return raw
    encoded = text.encode()
    tokens: list[tuple[int, str]] = []
    chars = done = 0
    for start, kind in raw:  # token starts fall on character boundaries, and come in order
        chars += len(encoded[done:start].decode())
        done = start
        tokens.append((chars, kind))
    return tokens
