"""Classify one SQL statement and pick apart the forms the session handles itself.

DuckDB's parser decides the statement type (``extract_statements``) and its tokenizer finds the pieces of
INSERT / CREATE TABLE AS / PREPARE / EXECUTE, so quoting and comments are DuckDB's own rules. Anything that is
not a query, EXPLAIN, INSERT INTO an Iceberg table, CREATE TABLE ... AS, PREPARE, EXECUTE or DEALLOCATE is
refused: the session's DuckDB connection is not a general-purpose database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import duckdb

from sqe._text import first_line
from sqe.errors import QueryError

StatementKind = Literal["select", "explain", "insert", "ctas", "prepare", "execute", "deallocate"]


@dataclass(frozen=True)
class Statement:
    kind: StatementKind
    text: str  # the whole statement, without a trailing semicolon
    body: str | None = None  # explain/prepare: inner statement; insert/ctas: the source query (None: no source)
    name: str | None = None  # prepare/execute/deallocate
    args: str | None = None  # execute: the argument list text, without parentheses
    target: tuple[str, ...] | None = None  # insert/ctas: the target table's name parts
    target_span: tuple[int, int] | None = None  # insert: where the target name is in ``text``
    if_not_exists: bool = False


@dataclass(frozen=True)
class _Token:
    start: int
    end: int
    kind: str  # identifier, keyword, operator, numeric_const, string_const
    text: str

    @property
    def word(self) -> str:
        return self.text.upper() if self.kind == "keyword" else self.text


def classify(con: duckdb.DuckDBPyConnection, sql: str) -> Statement:
    text = sql.strip().rstrip(";").strip()
    if not text:
        raise QueryError("empty statement")
    try:
        statements = con.extract_statements(text)
    except duckdb.Error as exc:
        raise QueryError(first_line(exc)) from None
    if len(statements) != 1:
        raise QueryError(f"expected one statement, got {len(statements)}; run statements one at a time")
    kind = statements[0].type
    tokens = _tokens(text)
    if kind == duckdb.StatementType.SELECT:
        return Statement("select", text)
    if kind == duckdb.StatementType.EXPLAIN:
        return _explain(text, tokens)
    if kind == duckdb.StatementType.INSERT:
        return _insert(text, tokens)
    if kind == duckdb.StatementType.CREATE:
        return _create(text, tokens)
    if kind == duckdb.StatementType.PREPARE:
        return _prepare(text, tokens)
    if kind == duckdb.StatementType.EXECUTE:
        return _execute(text, tokens)
    if kind == duckdb.StatementType.DROP and tokens and tokens[0].word == "DEALLOCATE":
        rest = tokens[2:] if len(tokens) > 1 and tokens[1].word == "PREPARE" else tokens[1:]
        return Statement("deallocate", text, name=_single_name(rest, "DEALLOCATE"))
    name = str(kind).rsplit(".", 1)[-1]
    raise QueryError(f"{name} statements are not supported; SQE runs queries, INSERT and CREATE TABLE AS")


def parse_qualified_name(text: str) -> tuple[str, ...]:
    """``a.b.c`` (with DuckDB's quoting rules) into its parts."""
    tokens = _tokens(text.strip())
    if not tokens:
        raise QueryError("empty name")
    parts, after = _qualified_name(tokens, 0)
    if after != len(tokens):
        raise QueryError(f"{text!r} is not a table name")
    return parts


def _explain(text: str, tokens: list[_Token]) -> Statement:
    if len(tokens) > 1 and tokens[1].word == "ANALYZE":
        raise QueryError("EXPLAIN ANALYZE is not supported; use EXPLAIN")
    if len(tokens) < 2:
        raise QueryError("EXPLAIN needs a query")
    return Statement("explain", text, body=text[tokens[1].start :])


def _insert(text: str, tokens: list[_Token]) -> Statement:
    if tokens[0].word != "INSERT":
        raise QueryError("WITH before INSERT is not supported; put the WITH inside the SELECT")
    if len(tokens) < 3 or tokens[1].word != "INTO":
        raise QueryError("only plain INSERT INTO is supported (no INSERT OR REPLACE / OR IGNORE)")
    parts, after = _qualified_name(tokens, 2)
    span = (tokens[2].start, tokens[after - 1].end)
    i = after
    if i < len(tokens) and tokens[i].word == "AS":
        i += 2
    if i < len(tokens) and tokens[i].text == "(" and i + 1 < len(tokens) and tokens[i + 1].kind == "identifier":
        i = _after_parens(tokens, i)
    if i + 1 < len(tokens) and tokens[i].word == "BY" and tokens[i + 1].word in ("NAME", "POSITION"):
        i += 2
    if i + 1 < len(tokens) and tokens[i].word == "DEFAULT" and tokens[i + 1].word == "VALUES":
        return Statement("insert", text, body=None, target=parts, target_span=span)
    if i >= len(tokens):
        raise QueryError("INSERT needs VALUES or a query")
    _refuse_top_level(tokens[i:], {"ON", "RETURNING"}, "ON CONFLICT and RETURNING are not supported in INSERT")
    return Statement("insert", text, body=text[tokens[i].start :], target=parts, target_span=span)


def _create(text: str, tokens: list[_Token]) -> Statement:
    words = [t.word for t in tokens[:6]]
    if words[:2] != ["CREATE", "TABLE"]:
        raise QueryError("only CREATE TABLE ... AS SELECT is supported")
    i = 2
    if_not_exists = words[2:5] == ["IF", "NOT", "EXISTS"]
    if if_not_exists:
        i = 5
    if i >= len(tokens):
        raise QueryError("CREATE TABLE needs a table name")
    parts, after = _qualified_name(tokens, i)
    if after >= len(tokens) or tokens[after].word != "AS":
        raise QueryError("CREATE TABLE without AS SELECT is not supported; use CREATE TABLE ns.t AS SELECT ...")
    if after + 1 >= len(tokens):
        raise QueryError("CREATE TABLE ... AS needs a query")
    return Statement("ctas", text, body=text[tokens[after + 1].start :], target=parts, if_not_exists=if_not_exists)


def _prepare(text: str, tokens: list[_Token]) -> Statement:
    if len(tokens) < 4 or tokens[2].word != "AS":
        raise QueryError("use PREPARE name AS statement")
    return Statement("prepare", text, name=_name_of(tokens[1]), body=text[tokens[3].start :])


def _execute(text: str, tokens: list[_Token]) -> Statement:
    if len(tokens) < 2:
        raise QueryError("use EXECUTE name or EXECUTE name(arguments)")
    name = _name_of(tokens[1])
    if len(tokens) == 2:
        return Statement("execute", text, name=name, args=None)
    if tokens[2].text != "(" or _after_parens(tokens, 2) != len(tokens):
        raise QueryError("use EXECUTE name(arguments)")
    return Statement("execute", text, name=name, args=text[tokens[2].end : tokens[-1].start].strip())


def _tokens(text: str) -> list[_Token]:
    raw = duckdb.tokenize(text)
    tokens: list[_Token] = []
    for index, (start, kind) in enumerate(raw):
        stop = raw[index + 1][0] if index + 1 < len(raw) else len(text)
        kind_name = str(kind).rsplit(".", 1)[-1]
        if kind_name == "comment":
            continue
        piece = text[start:stop].rstrip()
        tokens.append(_Token(start, start + len(piece), kind_name, piece))
    return tokens


def _qualified_name(tokens: list[_Token], i: int) -> tuple[tuple[str, ...], int]:
    """Name parts from tokens[i] on (``a.b.c``); returns the parts and the index after the name."""
    parts = [_name_of(tokens[i])]
    i += 1
    while i + 1 < len(tokens) and tokens[i].text == ".":
        parts.append(_name_of(tokens[i + 1]))
        i += 2
    return tuple(parts), i


def _name_of(token: _Token) -> str:
    if token.kind not in ("identifier", "keyword"):
        raise QueryError(f"expected a name, found {token.text!r}")
    if token.text.startswith('"') and token.text.endswith('"') and len(token.text) >= 2:
        return token.text[1:-1].replace('""', '"')
    return token.text


def _single_name(tokens: list[_Token], what: str) -> str:
    if len(tokens) != 1:
        raise QueryError(f"use {what} name")
    return _name_of(tokens[0])


def _after_parens(tokens: list[_Token], i: int) -> int:
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].text == "(":
            depth += 1
        elif tokens[j].text == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    raise QueryError("unbalanced parentheses")


def _refuse_top_level(tokens: list[_Token], words: set[str], message: str) -> None:
    depth = 0
    for token in tokens:
        if token.text == "(":
            depth += 1
        elif token.text == ")":
            depth -= 1
        elif depth == 0 and token.kind == "keyword" and token.word in words:
            if token.word == "ON" and not _is_on_conflict(tokens, token):
                continue
            raise QueryError(message)


def _is_on_conflict(tokens: list[_Token], on: _Token) -> bool:
    index = tokens.index(on)
    return index + 1 < len(tokens) and tokens[index + 1].word == "CONFLICT"
