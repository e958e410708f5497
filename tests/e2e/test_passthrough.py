"""Pass-through queries end to end (issue 11 item 1): the same statement streamed from the scan and forced through
DuckDB gives the same result, on real tables served by ``sqe-catalog`` on moto, restricted ones included.

``people`` (six rows, four data files) is read by alice, restricted like ``test_restrictions_e2e``'s alice (only
``region = 'EU'`` rows; ``email`` mask-alphanum, ``ssn`` replace-with-null), and by carol, unrestricted.
``typed`` holds one column of most Iceberg primitive types. A WHERE on a masked column must see masked values,
exactly as DuckDB does: the row filter on raw values, then the masks, then the user's predicates.
"""

from __future__ import annotations

import datetime
import decimal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from sqe.catalog.rest import RestTableProvider
from sqe.errors import QueryError
from sqe.execution.passthrough import PATH_DUCKDB, PATH_PASS_THROUGH
from sqe.session import Session, explain_sections
from tests.e2e.test_restrictions_e2e import ALICE, PEOPLE, World, _principal, _pyiceberg

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e

TYPED = pa.table(
    {
        "i": pa.array([1, 2, None, 4], pa.int32()),
        "l": pa.array([10, None, 30, 40], pa.int64()),
        "f": pa.array([1.5, float("nan"), None, -0.0], pa.float64()),
        "s": pa.array(["a", "b", None, "é"], pa.string()),
        "b": pa.array([True, False, None, True], pa.bool_()),
        "d": pa.array([datetime.date(2024, 1, 1), None, datetime.date(2024, 3, 1), datetime.date(1970, 1, 1)]),
        "ts": pa.array([1, 2, None, 4_000_000], pa.timestamp("us", tz="UTC")),
        "tn": pa.array([1, None, 3, 4], pa.timestamp("us")),
        "bin": pa.array([b"\x00", None, b"xy", b""], pa.binary()),
        "dec": pa.array([decimal.Decimal(v) if v else None for v in ("1.25", "", "-3.50", "0")], pa.decimal128(9, 2)),
        "fx": pa.array([b"abcd", b"efgh", None, b"ijkl"], pa.binary(4)),
    }
)


@pytest.fixture(scope="module")
def world(catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    suffix = uuid.uuid4().hex[:6]
    principals = {
        "writer": _principal(
            catalog_server, f"ptw_{suffix}", ["NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA"]
        ),
        **{who: _principal(catalog_server, f"pt{who}_{suffix}", ["TABLE_READ_DATA"]) for who in ("alice", "carol")},
    }
    namespace = f"passthru_{suffix}"
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        writer = _pyiceberg(catalog_server, principals["writer"])
        writer.create_namespace(namespace)
        people = writer.create_table((namespace, "people"), schema=PEOPLE.schema)
        for start in range(0, PEOPLE.num_rows, 2):  # several data files: LIMIT can stop before the last one
            people.append(PEOPLE.slice(start, 2))
        writer.create_table((namespace, "typed"), schema=TYPED.schema).append(TYPED)
        reader_principal = catalog_server.create_principal(f"ptengine_{suffix}", reader=True)
        world = World(catalog_server, namespace, tmp_path_factory.mktemp("passthru"), principals, reader_principal)
        world.restrict("alice", ALICE)
        yield world


def both_paths(session: Session, sql: str) -> tuple[pa.Table, pa.Table, str]:
    """The statement's result with pass-through allowed and with DuckDB forced; and the path the first took."""
    session.pass_through = True
    fast = session.sql(sql).arrow()
    path = session.last_execution_path
    session.pass_through = False
    slow = session.sql(sql).arrow()
    assert session.last_execution_path == PATH_DUCKDB
    session.pass_through = True
    return fast, slow, path


def same_rows(a: pa.Table, b: pa.Table) -> bool:
    """Equal as multisets of rows (neither path promises an order without ORDER BY); NaN equals NaN."""

    def key(row: dict[str, object]) -> str:
        return repr(sorted((k, repr(v)) for k, v in row.items()))

    return sorted(map(key, a.to_pylist())) == sorted(map(key, b.to_pylist()))


# On ``typed.f`` (1.5, NaN, NULL, -0.0): DuckDB orders NaN above every number and finds -0.0 in (0.0).
DOUBLE_WHERES = ["f > 1", "f >= 1.5", "f IN (0.0, 2)", "NOT (f <= 1.5)", "f NOT IN (-0.0)", "f < 1e308"]
PASS_THROUGH_QUERIES = [
    "SELECT * FROM {t}",
    "SELECT name, id FROM {t} WHERE amount > 60 AND region IN ('EU', 'UK')",
    "SELECT id AS ident, p.name, ID FROM {t} AS p WHERE email IS NOT NULL",
    "SELECT p.* FROM {t} p WHERE amount BETWEEN 50 AND 250 AND name <> 'ada'",
    "SELECT region FROM {t} WHERE 100 <= amount",
    "SELECT id FROM {t} WHERE name = 'ada' OR id = 3",
    "SELECT id, name FROM {t} WHERE (region = 'US' OR amount < 100) AND (email IS NULL OR id IN (1, 2, 3))",
    "SELECT id FROM {t} WHERE NOT (name = 'ada' OR id = 3)",
    "SELECT id FROM {t} WHERE amount NOT IN (100, 250) AND email NOT IN ('x@example.com')",
    "SELECT id, email FROM {t} WHERE email LIKE '%@%.%' AND name NOT LIKE 'a_a'",  # alice: masked emails
]
DUCKDB_QUERIES = [
    "SELECT * FROM {t} ORDER BY id LIMIT 2",
    "SELECT DISTINCT region FROM {t}",
    "SELECT id FROM {t} WHERE amount > 1.5",
    "SELECT id FROM {t} WHERE lower(name) = 'ada'",
    "SELECT id FROM {t} WHERE NOT (lower(name) = 'ada')",
    "SELECT id + 1 AS next FROM {t}",
    "SELECT * EXCLUDE (ssn) FROM {t}",
    "SELECT count(id) FROM {t}",
    "WITH c AS (SELECT * FROM {t}) SELECT * FROM c",
    "SELECT id FROM {t} WHERE amount NOT BETWEEN 1.5 AND 100",
]


@pytest.mark.parametrize("who", ["carol", "alice"])
@pytest.mark.parametrize("query", PASS_THROUGH_QUERIES)
def test_pass_through_results_equal_duckdb(world: World, who: str, query: str) -> None:
    with world.session(who) as session:
        fast, slow, path = both_paths(session, query.format(t=f"{world.namespace}.people"))
    assert path == PATH_PASS_THROUGH
    assert fast.schema == slow.schema  # names, order, types, nullability, metadata
    assert same_rows(fast, slow)


@pytest.mark.parametrize("query", DUCKDB_QUERIES)
def test_other_statements_still_run_in_duckdb(world: World, query: str) -> None:
    with world.session("alice") as session:
        fast, slow, path = both_paths(session, query.format(t=f"{world.namespace}.people"))
    assert path == PATH_DUCKDB
    assert fast.schema == slow.schema and same_rows(fast, slow)


def test_user_predicates_on_masked_columns_see_masked_values(world: World) -> None:
    """alice's email is masked: the WHERE compares the masked value, never the raw one; ssn is all NULL."""
    t = f"{world.namespace}.people"
    cases = {
        f"SELECT id FROM {t} WHERE email = 'xxx@xxxxxxx.xxx'": [1],
        f"SELECT id FROM {t} WHERE email = 'ada@example.com'": [],
        f"SELECT id, ssn FROM {t} WHERE ssn IS NULL": [1, 3, 6],
        f"SELECT id FROM {t} WHERE ssn = '111-22-3333'": [],
        f"SELECT id FROM {t} WHERE region = 'US'": [],  # the row filter runs first
        f"SELECT id FROM {t} WHERE email IN ('xxxxx@xxxxxx.xxx', 'linus@kernel.org')": [3],
    }
    with world.session("alice") as session:
        for sql, ids in cases.items():
            fast, slow, path = both_paths(session, sql)
            assert path == PATH_PASS_THROUGH, sql
            assert sorted(fast.column("id").to_pylist()) == ids == sorted(slow.column("id").to_pylist()), sql
            assert fast.schema == slow.schema


@pytest.mark.parametrize("who", ["carol", "alice"])
def test_limit_and_offset_counts(world: World, who: str) -> None:
    t = f"{world.namespace}.people"
    visible = 6 if who == "carol" else 3
    with world.session(who) as session:
        everything = session.sql(f"SELECT * FROM {t}").arrow()
        for limit, offset in [(0, 0), (1, 0), (2, 1), (100, 0), (2, 5), (3, 2)]:
            sql = f"SELECT * FROM {t} LIMIT {limit} OFFSET {offset}"
            fast, slow, path = both_paths(session, sql)
            assert path == PATH_PASS_THROUGH
            expected = max(0, min(limit, visible - offset))
            assert fast.num_rows == slow.num_rows == expected, sql
            assert fast.schema == slow.schema == everything.schema
            assert set(map(str, fast.to_pylist())) <= set(map(str, everything.to_pylist()))


def test_limit_stops_the_scan_early(world: World) -> None:
    """Three data files, one reader, one queued batch: LIMIT 1 closes the scan after its first batch, so the
    last file is never finished and the reader thread is gone once the result is read."""
    with world.session("carol") as probe:
        config = probe.config
    assert config is not None
    session = Session(RestTableProvider(config), config, max_files_in_flight=1, max_queued_batches=1)
    with session:
        assert session.sql(f"SELECT * FROM {world.namespace}.people LIMIT 1").arrow().num_rows == 1
        assert session.last_execution_path == PATH_PASS_THROUGH
        progress = session.progress()
        assert progress is not None and progress["files_total"] == 3
        assert progress["files_done"] < 3
        deadline = time.monotonic() + 5
        while _scan_threads(world.namespace) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _scan_threads(world.namespace)


def _scan_threads(namespace: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sqe-scan-") and namespace in t.name]


def test_types_match_duckdb_whichever_path_runs(world: World) -> None:
    """Every column type comes out as DuckDB would export it (strings 32-bit, timestamptz in the session's
    zone); a column DuckDB would convert otherwise (decimal, fixed) still gives DuckDB's result."""
    t = f"{world.namespace}.typed"
    queries = [
        f"SELECT * FROM {t}",
        f"SELECT i, l, s, b, d, ts, tn, bin FROM {t}",
        f"SELECT s, i FROM {t} WHERE i > 1 AND s >= 'b' AND b = true",
        f"SELECT d, l FROM {t} WHERE d = DATE '2024-03-01' OR d IS NULL",
        f"SELECT d, l FROM {t} WHERE d >= '2024-01-01' AND l IN (10, 30, 3000000000)",
        f"SELECT f FROM {t} WHERE f IS NOT NULL",
        f"SELECT i FROM {t} WHERE i IN (1, 3000000000)",
    ]
    doubles = [f"SELECT i, f FROM {t} WHERE {where}" for where in DOUBLE_WHERES]
    with world.session("carol") as session:
        paths = {}
        for sql in queries:
            fast, slow, paths[sql] = both_paths(session, sql)
            assert fast.schema == slow.schema, sql
            assert same_rows(fast, slow), sql
        for sql in doubles:
            fast, slow, path = both_paths(session, sql)
            assert path == PATH_PASS_THROUGH, sql
            assert fast.schema == slow.schema and same_rows(fast, slow), sql
    assert paths[queries[1]] == paths[queries[2]] == paths[queries[5]] == PATH_PASS_THROUGH
    assert paths[queries[3]] == paths[queries[4]] == PATH_PASS_THROUGH  # an OR of simple conditions qualifies
    assert paths[queries[6]] == PATH_DUCKDB  # an IN constant outside the int column's range


def test_explain_names_the_path(world: World) -> None:
    t = f"{world.namespace}.people"
    with world.session("alice") as session:
        fast = explain_sections(session.sql(f"EXPLAIN SELECT id FROM {t} WHERE email = 'x' LIMIT 3").arrow())
        slow = explain_sections(session.sql(f"EXPLAIN SELECT id FROM {t} ORDER BY id").arrow())
        analysed = explain_sections(session.sql(f"EXPLAIN ANALYZE SELECT id FROM {t}").arrow())
        session.pass_through = False
        forced = explain_sections(session.sql(f"EXPLAIN SELECT id FROM {t}").arrow())
    label = f"{world.server.warehouse}.{t}"
    assert fast[label]["execution_path"].startswith(PATH_PASS_THROUGH + " (")
    assert "LIMIT 3 stops the scan" in fast[label]["execution_path"]
    assert slow[label]["execution_path"] == PATH_DUCKDB
    assert analysed[label]["execution_path"].startswith("duckdb (EXPLAIN ANALYZE profiles DuckDB")
    assert forced[label]["execution_path"] == PATH_DUCKDB


def test_pass_through_result_reads_once_and_in_batches(world: World) -> None:
    t = f"{world.namespace}.people"
    with world.session("carol") as session:
        result = session.sql(f"SELECT id, name FROM {t}")
        batches = list(result.reader(batch_size=1))
        assert session.last_execution_path == PATH_PASS_THROUGH
        assert sum(b.num_rows for b in batches) == 6 and all(b.num_rows == 1 for b in batches)
        with pytest.raises(QueryError, match="already been read"):
            result.arrow()
        stale = session.sql(f"SELECT id FROM {t}")
        session.sql(f"SELECT name FROM {t}")
        with pytest.raises(QueryError, match="no longer valid"):
            stale.arrow()
