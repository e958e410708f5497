"""A bare count(*) answered from manifest record counts: only when exact and allowed, otherwise a real scan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sqe.execution.metadata_answers import DUCKDB_COUNT_STAR
from sqe.session import Session
from tests.unit.sqe.iceberg_local import DELETED_POSITIONS, NUMBER_FILES, ROWS_PER_FILE, LocalProvider

TOTAL = NUMBER_FILES * ROWS_PER_FILE
GRP_IS_1 = {"type": "eq", "left": {"type": "reference", "id": 3}, "right": 1}  # numbers: id=1 name=2 grp=3


@pytest.fixture()
def session(provider: LocalProvider, session_factory: Callable[..., Session]) -> Session:
    return session_factory(provider)


def count(session: Session, sql: str) -> tuple[Any, bool]:
    """The single value and whether a scan ran for it."""
    result = session.sql(sql).arrow()
    [[value]] = [list(row.values()) for row in result.to_pylist()]
    return value, bool(session.last_streams)


@pytest.mark.parametrize(
    ("sql", "column"),
    [
        ("SELECT count(*) FROM ns.numbers", DUCKDB_COUNT_STAR),
        ("select COUNT( * ) as n from wh.ns.numbers;", "n"),
    ],
)
def test_a_bare_count_of_a_plain_table_reads_no_file(session: Session, sql: str, column: str) -> None:
    result = session.sql(sql).arrow()
    assert result.column_names == [column] and result.column(0).to_pylist() == [TOTAL]
    assert session.last_streams == []  # no scan was bound
    # DuckDB itself names and types the column the same way when the query does run.
    scanned = session.sql("SELECT count(*) FROM ns.numbers WHERE id >= 0").arrow()
    assert scanned.schema.field(0).type == result.schema.field(0).type
    if column == DUCKDB_COUNT_STAR:
        assert scanned.column_names == result.column_names


def test_anything_else_runs_the_query(session: Session) -> None:
    assert count(session, "SELECT count(*) FROM ns.numbers WHERE id < 10") == (10, True)
    assert count(session, "SELECT count(id) FROM ns.numbers") == (TOTAL, True)
    assert count(session, "SELECT count(*) FROM ns.deleted") == (TOTAL - len(DELETED_POSITIONS), True)


def test_never_for_a_restricted_table(session: Session, provider: LocalProvider) -> None:
    provider.restrictions["wh.ns.numbers"] = {"required-row-filter": GRP_IS_1}
    assert count(session, "SELECT count(*) FROM ns.numbers") == (TOTAL // 5, True)
    mask_name = [{"field-id": 2, "action": "mask-alphanum"}]
    provider.restrictions["wh.ns.numbers"] = {"required-column-projections": mask_name}
    assert count(session, "SELECT count(*) FROM ns.numbers") == (TOTAL, True)  # a mask alone: still scanned
