"""Classify one SQL statement and pick apart the forms the session handles itself.

DuckDB's parser decides the statement type (``extract_statements``) and its tokenizer finds the pieces of
INSERT / CREATE TABLE / DDL / DML / PREPARE / EXECUTE, so quoting and comments are DuckDB's own rules. The forms
DuckDB cannot parse (``SHOW CREATE TABLE``, Trino's ``FOR VERSION AS OF``) are recognised from tokens first.
Anything that is not a query, EXPLAIN [ANALYZE], INSERT / DELETE / UPDATE / MERGE on an Iceberg table,
CREATE TABLE [AS], the catalog DDL (schemas, DROP / ALTER TABLE, CREATE [OR REPLACE] / DROP VIEW), discovery
(SHOW, DESCRIBE), PREPARE, EXECUTE or DEALLOCATE is refused: the session's DuckDB connection is not a
general-purpose database.

Time travel is rewritten before DuckDB parses the statement: every ``name FOR VERSION|TIMESTAMP AS OF x`` and
``name AT (VERSION|TIMESTAMP => x)`` becomes a one-part placeholder name (``__sqe_tt_<n>``) aliased like the
table, and the statement carries what each placeholder stands for (``TimeTravel``).

A classification depends on the text alone (the parser connection sees no table), so it is kept per text in a
small process-wide LRU: a repeated statement is not tokenized and parsed again. Statements are frozen and
failures are never kept (a refused text is refused again, with the same message).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import duckdb

from sqe._lru import LRUCache
from sqe._text import first_line
from sqe.duckdb_connection import statement_type
from sqe.errors import QueryError
from sqe.planning.tokens import sql_tokens

StatementKind = Literal[
    "select",
    "explain",
    "insert",
    "ctas",
    "create_table",
    "prepare",
    "execute",
    "deallocate",
    "create_schema",
    "drop_schema",
    "drop_table",
    "alter_table",
    "show_schemas",
    "show_tables",
    "show_create_table",
    "describe",
    "delete",
    "update",
    "merge",
    "create_view",
    "drop_view",
    "show_views",
]
DML_KINDS = frozenset({"delete", "update", "merge"})
TIME_TRAVEL_PREFIX = "__sqe_tt_"
_SOURCE_KEYWORDS = {"FROM", "JOIN", "USING"}
_ALIAS_STOP_WORDS = {"AS"}  # an identifier or AS after a table name is its alias


@dataclass(frozen=True)
class TimeTravel:
    """One time-travel table reference: ``placeholder`` stands for ``parts`` as of a version or a timestamp."""

    placeholder: str
    parts: tuple[str, ...]
    kind: Literal["version", "timestamp"]
    value: str  # SQL text: a snapshot id, a quoted branch/tag name, or a timestamp expression


@dataclass(frozen=True)
class AlterAction:
    action: Literal["add", "rename", "drop"]
    column: str
    new_name: str | None = None  # rename
    type_text: str | None = None  # add: the SQL type, as written


@dataclass(frozen=True)
class MergeJoin:
    """How a MERGE with a WHEN MATCHED clause meets its source, as written: enough to ask, before it runs, whether
    a target row matches more than one source row (SQL makes that an error; DuckDB applies each match in turn)."""

    target_name: str  # how the statement names the target: its alias, else empty (the rewrite aliases it)
    alias: str  # the alias text after the target name ('' when none)
    source: str  # the USING source
    condition: str  # ``ON ...`` or ``USING (...)``
    later_parameters: tuple[str, ...]  # the parameters of the WHEN clauses, in order (``?``, ``$1``, ``$name``)


@dataclass(frozen=True)
class Statement:
    kind: StatementKind
    text: str  # the whole statement, without a trailing semicolon (time travel rewritten to placeholders)
    body: str | None = None  # explain/prepare: inner statement; insert/ctas: the source query (None: no source)
    name: str | None = None  # prepare/execute/deallocate
    args: str | None = None  # execute: the argument list text, without parentheses
    target: tuple[str, ...] | None = None  # insert/ctas/ddl/dml/show/describe: the table or namespace name parts
    target_span: tuple[int, int] | None = None  # insert/dml: where the target name is in ``text``
    if_not_exists: bool = False
    if_exists: bool = False
    analyze: bool = False  # EXPLAIN ANALYZE
    alter: AlterAction | None = None
    travels: tuple[TimeTravel, ...] = ()
    alias_missing: bool = False  # dml: the target has no alias (the rewrite must alias it by its own name)
    sources: tuple[tuple[str, ...], ...] = ()  # dml: other (2- or 3-part) table names it reads
    columns_text: str | None = None  # create_table: the parenthesised column list, parentheses included
    or_replace: bool = False  # CREATE OR REPLACE VIEW
    merge_join: MergeJoin | None = None  # merge with a WHEN MATCHED clause


@dataclass(frozen=True)
class _Token:
    start: int
    end: int
    kind: str  # identifier, keyword, operator, numeric_const, string_const
    text: str

    @property
    def word(self) -> str:
        return self.text.upper() if self.kind == "keyword" else self.text


_CLASSIFIED_ENTRIES = 256
_CLASSIFIED_MAX_SQL_CHARS = 16 << 10  # longer texts (generated INSERT ... VALUES) are not kept
_CLASSIFIED: LRUCache[str, Statement] = LRUCache(_CLASSIFIED_ENTRIES)


def classify(con: duckdb.DuckDBPyConnection, sql: str) -> Statement:
    """The statement ``sql`` is, from the cache when this exact text was classified before."""
    known = _CLASSIFIED.get(sql)
    if known is not None:
        return known
    statement = _classify(con, sql)
    if len(sql) <= _CLASSIFIED_MAX_SQL_CHARS:
        _CLASSIFIED.put(sql, statement)
    return statement


def _classify(con: duckdb.DuckDBPyConnection, sql: str) -> Statement:
    text = sql.strip().rstrip(";").strip()
    if not text:
        raise QueryError("empty statement")
    discovery = _discovery(text, _tokens(text))
    if discovery is not None:
        return discovery
    text, travels = rewrite_time_travel(text)
    statement = _classify_parsed(con, text)
    return replace(statement, travels=travels) if travels else statement


def _classify_parsed(con: duckdb.DuckDBPyConnection, text: str) -> Statement:
    try:
        statements = con.extract_statements(text)
    except duckdb.Error as exc:
        raise QueryError(first_line(exc)) from None
    if len(statements) != 1:
        raise QueryError(f"expected one statement, got {len(statements)}; run statements one at a time")
    kind = statement_type(statements[0])
    if kind is None:
        raise QueryError("this statement is not supported; see the SQL section of the README for what SQE runs")
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
    if kind == duckdb.StatementType.DROP:
        return _drop(text, tokens)
    if kind == duckdb.StatementType.ALTER:
        return _alter(text, tokens)
    if kind in (duckdb.StatementType.DELETE, duckdb.StatementType.UPDATE, duckdb.StatementType.MERGE_INTO):
        return _dml(text, tokens)
    name = str(kind).rsplit(".", 1)[-1]
    raise QueryError(f"{name} statements are not supported; see the SQL section of the README for what SQE runs")


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
    analyze = len(tokens) > 1 and tokens[1].word == "ANALYZE"
    first = 2 if analyze else 1
    if len(tokens) <= first:
        raise QueryError("EXPLAIN needs a query")
    return Statement("explain", text, body=text[tokens[first].start :], analyze=analyze)


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
    if words[:2] == ["CREATE", "VIEW"] or words[:4] == ["CREATE", "OR", "REPLACE", "VIEW"]:
        return _create_view(text, tokens)
    if words[:2] == ["CREATE", "SCHEMA"]:
        if_not_exists = words[2:5] == ["IF", "NOT", "EXISTS"]
        parts = _whole_name(tokens, 5 if if_not_exists else 2, "CREATE SCHEMA")
        return Statement("create_schema", text, target=parts, if_not_exists=if_not_exists)
    if words[:2] != ["CREATE", "TABLE"]:
        raise QueryError("only CREATE SCHEMA, CREATE TABLE and CREATE TABLE ... AS SELECT are supported")
    i = 2
    if_not_exists = words[2:5] == ["IF", "NOT", "EXISTS"]
    if if_not_exists:
        i = 5
    if i >= len(tokens):
        raise QueryError("CREATE TABLE needs a table name")
    parts, after = _qualified_name(tokens, i)
    if after < len(tokens) and tokens[after].text == "(" and _after_parens(tokens, after) == len(tokens):
        columns = text[tokens[after].start : tokens[-1].end]
        return Statement("create_table", text, target=parts, if_not_exists=if_not_exists, columns_text=columns)
    if after >= len(tokens) or tokens[after].word != "AS":
        raise QueryError("use CREATE TABLE ns.t (column type, ...) or CREATE TABLE ns.t AS SELECT ...")
    if after + 1 >= len(tokens):
        raise QueryError("CREATE TABLE ... AS needs a query")
    return Statement("ctas", text, body=text[tokens[after + 1].start :], target=parts, if_not_exists=if_not_exists)


def _create_view(text: str, tokens: list[_Token]) -> Statement:
    """CREATE [OR REPLACE] VIEW [IF NOT EXISTS] name AS query: stored in the catalog, not in DuckDB."""
    or_replace = tokens[1].word == "OR"
    i = 4 if or_replace else 2
    if_not_exists = [t.word for t in tokens[i : i + 3]] == ["IF", "NOT", "EXISTS"]
    if if_not_exists and or_replace:
        raise QueryError("use either CREATE OR REPLACE VIEW or CREATE VIEW IF NOT EXISTS, not both")
    i += 3 if if_not_exists else 0
    if i >= len(tokens):
        raise QueryError("CREATE VIEW needs a view name")
    parts, after = _qualified_name(tokens, i)
    if after < len(tokens) and tokens[after].text == "(":
        raise QueryError("CREATE VIEW with a column list is not supported; alias the columns in the query")
    if after + 1 >= len(tokens) or tokens[after].word != "AS":
        raise QueryError("use CREATE [OR REPLACE] VIEW ns.v AS SELECT ...")
    body = text[tokens[after + 1].start :]
    return Statement("create_view", text, body=body, target=parts, if_not_exists=if_not_exists, or_replace=or_replace)


def _drop(text: str, tokens: list[_Token]) -> Statement:
    words = [t.word for t in tokens[:4]]
    what = words[1] if len(words) > 1 else ""
    if what not in ("SCHEMA", "TABLE", "VIEW"):
        raise QueryError("only DROP SCHEMA, DROP TABLE and DROP VIEW are supported")
    if_exists = words[2:4] == ["IF", "EXISTS"]
    i = 4 if if_exists else 2
    parts, after = _qualified_name(tokens, i) if i < len(tokens) else ((), i)
    if not parts:
        raise QueryError(f"DROP {what} needs a name")
    if after < len(tokens) and tokens[after].word in ("CASCADE", "RESTRICT") and after + 1 == len(tokens):
        if tokens[after].word == "CASCADE":
            raise QueryError("DROP ... CASCADE is not supported; drop the tables first")
        after += 1
    if after != len(tokens):
        raise QueryError(f"unexpected {tokens[after].text!r} after DROP {what} {'.'.join(parts)}")
    kinds: dict[str, StatementKind] = {"SCHEMA": "drop_schema", "TABLE": "drop_table", "VIEW": "drop_view"}
    kind = kinds[what]
    return Statement(kind, text, target=parts, if_exists=if_exists)


def _alter(text: str, tokens: list[_Token]) -> Statement:
    if len(tokens) < 4 or tokens[1].word != "TABLE":
        raise QueryError("only ALTER TABLE ... ADD / RENAME / DROP COLUMN is supported")
    i = 2
    if_exists = [t.word for t in tokens[2:4]] == ["IF", "EXISTS"]
    if if_exists:
        i = 4
    parts, i = _qualified_name(tokens, i)
    words = [t.word for t in tokens[i:]]
    if words[:1] == ["ADD"]:
        j = i + (2 if words[1:2] == ["COLUMN"] else 1)
        if j + 1 >= len(tokens):
            raise QueryError("use ALTER TABLE t ADD COLUMN name type")
        type_text = text[tokens[j + 1].start : tokens[-1].end]
        action = AlterAction("add", _name_of(tokens[j]), type_text=type_text)
    elif words[:1] == ["RENAME"]:
        j = i + (2 if words[1:2] == ["COLUMN"] else 1)
        if j + 3 != len(tokens) or tokens[j + 1].word != "TO":
            raise QueryError("use ALTER TABLE t RENAME COLUMN old TO new")
        action = AlterAction("rename", _name_of(tokens[j]), new_name=_name_of(tokens[j + 2]))
    elif words[:1] == ["DROP"]:
        j = i + (2 if words[1:2] == ["COLUMN"] else 1)
        if j + 1 != len(tokens):
            raise QueryError("use ALTER TABLE t DROP COLUMN name")
        action = AlterAction("drop", _name_of(tokens[j]))
    else:
        raise QueryError("only ALTER TABLE ... ADD COLUMN / RENAME COLUMN / DROP COLUMN is supported")
    return Statement("alter_table", text, target=parts, alter=action, if_exists=if_exists)


def _dml(text: str, tokens: list[_Token]) -> Statement:
    """DELETE FROM t / UPDATE t / MERGE INTO t: the target's name and span, and the other tables it reads."""
    first = tokens[0].word
    lead = {"DELETE": ("FROM",), "UPDATE": (), "MERGE": ("INTO",)}.get(first)
    if lead is None:
        raise QueryError("WITH before DELETE / UPDATE / MERGE is not supported; use a subquery")
    i = 1 + len(lead)
    if i >= len(tokens) or [t.word for t in tokens[1:i]] != list(lead):
        raise QueryError(f"use {first} {' '.join(lead)} table ...".replace("  ", " "))
    parts, after = _qualified_name(tokens, i)
    span = (tokens[i].start, tokens[after - 1].end)
    alias_missing = not (after < len(tokens) and (tokens[after].word in _ALIAS_STOP_WORDS or _is_alias(tokens[after])))
    _refuse_top_level(tokens[after:], {"RETURNING"}, f"RETURNING is not supported in {first}")
    kind: StatementKind = "delete" if first == "DELETE" else "update" if first == "UPDATE" else "merge"
    return Statement(
        kind,
        text,
        target=parts,
        target_span=span,
        alias_missing=alias_missing,
        sources=_source_tables(tokens, after),
        merge_join=_merge_join(text, tokens, after) if kind == "merge" else None,
    )


def _merge_join(text: str, tokens: list[_Token], after: int) -> MergeJoin | None:
    """``MERGE INTO t [alias] USING source ON|USING ... WHEN ...``: its parts, when a WHEN MATCHED clause is there.
    None also when the shape is not recognised (DuckDB then reports the statement's own error)."""
    top: list[int] = []
    depth = 0
    for index in range(after, len(tokens)):
        token = tokens[index]
        if token.text == "(":
            depth += 1
        elif token.text == ")":
            depth -= 1
        elif depth == 0 and token.kind == "keyword":
            top.append(index)
    using = next((i for i in top if tokens[i].word == "USING"), None)
    when = next((i for i in top if tokens[i].word == "WHEN"), None)
    if using is None or when is None:
        return None
    # the last ON / USING before the first WHEN: a source that is itself a join has ON clauses of its own
    join = max((i for i in top if using < i < when and tokens[i].word in ("ON", "USING")), default=None)
    matched = any(tokens[i].word == "WHEN" and i + 1 < len(tokens) and tokens[i + 1].word == "MATCHED" for i in top)
    if join is None or join == using + 1 or not matched:
        return None
    later: list[str] = []
    for index in range(when, len(tokens)):
        token = tokens[index]
        if token.text == "?":
            later.append("?")
        elif token.text == "$" and index + 1 < len(tokens) and tokens[index + 1].start == token.end:
            later.append("$" + tokens[index + 1].text)
    alias = text[tokens[after].start : tokens[using - 1].end] if using > after else ""
    return MergeJoin(
        target_name=tokens[using - 1].text if using > after else "",
        alias=alias,
        source=text[tokens[using + 1].start : tokens[join - 1].end],
        condition=text[tokens[join].start : tokens[when - 1].end],
        later_parameters=tuple(later),
    )


def _source_tables(tokens: list[_Token], start: int) -> tuple[tuple[str, ...], ...]:
    """Two- and three-part names right after FROM / JOIN / USING: the tables a DML statement reads."""
    found: list[tuple[str, ...]] = []
    for i in range(start, len(tokens) - 1):
        if tokens[i].word in _SOURCE_KEYWORDS and tokens[i + 1].kind in ("identifier", "keyword"):
            if tokens[i + 1].kind == "keyword" and tokens[i + 1].word in ("SELECT", "LATERAL"):
                continue
            parts, _ = _qualified_name(tokens, i + 1)
            if len(parts) >= 2 and parts not in found:
                found.append(parts)
    return tuple(found)


def _is_alias(token: _Token) -> bool:
    return token.kind == "identifier"


# ------------------------------------------------------------------------------------ discovery statements


def _discovery(text: str, tokens: list[_Token]) -> Statement | None:
    """SHOW SCHEMAS / SHOW TABLES / SHOW CREATE TABLE / DESCRIBE t: answered from the catalog, not DuckDB."""
    if not tokens:
        return None
    words = [t.word for t in tokens]
    if words[0] == "SHOW":
        if words[1:2] in (["SCHEMAS"], ["DATABASES"]):
            return Statement("show_schemas", text, target=_optional_from(tokens, 2, "SHOW SCHEMAS"))
        if words[1:2] == ["TABLES"]:
            return Statement("show_tables", text, target=_optional_from(tokens, 2, "SHOW TABLES"))
        if words[1:2] == ["VIEWS"]:
            return Statement("show_views", text, target=_optional_from(tokens, 2, "SHOW VIEWS"))
        if words[1:3] == ["CREATE", "TABLE"]:
            return Statement("show_create_table", text, target=_whole_name(tokens, 3, "SHOW CREATE TABLE"))
        if words[1:2] == ["COLUMNS"] and words[2:3] in (["FROM"], ["IN"]):
            return Statement("describe", text, target=_whole_name(tokens, 3, "SHOW COLUMNS FROM"))
        if words[1:2] == ["ALL"] and words[2:3] == ["TABLES"]:
            return Statement("show_tables", text)
        if len(tokens) > 1 and tokens[1].kind in ("identifier", "keyword") and words[1] not in ("SELECT", "FROM"):
            return Statement("describe", text, target=_whole_name(tokens, 1, "SHOW"))
        return None
    if words[0] in ("DESCRIBE", "DESC") and len(tokens) > 1 and words[1] not in ("SELECT", "FROM", "WITH", "("):
        return Statement("describe", text, target=_whole_name(tokens, 1, "DESCRIBE"))
    return None


def _optional_from(tokens: list[_Token], i: int, what: str) -> tuple[str, ...] | None:
    if i == len(tokens):
        return None
    if tokens[i].word not in ("FROM", "IN"):
        raise QueryError(f"use {what} [FROM name]")
    return _whole_name(tokens, i + 1, what)


def _whole_name(tokens: list[_Token], i: int, what: str) -> tuple[str, ...]:
    if i >= len(tokens):
        raise QueryError(f"{what} needs a name")
    parts, after = _qualified_name(tokens, i)
    if after != len(tokens):
        raise QueryError(f"unexpected {tokens[after].text!r} after {what} {'.'.join(parts)}")
    return parts


# ------------------------------------------------------------------------------------------ time travel


def rewrite_time_travel(text: str) -> tuple[str, tuple[TimeTravel, ...]]:
    """Replace every time-travel table reference by a placeholder name; returns the new text and the refs."""
    tokens = _tokens(text)
    travels: list[TimeTravel] = []
    pieces: list[str] = []
    cursor = 0
    i = 0
    while i < len(tokens):
        found = _travel_clause(tokens, i)
        if found is None:
            i += 1
            continue
        kind, value_start, value_end, clause_end = found
        name_start = _name_start(tokens, i)
        if name_start is None:
            raise QueryError("FOR ... AS OF / AT (...) must follow a table name")
        parts, _ = _qualified_name(tokens, name_start)
        placeholder = f"{TIME_TRAVEL_PREFIX}{len(travels)}"
        value = text[tokens[value_start].start : tokens[value_end - 1].end]
        travels.append(TimeTravel(placeholder, parts, kind, value))
        has_alias = clause_end < len(tokens) and (
            tokens[clause_end].word in _ALIAS_STOP_WORDS or _is_alias(tokens[clause_end])
        )
        alias = "" if has_alias else f" AS {_quote(parts[-1])}"
        pieces.append(text[cursor : tokens[name_start].start] + _quote(placeholder) + alias)
        cursor = tokens[clause_end - 1].end
        i = clause_end
    if not travels:
        return text, ()
    pieces.append(text[cursor:])
    return "".join(pieces), tuple(travels)


def _travel_clause(tokens: list[_Token], i: int) -> tuple[Literal["version", "timestamp"], int, int, int] | None:
    """(kind, value start, value end, clause end) when a time-travel clause starts at tokens[i]."""
    words = [t.word for t in tokens[i : i + 4]]
    if words[:1] == ["FOR"] and words[1:2] in (["VERSION"], ["TIMESTAMP"]) and words[2:4] == ["AS", "OF"]:
        kind: Literal["version", "timestamp"] = "version" if words[1] == "VERSION" else "timestamp"
        start = i + 4
        end = _travel_value_end(tokens, start)
        return kind, start, end, end
    if words[:1] == ["AT"] and words[1:2] == ["("] and words[2:3] in (["VERSION"], ["TIMESTAMP"]):
        if i + 4 >= len(tokens) or tokens[i + 3].text != "=>":
            return None
        kind = "version" if words[2] == "VERSION" else "timestamp"
        close = _after_parens(tokens, i + 1)
        if close - 1 <= i + 4:
            raise QueryError("AT (VERSION => ...) needs a value")
        return kind, i + 4, close - 1, close
    return None


def _travel_value_end(tokens: list[_Token], start: int) -> int:
    """A literal, a typed literal (TIMESTAMP '...') or a parenthesised expression."""
    if start >= len(tokens):
        raise QueryError("FOR ... AS OF needs a value")
    token = tokens[start]
    if token.text == "(":
        return _after_parens(tokens, start)
    if token.kind in ("numeric_const", "string_const"):
        return start + 1
    typed = token.word in ("TIMESTAMP", "TIMESTAMPTZ", "DATE")
    if typed and start + 1 < len(tokens) and tokens[start + 1].kind == "string_const":
        return start + 2
    if token.text == "-" and start + 1 < len(tokens) and tokens[start + 1].kind == "numeric_const":
        return start + 2
    raise QueryError("FOR ... AS OF takes a literal, TIMESTAMP '...', or a parenthesised expression")


def _name_start(tokens: list[_Token], end: int) -> int | None:
    """Where the qualified name that ends just before tokens[end] starts."""
    j = end - 1
    if j < 0 or tokens[j].kind not in ("identifier", "keyword"):
        return None
    while j >= 2 and tokens[j - 1].text == "." and tokens[j - 2].kind in ("identifier", "keyword"):
        j -= 2
    return j


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


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
    raw = sql_tokens(text)
    tokens: list[_Token] = []
    for index, (start, kind_name) in enumerate(raw):
        stop = raw[index + 1][0] if index + 1 < len(raw) else len(text)
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
