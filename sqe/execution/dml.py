"""DELETE / UPDATE / MERGE INTO as copy-on-write: rewrite the data files a statement changes, commit one snapshot.

How it works: the target's rows are read (through SQE's scoped FileIO, position deletes applied) into a DuckDB
temp table in file order, so each file owns a contiguous range of ``rowid``s, and a copy of every row is kept.
DuckDB then runs the user's statement itself against that temp table (its DELETE / UPDATE / MERGE semantics,
subqueries and joins with other Iceberg tables bound as usual). DuckDB keeps a row's ``rowid`` across an
UPDATE of an unindexed temp table and numbers inserted rows after the last one, so comparing with the copy
finds exactly the files that lost or changed a row; those files are replaced, in one overwrite snapshot, by
their surviving rows plus the inserted rows. pyiceberg writes the new files through the same FileIO and commits
through SQE's catalog client with ``assert-ref-snapshot-id``: a concurrent commit is a 409; pyiceberg then
re-validates on the new metadata (serializable: files added or removed meanwhile that the statement's files
overlap fail it), and either way a conflict is the typed CommitConflictError with nothing half-applied.

Merge-on-read (position delete files) is not written: pyiceberg 0.12 cannot write delete files.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow

from sqe.duckdb_connection import quote_ident
from sqe.execution.commit import overwrite_files
from sqe.execution.stream import ScanStream

if TYPE_CHECKING:
    from sqe.catalog.base import LoadedTable
    from sqe.execution.local import LocalExecutor
    from sqe.execution.stream import QueryContext
    from sqe.planning.planner import ScanPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Staged:
    """The target's rows in DuckDB: ``table`` (what the statement changes) and ``original`` (the copy)."""

    table: str
    original: str
    offsets: tuple[int, ...]  # offsets[k] = first rowid of file k; offsets[-1] = the number of rows read

    @property
    def rows_read(self) -> int:
        return self.offsets[-1]


@dataclass(frozen=True)
class Rewrite:
    """What the statement did: which files of the plan to replace, by which rows."""

    replaced: tuple[int, ...]  # indexes into the plan's tasks
    rows: pa.Table  # surviving rows of the replaced files plus inserted rows, in the table's Arrow shape


def stage_target(
    con: duckdb.DuckDBPyConnection, plan: ScanPlan, executor: LocalExecutor, context: QueryContext, name: str
) -> Staged:
    """Read every file of ``plan`` in task order into temp table ``name`` (and its copy ``name``_original)."""
    schema = schema_to_pyarrow(plan.loaded.table.schema(), include_field_ids=False)
    offsets = [0]
    shape = f"{name}_shape"
    con.register(shape, pa.Table.from_batches([], schema))
    try:
        con.execute(f"CREATE TEMP TABLE {quote_ident(name)} AS SELECT * FROM {quote_ident(shape)}")
    finally:
        con.unregister(shape)
    for index, task in enumerate(plan.tasks):
        one_file = plan.with_tasks((task,))
        rows = ScanStream(one_file, executor, context).reader().read_all()
        source = f"{name}_file_{index}"
        con.register(source, rows)
        try:
            con.execute(f"INSERT INTO temp.main.{quote_ident(name)} SELECT * FROM {quote_ident(source)}")
        finally:
            con.unregister(source)
        offsets.append(offsets[-1] + rows.num_rows)
    original = f"{name}_original"
    con.execute(
        f"CREATE TEMP TABLE {quote_ident(original)} AS "
        f"SELECT rowid AS __sqe_row, {_row_value(schema)} AS __sqe_value FROM temp.main.{quote_ident(name)}"
    )
    return Staged(name, original, tuple(offsets))


def find_rewrite(con: duckdb.DuckDBPyConnection, staged: Staged, plan: ScanPlan) -> Rewrite:
    """After the statement ran on the staged table: the files that lost or changed a row, and their new rows."""
    schema = schema_to_pyarrow(plan.loaded.table.schema(), include_field_ids=False)
    table, original = f"temp.main.{quote_ident(staged.table)}", f"temp.main.{quote_ident(staged.original)}"
    changed = con.execute(
        f"SELECT o.__sqe_row FROM {original} o "
        f"LEFT JOIN (SELECT rowid AS __sqe_row, {_row_value(schema)} AS __sqe_value FROM {table}) s "
        "USING (__sqe_row) WHERE s.__sqe_row IS NULL OR o.__sqe_value IS DISTINCT FROM s.__sqe_value"
    ).fetchall()
    replaced = sorted({_file_of(int(row), staged.offsets) for (row,) in changed})
    ranges = [f"(rowid >= {staged.offsets[k]} AND rowid < {staged.offsets[k + 1]})" for k in replaced]
    keep = " OR ".join([f"rowid >= {staged.rows_read}", *ranges])
    rows = con.sql(f"SELECT * FROM {table} WHERE {keep}").to_arrow_table()
    return Rewrite(tuple(replaced), rows)


def commit_rewrite(loaded: LoadedTable, plan: ScanPlan, rewrite: Rewrite, data: pa.Table, operation: str) -> None:
    """One overwrite snapshot: the replaced files out, ``data`` written (through SQE's FileIO) in."""
    overwrite_files(loaded, [plan.tasks[index].file for index in rewrite.replaced], data, operation)


def drop_staged(con: duckdb.DuckDBPyConnection, staged: Staged | None, name: str) -> None:
    for table in (name, f"{name}_original"):
        con.execute(f"DROP TABLE IF EXISTS temp.main.{quote_ident(table)}")
    del staged


def _row_value(schema: pa.Schema) -> str:
    """One comparable value per row (a struct of every column)."""
    if not len(schema):
        return "NULL"
    return "struct_pack(" + ", ".join(f"{quote_ident(f.name)} := {quote_ident(f.name)}" for f in schema) + ")"


def _file_of(row: int, offsets: tuple[int, ...]) -> int:
    low, high = 0, len(offsets) - 2
    while low < high:
        middle = (low + high + 1) // 2
        if offsets[middle] <= row:
            low = middle
        else:
            high = middle - 1
    return low
