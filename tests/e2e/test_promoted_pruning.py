"""Pruning on columns promoted by schema evolution (float to double, int to long, decimal(5,2) to decimal(9,2)).

A file written before the promotion holds the narrower type: its column bounds are serialised in that type, and
its Parquet column too. Planning decodes each bound in the type it was written with (a float bound is four
bytes) and compares it in the table's type, so files whose bounds exclude the row filter (or a WHERE) are not
planned. A planned file written before the promotion is read with the filter narrowed to its own types (never
stronger than the exact one), so its row groups are pruned by their statistics; one whose row groups all fail
is not opened at all. Every row is still decided by the exact filter in the table's types (a float ``0.1f`` is
above the double ``0.1``), so each result is compared with pyarrow's filter over every row of the table.

A filter true on NaN (``is_nan``, ``<>``) is not used to prune row groups: pyarrow's statistics leave NaN out, so
it skipped a group holding NaN rows the filter keeps (``doubles``, a column never promoted).

Real sqe-catalog (restrictions set with its admin command), moto, and tables written by pyiceberg with two rows
per row group.
"""

from __future__ import annotations

import decimal
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.conversions import from_bytes
from pyiceberg.schema import Schema
from pyiceberg.types import DecimalType, DoubleType, FloatType, IntegerType, LongType, NestedField

import sqe.api
from sqe.config import CacheConfig, CatalogConfig, SQEConfig, StorageConfig, load_config
from sqe.execution.cache import clear_process_caches
from sqe.session import explain_sections
from tests.conftest import write_sqe_config
from tests.e2e.test_distributed import (
    TicketLog,
    WorkerPools,
    coordinator_overrides,
    distributed_session,
    worker_factory,  # noqa: F401  (the module-scoped pool fixture)
)
from tests.e2e.test_engine_footer_cache import MotoLog
from tests.e2e.test_restrictions_e2e import World, _principal, _pyiceberg

if TYPE_CHECKING:
    from pathlib import Path

    from sqe.session import Session
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e

NAN = float("nan")
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "x", FloatType(), required=False),
    NestedField(3, "n", IntegerType(), required=False),
    NestedField(4, "d", DecimalType(5, 2), required=False),
)
X, N, D = 2, 3, 4  # field ids of the promoted columns


def _rows(ids: list[int], xs: list[float | None], ns: list[int | None], ds: list[str | None]) -> dict[str, Any]:
    return {"id": ids, "x": xs, "n": ns, "d": [decimal.Decimal(v) if v is not None else None for v in ds]}


# Data files (two rows per row group), by name; the first five are written before the promotion.
BEFORE = {
    "low": _rows([1, 2], [0.5, 1.5], [1, 2], ["1.00", "2.00"]),
    "ten": _rows([3, 4], [10.5, 11.5], [10, 11], ["10.00", "11.00"]),
    # Two row groups far apart: the file's bounds span every range tested, no row group's does.
    "split": _rows([5, 6, 7, 8], [0.1, 2.5, 40.5, 41.5], [3, 4, 40, 41], ["3.00", "4.00", "40.00", "41.00"]),
    "nan": _rows([9, 10, 11, 12], [NAN, None, 20.5, NAN], [20, None, 21, 22], ["20.00", None, "21.00", "22.00"]),
    "nulls": _rows([13, 14], [None, None], [None, None], [None, None]),
}
AFTER = {
    "new": _rows([15, 16], [25.5, 26.5], [25, 26], ["25.00", "26.00"]),
    "wide": _rows([17, 18], [0.1, 1e300], [2**40, 5], ["1234567.89", "5.00"]),
}
# Never promoted: its second row group (20.5 and NaN) has statistics [20.5, 20.5], which leave the NaN out.
DOUBLES = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "x": pa.array([1.0, 2.0, 20.5, NAN], pa.float64())})
OLD_TYPES = pa.schema([("id", pa.int64()), ("x", pa.float32()), ("n", pa.int32()), ("d", pa.decimal128(5, 2))])
NEW_TYPES = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("n", pa.int64()), ("d", pa.decimal128(9, 2))])


@pytest.fixture(scope="module")
def world(catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    suffix = uuid.uuid4().hex[:6]
    principals = {
        "writer": _principal(
            catalog_server, f"prw_{suffix}", ["NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA"]
        ),
        **{who: _principal(catalog_server, f"pr{who}_{suffix}", ["TABLE_READ_DATA"]) for who in ("alice", "carol")},
    }
    namespace = f"promoted_{suffix}"
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        writer = _pyiceberg(catalog_server, principals["writer"])
        writer.create_namespace(namespace)
        table = writer.create_table(
            (namespace, "people"), schema=SCHEMA, properties={"write.parquet.row-group-limit": "2"}
        )
        for rows in BEFORE.values():
            table.append(pa.table(rows, schema=OLD_TYPES))
        with table.update_schema() as update:
            update.update_column("x", DoubleType())
            update.update_column("n", LongType())
            update.update_column("d", DecimalType(9, 2))
        table = writer.load_table((namespace, "people"))
        for rows in AFTER.values():
            table.append(pa.table(rows, schema=NEW_TYPES))
        doubles = writer.create_table(
            (namespace, "doubles"), schema=DOUBLES.schema, properties={"write.parquet.row-group-limit": "2"}
        )
        doubles.append(DOUBLES)
        reader_principal = catalog_server.create_principal(f"prengine_{suffix}", reader=True)
        yield World(catalog_server, namespace, tmp_path_factory.mktemp("promoted"), principals, reader_principal)


def everything() -> pa.Table:
    """Every row in the table's (promoted) types: what the exact filter is checked against."""
    parts = [pa.table(rows, schema=OLD_TYPES).cast(NEW_TYPES) for rows in BEFORE.values()]
    return pa.concat_tables([*parts, *(pa.table(rows, schema=NEW_TYPES) for rows in AFTER.values())])


def _ref(field_id: int) -> dict[str, Any]:
    return {"type": "reference", "id": field_id}


def _cmp(op: str, field_id: int, value: Any) -> dict[str, Any]:
    return {"type": op, "left": _ref(field_id), "right": value}


def _and(left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    return {"type": "and", "left": left, "right": right}


def open_session(world: World, who: str, cache: CacheConfig | None = None) -> Session:
    """``who``'s session as ``World.session`` opens it (the engine exchanges the token), with ``cache``."""
    principal, moto = world.principals[who], world.server.moto
    catalog = CatalogConfig(
        uri=world.server.url,
        warehouse=world.server.warehouse,
        client_id=principal.client_id,
        client_secret=principal.client_secret,
        reader_client_id=world.reader.client_id,
        reader_client_secret=world.reader.client_secret,
        access_delegation="vended-credentials",
        require_vended_credentials=True,
    )
    storage = StorageConfig(endpoint=moto.url, region=moto.region, path_style=True)
    return sqe.api.connect(SQEConfig(catalog=catalog, storage=storage, cache=cache or CacheConfig()))


def restricted_scan(world: World, row_filter: dict[str, Any]) -> tuple[list[int], int, Session]:
    """alice's ids under ``row_filter`` (a fresh session), the files her scan planned, and the open session."""
    world.restrict("alice", {"required-row-filter": row_filter})
    session = open_session(world, "alice")
    ids = [row[0] for row in session.sql(f"SELECT id FROM {world.namespace}.people ORDER BY id").fetchall()]
    [stream] = session.last_streams
    return ids, len(stream.plan.tasks), session


def expected_ids(mask: pa.ChunkedArray) -> list[int]:
    return sorted(everything().filter(mask).column("id").to_pylist())


# (row filter, the exact answer over every row as pyarrow computes it, files planned): 7 files in all.
ROW_FILTERS = [
    # ten, low: bounds below; nulls: only nulls; split, nan, new, wide: bounds overlap.
    pytest.param(
        _and(_cmp("gt", X, 15.0), _cmp("lt", X, 30.0)),
        lambda t: pc.and_(pc.greater(t["x"], 15.0), pc.less(t["x"], 30.0)),
        4,
        id="float-range",
    ),
    # 0.1f as a double is 0.10000000149011612 > 0.1: "split" holds it and its upper bound says so.
    pytest.param(_cmp("gt", X, 0.1), lambda t: pc.greater(t["x"], 0.1), 6, id="float-above-0.1"),
    pytest.param(_cmp("lt-eq", X, 0.1), lambda t: pc.less_equal(t["x"], 0.1), 1, id="float-at-most-0.1"),
    pytest.param(_cmp("eq", X, 0.1), lambda t: pc.equal(t["x"], 0.1), 1, id="float-equal-0.1"),
    pytest.param({"type": "is-nan", "term": _ref(X)}, lambda t: pc.is_nan(t["x"]), 6, id="float-is-nan"),
    pytest.param(_and(_cmp("gt-eq", N, 20), _cmp("lt-eq", N, 22)), None, 3, id="int-range"),
    pytest.param(_cmp("gt", N, 2**31), None, 1, id="int-beyond-int32"),
    pytest.param(_and(_cmp("gt", D, "15.00"), _cmp("lt", D, "30.00")), None, 4, id="decimal-range"),
]


@pytest.mark.parametrize(("row_filter", "exact", "planned"), ROW_FILTERS)
def test_a_row_filter_on_a_promoted_column_prunes_files_and_keeps_exactly_its_rows(
    world: World, row_filter: dict[str, Any], exact: Any, planned: int
) -> None:
    if exact is None:
        exact = _generic_exact(row_filter)
    clear_process_caches()
    ids, files, session = restricted_scan(world, row_filter)
    with session:
        assert ids == expected_ids(exact(everything()))
        assert files == planned


def _generic_exact(row_filter: dict[str, Any]) -> Any:
    """pyarrow's filter for an and/comparison tree of this module's documents, in the table's types."""
    ops = {"gt": pc.greater, "gt-eq": pc.greater_equal, "lt": pc.less, "lt-eq": pc.less_equal, "eq": pc.equal}
    names = {X: "x", N: "n", D: "d"}

    def build(t: pa.Table, node: dict[str, Any]) -> Any:
        if node["type"] == "and":
            return pc.and_(build(t, node["left"]), build(t, node["right"]))
        column = t[names[node["left"]["id"]]]
        value = node["right"]
        literal = pa.scalar(decimal.Decimal(value), column.type) if isinstance(value, str) else value
        return ops[node["type"]](column, literal)

    return lambda t: build(t, row_filter)


def test_an_old_file_whose_row_groups_all_fail_the_filter_is_not_read(world: World) -> None:
    """The file "split" was written before the promotion; its bounds (0.1 to 41.5) overlap 15 < x < 30, neither of its
    row groups' (0.1 to 2.5, 40.5 to 41.5) does. Read once (its footer is kept), a second scan sends no request
    for it: before, an old file was read whole and filtered after, whatever its statistics said. Without the
    range cache, so every read of a data file is a request to the store."""
    row_filter = _and(_cmp("gt", X, 15.0), _cmp("lt", X, 30.0))
    clear_process_caches()
    world.restrict("alice", {"required-row-filter": row_filter})
    log = MotoLog(world.server.moto.pid)
    with open_session(world, "alice", CacheConfig(data_bytes=0)) as session:
        query = f"SELECT id FROM {world.namespace}.people ORDER BY id"
        assert session.sql(query).fetchall() == [(11,), (15,), (16,)]
        [stream] = session.last_streams
        planned = {task.file.file_path: from_bytes(LongType(), task.file.lower_bounds[1]) for task in stream.plan.tasks}
        log.mark()
        assert session.sql(query).fetchall() == [(11,), (15,), (16,)]
        requested = {path for _, path in log.data_requests()}
    [split] = [path for path, first_id in planned.items() if first_id == 5]
    assert requested, "the other planned files are read"
    assert not [path for path in requested if split.endswith(path)], requested
    assert len(requested) == len(planned) - 1, (requested, planned)


def test_a_where_on_a_promoted_int_column_prunes_files(world: World) -> None:
    """An unrestricted reader's WHERE on ``n`` (int, now long) is pushed: EXPLAIN's files_planned counts only the
    files whose bounds (four-byte ints in the old files) overlap it, and the rows are exactly pyarrow's."""
    with open_session(world, "carol") as session:
        for where, planned, exact in [
            ("n >= 20 AND n <= 22", 3, lambda t: pc.and_(pc.greater_equal(t["n"], 20), pc.less_equal(t["n"], 22))),
            ("n BETWEEN 25 AND 40", 3, lambda t: pc.and_(pc.greater_equal(t["n"], 25), pc.less_equal(t["n"], 40))),
            ("n > 2147483647", 1, lambda t: pc.greater(t["n"], 2**31 - 1)),
            ("n = 41", 2, lambda t: pc.equal(t["n"], 41)),
        ]:
            sql = f"SELECT id FROM {world.namespace}.people WHERE {where} ORDER BY id"
            assert [row[0] for row in session.sql(sql).fetchall()] == expected_ids(exact(everything())), where
            section = next(iter(explain_sections(session.sql(f"EXPLAIN {sql}").arrow()).values()))
            assert section["files_planned"] == str(planned), where
            assert section["pushed_filter"].startswith("n "), where


@pytest.mark.parametrize(
    ("row_filter", "exact"),
    [
        ({"type": "is-nan", "term": _ref(X)}, lambda t: pc.is_nan(t["x"])),
        (_cmp("not-eq", X, 20.5), lambda t: pc.not_equal(t["x"], 20.5)),  # NaN <> 20.5 holds (no nulls here)
        ({"type": "not", "child": _cmp("lt", X, 2.0)}, lambda t: pc.invert(pc.less(t["x"], 2.0))),
    ],
    ids=["is-nan", "not-eq", "not-lt"],
)
def test_a_row_filter_true_on_nan_keeps_the_nan_rows_of_a_double_column(
    world: World, row_filter: dict[str, Any], exact: Any
) -> None:
    """pyarrow prunes a row group by statistics that leave NaN out: read with ``is_nan(x)`` (or ``x <> 20.5``,
    which the planner pushes as ``x <> 20.5 OR x IS NULL OR is_nan(x)``), the group of 20.5 and NaN was skipped
    and alice saw no NaN row. Files are now read without those parts of the filter; it still runs on every row."""
    clear_process_caches()
    world.restrict("alice", {"required-row-filter": row_filter}, table="doubles")
    with open_session(world, "alice") as session:
        ids = [row[0] for row in session.sql(f"SELECT id FROM {world.namespace}.doubles ORDER BY id").fetchall()]
    assert ids == sorted(DOUBLES.filter(exact(DOUBLES)).column("id").to_pylist())
    assert 4 in ids  # the NaN row


@pytest.mark.parametrize(
    ("table", "row_filter", "exact"),
    [
        ("people", _cmp("gt", X, 0.1), lambda t: pc.greater(t["x"], 0.1)),
        ("people", _cmp("lt-eq", X, 0.1), lambda t: pc.less_equal(t["x"], 0.1)),
        ("people", _cmp("gt", N, 2**31 - 1), lambda t: pc.greater(t["n"], 2**31 - 1)),
        ("people", {"type": "is-nan", "term": _ref(X)}, lambda t: pc.is_nan(t["x"])),
        ("doubles", _cmp("not-eq", X, 20.5), lambda t: pc.not_equal(t["x"], 20.5)),
    ],
    ids=["float-above-0.1", "float-at-most-0.1", "int-above-int32-max", "promoted-is-nan", "doubles-not-eq"],
)
def test_scan_workers_read_promoted_and_nan_rows_as_the_local_scan_does(
    world: World,
    worker_factory: WorkerPools,  # noqa: F811
    tmp_path: Path,
    table: str,
    row_filter: dict[str, Any],
    exact: Any,
) -> None:
    """Scan workers build their ReadSpec with the planner's build_read_spec from the ticket's metadata (every
    schema kept): an old file is read with the narrowed filter and NaN rows are not pruned away there either."""
    clear_process_caches()
    world.restrict("alice", {"required-row-filter": row_filter}, table=table)
    keys = {"reader_client_id": world.reader.client_id, "reader_client_secret": world.reader.client_secret}
    principal, moto = world.principals["alice"], world.server.moto
    path = write_sqe_config(tmp_path / "alice.toml", world.server.url, principal, moto, catalog=keys)
    config = load_config(path, env={}, overrides=coordinator_overrides(worker_factory.pool(2)))
    with distributed_session(config) as session:
        log = TicketLog().attach(session)
        sql = f"SELECT id FROM {world.namespace}.{table} ORDER BY id"
        ids = [row[0] for row in session.sql(sql).fetchall()]
    assert log.tickets, "the scan ran on the workers"
    rows = everything() if table == "people" else DOUBLES
    expected = sorted(rows.filter(exact(rows)).column("id").to_pylist())
    assert expected and ids == expected
