"""Pass-through recognition and results on real local Iceberg tables (files on disk, pyiceberg SqlCatalog).

Each statement runs twice in one session, once with pass-through allowed and once forced through DuckDB; the
results must be the same (schema exactly, rows as multisets), and the path must be the expected one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sqe.duckdb_connection import connect_locked_down
from sqe.execution.passthrough import PATH_DUCKDB, PATH_PASS_THROUGH, PassThrough, PassThroughPlanner, _exact_cast
from sqe.session import Session, explain_sections
from tests.unit.sqe.iceberg_local import LocalProvider

SessionFactory = Callable[..., Session]


def both(session: Session, sql: str) -> tuple[pa.Table, pa.Table, str]:
    session.pass_through = True
    fast = session.sql(sql).arrow()
    path = session.last_execution_path
    session.pass_through = False
    slow = session.sql(sql).arrow()
    assert session.last_execution_path == PATH_DUCKDB
    return fast, slow, path


def rows(table: pa.Table) -> list[str]:
    return sorted(repr(sorted(row.items())) for row in table.to_pylist())


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM ns.numbers",
        "SELECT name, id FROM ns.numbers WHERE grp = 3 AND id < 2500",
        "SELECT n.id AS k, NAME FROM wh.ns.numbers n WHERE name >= 'n39' AND grp IN (1, 2)",
        "SELECT grp FROM ns.numbers WHERE id BETWEEN 10 AND 20 AND name IS NOT NULL",
        "SELECT * FROM ns.events WHERE day = '2024-01-03'",
        "SELECT label, day FROM ns.events WHERE day >= DATE '2024-01-04' AND label <> 'e4'",
        "SELECT * FROM ns.deleted",  # positional deletes: pyiceberg's reader, still pass-through
        "SELECT id FROM ns.numbers WHERE name IS NULL",
        "SELECT id FROM ns.numbers WHERE NOT (grp = 3)",
        "SELECT id, name FROM ns.numbers WHERE grp NOT IN (1, 2) AND NOT (id NOT BETWEEN 10 AND 500)",
    ],
)
def test_pass_through_equals_duckdb(provider: LocalProvider, session_factory: SessionFactory, sql: str) -> None:
    fast, slow, path = both(session_factory(provider), sql)
    assert path == PATH_PASS_THROUGH
    assert fast.schema == slow.schema
    assert rows(fast) == rows(slow)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM ns.numbers ORDER BY id",
        "SELECT id FROM ns.numbers WHERE id > 2.5",
        "SELECT id FROM ns.numbers WHERE grp = '3'",
        "SELECT id FROM ns.numbers WHERE NOT (id > 2.5)",
        "SELECT id FROM ns.numbers WHERE id = (SELECT max(id) FROM ns.numbers)",
        "SELECT a.id FROM ns.numbers a JOIN ns.events b ON a.id = b.id",
        "SELECT id FROM ns.numbers USING SAMPLE 10 ROWS",
        "SELECT id FROM ns.numbers GROUP BY id",
        "SELECT id, row_number() OVER () FROM ns.numbers",
        "SELECT id FROM ns.numbers LIMIT 10 + 1",
        "SELECT id FROM ns.numbers LIMIT 10%",
        "SELECT id FROM ns.numbers QUALIFY row_number() OVER () < 3",
        "SELECT COLUMNS('i.*') FROM ns.numbers",
        "SELECT #1 FROM ns.numbers",
        "SELECT numbers FROM ns.numbers",
        "SELECT id FROM ns.numbers UNION ALL SELECT id FROM ns.numbers",
        "SELECT DISTINCT ON (grp) grp FROM ns.numbers",
    ],
)
def test_other_shapes_run_in_duckdb(provider: LocalProvider, session_factory: SessionFactory, sql: str) -> None:
    fast, slow, path = both(session_factory(provider), sql)
    assert path == PATH_DUCKDB
    assert fast.schema == slow.schema


def test_limit_counts_and_early_stop(provider: LocalProvider, session_factory: SessionFactory) -> None:
    session = session_factory(provider, max_files_in_flight=1, max_queued_batches=1)
    for sql, expected in [
        ("SELECT * FROM ns.numbers LIMIT 5", 5),
        ("SELECT * FROM ns.numbers LIMIT 5 OFFSET 3998", 2),
        ("SELECT id FROM ns.numbers WHERE grp = 1 LIMIT 1000", 800),
        ("SELECT id FROM ns.numbers OFFSET 3990", 10),
        ("SELECT id FROM ns.numbers LIMIT 0", 0),
    ]:
        fast, slow, path = both(session, sql)
        assert path == PATH_PASS_THROUGH
        assert fast.num_rows == slow.num_rows == expected, sql
        assert fast.schema == slow.schema
    session.pass_through = True
    assert session.sql("SELECT * FROM ns.numbers LIMIT 1").arrow().num_rows == 1
    progress = session.progress()
    assert progress is not None and progress["files_done"] < progress["files_total"] == 4


def test_reader_cuts_batches_and_result_reads_once(provider: LocalProvider, session_factory: SessionFactory) -> None:
    session = session_factory(provider)
    result = session.sql("SELECT id FROM ns.numbers WHERE grp = 0")
    batches = list(result.reader(batch_size=100))
    assert session.last_execution_path == PATH_PASS_THROUGH
    assert sum(b.num_rows for b in batches) == 800 and max(b.num_rows for b in batches) <= 100
    with pytest.raises(Exception, match="already been read"):
        result.arrow()


def test_a_like_on_a_dictionary_encoded_file_keeps_duckdbs_rows(
    write_provider: LocalProvider, session_factory: SessionFactory, tmp_path: Path
) -> None:
    """A Parquet file written from a dictionary array reads back dictionary-encoded through pyiceberg; the WHERE
    decodes the columns it reads (match_like has no dictionary kernel)."""
    table = write_provider.catalogs["wh"].create_table(
        "ns.coded", schema=pa.schema([("s", pa.string()), ("k", pa.int64())])
    )
    path = tmp_path / "coded.parquet"
    strings = pa.array(["ab", "b", None, "ab", "ä"]).dictionary_encode()
    pq.write_table(pa.table({"s": strings, "k": pa.array(range(5), pa.int64())}), path)
    table.add_files([str(path)])
    session = session_factory(write_provider)
    for sql in ["SELECT k FROM ns.coded WHERE s LIKE 'a%'", "SELECT k FROM ns.coded WHERE s NOT LIKE '_' OR s = 'b'"]:
        fast, slow, path_taken = both(session, sql)
        assert path_taken == PATH_PASS_THROUGH
        assert rows(fast) == rows(slow) and fast.num_rows > 0


def test_explain_names_the_path(provider: LocalProvider, session_factory: SessionFactory) -> None:
    session = session_factory(provider)
    explained = explain_sections(session.sql("EXPLAIN SELECT id FROM ns.numbers WHERE grp = 1 LIMIT 3").arrow())
    path = explained["wh.ns.numbers"]["execution_path"]
    assert path.startswith(PATH_PASS_THROUGH) and "LIMIT 3" in path
    explained = explain_sections(
        session.sql("EXPLAIN SELECT a.id FROM ns.numbers a JOIN ns.events b USING (id)").arrow()
    )
    assert {s["execution_path"] for s in explained.values()} == {PATH_DUCKDB}
    assert set(explained) == {"wh.ns.numbers", "wh.ns.events"}


def test_explain_names_the_metadata_path_of_a_bare_count(
    provider: LocalProvider, session_factory: SessionFactory
) -> None:
    """EXPLAIN says what the query does: a bare count is answered from manifest row counts, a filtered one scans."""
    session = session_factory(provider)
    explained = explain_sections(session.sql("EXPLAIN SELECT count(*) FROM ns.numbers").arrow())
    assert explained["wh.ns.numbers"]["execution_path"].startswith("metadata")
    assert session.sql("SELECT count(*) FROM ns.numbers").fetchall() == [(4000,)]
    assert session.last_execution_path == "metadata"
    explained = explain_sections(session.sql("EXPLAIN SELECT count(*) FROM ns.numbers WHERE grp = 1").arrow())
    assert not explained["wh.ns.numbers"]["execution_path"].startswith("metadata")
    analyzed = explain_sections(session.sql("EXPLAIN ANALYZE SELECT count(*) FROM ns.numbers").arrow())
    assert analyzed["wh.ns.numbers"]["execution_path"].startswith("duckdb (EXPLAIN ANALYZE profiles DuckDB")


# ------------------------------------------------------------------------------------- OFFSET / LIMIT logic


def _shape(limit: int | None, offset: int) -> PassThrough:
    return PassThrough(pa.schema([("v", pa.int64())]), ["v"], (0,), None, limit, offset)


class _Source:
    """Batches of 10 consecutive values; records whether the consumer closed it and how far it got."""

    def __init__(self, batches: int) -> None:
        self.closed = False
        self.pulled = 0
        self._batches = batches

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self

    def __next__(self) -> pa.RecordBatch:
        if self.pulled == self._batches:
            raise StopIteration
        self.pulled += 1
        start = (self.pulled - 1) * 10
        return pa.record_batch([pa.array(range(start, start + 10), pa.int64())], names=["v"])

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    ("limit", "offset", "expected", "pulled"),
    [
        (None, 0, list(range(50)), 5),
        (3, 0, [0, 1, 2], 1),
        (10, 0, list(range(10)), 1),
        (12, 5, list(range(5, 17)), 2),
        (None, 45, list(range(45, 50)), 5),
        (5, 100, [], 5),
        (0, 0, [], 0),
    ],
)
def test_offset_and_limit_stop_pulling(limit: int | None, offset: int, expected: list[int], pulled: int) -> None:
    source = _Source(5)
    out: list[Any] = [v for b in _shape(limit, offset).batches(source) for v in b.column(0).to_pylist()]
    assert out == expected
    assert source.pulled == pulled and source.closed


def test_batches_are_cut_to_max_rows() -> None:
    sizes = [b.num_rows for b in _shape(None, 0).batches(_Source(2), max_rows=4)]
    assert sizes == [4, 4, 2, 4, 4, 2]


def test_only_value_keeping_casts_are_allowed() -> None:
    assert _exact_cast(pa.large_string(), pa.string())
    assert _exact_cast(pa.large_binary(), pa.binary())
    assert _exact_cast(pa.timestamp("us", "UTC"), pa.timestamp("us", "Etc/UTC"))
    assert not _exact_cast(pa.timestamp("us"), pa.timestamp("us", "Etc/UTC"))
    assert not _exact_cast(pa.timestamp("ns", "UTC"), pa.timestamp("us", "UTC"))
    assert not _exact_cast(pa.binary(16), pa.binary())
    assert not _exact_cast(pa.large_string(), pa.large_binary())


def _planner(con: duckdb.DuckDBPyConnection | None = None) -> PassThroughPlanner:
    def no_tables(ref: object) -> Any:
        raise AssertionError("no table is resolved when probing export types")

    return PassThroughPlanner(con or connect_locked_down(), connect_locked_down(), no_tables)


def test_export_types_tell_apart_schemas_that_differ_only_in_field_metadata() -> None:
    plain = pa.schema([pa.field("u", pa.binary(16)), pa.field("n", pa.int32())])
    uuid = pa.schema(
        [pa.field("u", pa.binary(16), metadata={"ARROW:extension:name": "arrow.uuid"}), pa.field("n", pa.int32())]
    )
    assert plain == uuid  # pyarrow's equality ignores field metadata; DuckDB's export does not
    planner = _planner()
    assert planner.exported(plain).field("u").type == pa.binary()
    assert planner.exported(uuid).field("u").type == pa.string()
    assert planner.exported(plain).field("u").type == pa.binary()


def test_a_session_probes_each_schema_once() -> None:
    probed = pa.schema([pa.field("when", pa.timestamp("ns", "UTC")), pa.field("label", pa.large_string())])
    con = connect_locked_down()
    planner = _planner(con)
    first = planner.exported(probed)
    con.close()  # a further probe on this connection would fail
    assert planner.exported(probed) == first
    with pytest.raises(duckdb.ConnectionException, match="closed"):
        planner.exported(pa.schema([pa.field("never_probed", pa.int16())]))
