"""Time travel to a snapshot older than a column the required row filter reads, end to end, locally and on workers.

The filter is bound to field ids of the current schema. A snapshot written before its column existed (added since,
or dropped and added again under a new field id) holds no value of that field id: Iceberg reads it as the field's
``initial-default``, else null. Before, such a query failed with RestrictionApplyError ("field id N is not in the
data being read"); now the filter is evaluated on that value, with the expressions spec's two-valued logic. The
reference (``reference_keeps``, plain Python, none of SQE's code) evaluates every filter over the raw rows with
the absent field set to null or its default; SQE's rows and ``count(*)`` must equal it, in local and distributed
mode and with the catalog planning the files. The old snapshot's column of the same name (the dropped field id)
must never stand in for the filter's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DateType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
)

import sqe.api
from sqe.config import load_config
from sqe_catalog.cli import main as catalog_cli
from tests.conftest import write_sqe_config
from tests.e2e.test_distributed import TicketLog, WorkerPool, WorkerPools, coordinator_overrides, distributed_session
from tests.e2e.test_row_filter_reference import Node, compare, negated, reference_keeps

if TYPE_CHECKING:
    from sqe.session import Session
    from tests.conftest import CatalogPrincipal, CatalogServer, WorkerFactory

pytestmark = pytest.mark.e2e

Row = dict[str, Any]
OLD_ROWS: list[Row] = [  # three appends, three files, before the new column
    {"id": 0, "region": "EU"},
    {"id": 1, "region": "US"},
    {"id": 2, "region": None},
    {"id": 3, "region": "EU"},
    {"id": 4, "region": "UK"},
]
OLD_FILES = [OLD_ROWS[:2], OLD_ROWS[2:4], OLD_ROWS[4:]]
NEW_ROWS: list[Row] = [{"id": 5, "region": "EU"}, {"id": 6, "region": "US"}, {"id": 7, "region": None}]
NEW_REGION = 3  # the field id of ``region`` added again after ``region`` (field id 2) was dropped


def member(column: int, kind: str, values: list[Any]) -> Node:
    return {"type": kind, "child": {"type": "reference", "id": column}, "values": values}


def null_check(column: int, kind: str) -> Node:
    return {"type": kind, "child": {"type": "reference", "id": column}}


def filters_on(column: int) -> list[Node]:
    """Every leaf kind on ``column``, negations, and combinations with a column every snapshot has (id)."""
    return [
        compare(column, "eq", "EU"),
        compare(column, "not-eq", "EU"),
        compare(column, "lt", "F"),
        compare(column, "gt-eq", "F"),
        negated(compare(column, "lt", "F")),
        member(column, "in", ["EU", "US"]),
        member(column, "not-in", ["EU"]),
        compare(column, "starts-with", "E"),
        compare(column, "not-starts-with", "E"),
        null_check(column, "is-null"),
        null_check(column, "not-null"),
        {"type": "or", "left": compare(column, "eq", "EU"), "right": compare(1, "eq", 1)},
        {"type": "and", "left": compare(column, "not-eq", "US"), "right": compare(1, "gt-eq", 2)},
    ]


@dataclass
class Travel:
    server: CatalogServer
    writer: CatalogPrincipal
    reader: CatalogPrincipal  # the restricted end user
    engine: CatalogPrincipal  # the trusted reader acting for it
    pool: WorkerPool
    workdir: Path
    namespace: str

    def catalog(self) -> RestCatalog:
        return RestCatalog(
            "time-travel-writer",
            uri=self.server.url,
            warehouse=self.server.warehouse,
            credential=self.writer.credential,
            scope="PRINCIPAL_ROLE:ALL",
            **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
        )

    def restrict(self, table: str, document: dict[str, Any]) -> None:
        path = self.workdir / f"{table}.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        command = ["admin", "--config", str(self.server.config_path), "set-restrictions"]
        command += ["--warehouse", self.server.warehouse, "--namespace", self.namespace, "--table", table]
        command += ["--principal", self.reader.name, "--file", str(path)]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = catalog_cli(command)
        assert code == 0, err.getvalue()

    @contextlib.contextmanager
    def sessions(self) -> Iterator[tuple[dict[str, Session], TicketLog]]:
        """The restricted reader's sessions by mode: local, distributed (every scan on the workers) and local with
        the catalog planning the files (server-side planning)."""
        reader = {"reader_client_id": self.engine.client_id, "reader_client_secret": self.engine.client_secret}
        moto = self.server.moto
        path = write_sqe_config(self.workdir / "reader.toml", self.server.url, self.reader, moto, catalog=reader)
        remote = reader | {"server_side_planning": True}
        remote_path = write_sqe_config(self.workdir / "remote.toml", self.server.url, self.reader, moto, catalog=remote)
        local = sqe.api.connect(load_config(path, env={}))
        distributed = distributed_session(load_config(path, env={}, overrides=coordinator_overrides(self.pool)))
        planned = sqe.api.connect(load_config(remote_path, env={}))
        with local, distributed, planned:
            modes = {"local": local, "distributed": distributed, "server-side planning": planned}
            yield modes, TicketLog().attach(distributed)


@pytest.fixture(scope="module")
def travel(
    catalog_server: CatalogServer,
    catalog_reader: CatalogPrincipal,
    worker_process_factory: WorkerFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Travel]:
    suffix = uuid.uuid4().hex[:6]
    grants = [(p, None, None) for p in ("NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA")]
    writer = catalog_server.principal_with_grants(f"tt_writer_{suffix}", grants)
    reader = catalog_server.principal_with_grants(f"tt_reader_{suffix}", [("TABLE_READ_DATA", None, None)])
    pools = WorkerPools(worker_process_factory)
    try:
        with pytest.MonkeyPatch.context() as env:
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
                env.delenv(name, raising=False)
            env.setenv("AWS_EC2_METADATA_DISABLED", "true")
            workdir = tmp_path_factory.mktemp("time-travel-absent")
            world = Travel(
                catalog_server, writer, reader, catalog_reader, pools.pool(2), workdir, f"time_travel_{suffix}"
            )
            world.catalog().create_namespace(world.namespace)
            yield world
    finally:
        pools.stop_all()


def _append_files(table: Any, files: Sequence[Sequence[Row]]) -> Any:
    for rows in files:
        table.append(pa.Table.from_pylist(list(rows), schema=table.schema().as_arrow()))
        table = table.refresh()
    return table


def _readded_region(travel: Travel, name: str) -> int:
    """Table ``name``: OLD_FILES, then ``region`` dropped and added again (field id 3), then NEW_ROWS. Returns the
    snapshot of the last old file."""
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "region", StringType()))
    table = _append_files(travel.catalog().create_table((travel.namespace, name), schema=schema), OLD_FILES)
    before = table.current_snapshot()
    assert before is not None
    with table.update_schema() as update:
        update.delete_column("region")
    with table.update_schema() as update:
        update.add_column("region", StringType())
    assert table.refresh().schema().find_field("region").field_id == NEW_REGION
    _append_files(table.refresh(), [NEW_ROWS])
    return int(before.snapshot_id)


def _ids(session: Session, sql: str) -> list[int]:
    return sorted(session.sql(sql).arrow().column("id").to_pylist())


def _count(session: Session, sql: str) -> int:
    return int(session.sql(sql).arrow().column(0)[0].as_py())


def _answers(session: Session, source: str) -> tuple[list[tuple[int, Any]], int]:
    rows = sorted(session.sql(f"SELECT id, region FROM {source}").fetchall())
    return rows, _count(session, f"SELECT count(*) FROM {source}")


def test_a_filter_on_a_column_newer_than_the_snapshot_reads_it_as_null(travel: Travel) -> None:
    before = _readded_region(travel, "readded")
    table = f"{travel.namespace}.readded"
    old_source = f"{table} FOR VERSION AS OF {before}"
    names = {1: "id", NEW_REGION: "new_region"}
    # the old snapshot's rows hold no value of field id 3: null (their ``region`` is field id 2)
    old_reference = [{"id": row["id"], "new_region": None, "region": row["region"]} for row in OLD_ROWS]
    current_reference = [{"id": row["id"], "new_region": None} for row in OLD_ROWS]
    current_reference += [{"id": row["id"], "new_region": row["region"]} for row in NEW_ROWS]
    mismatches: list[tuple[str, Node, Any, Any]] = []
    with travel.sessions() as (modes, log):
        for row_filter in filters_on(NEW_REGION):
            travel.restrict("readded", {"required-row-filter": row_filter})
            kept = [row for row in old_reference if reference_keeps(row_filter, row, names)]
            expected_old = (sorted((row["id"], row["region"]) for row in kept), len(kept))
            expected_now = sorted(r["id"] for r in current_reference if reference_keeps(row_filter, r, names))
            for mode, session in modes.items():
                got_old = _answers(session, old_source)
                if got_old != expected_old:
                    mismatches.append((mode, row_filter, got_old, expected_old))
                got_now = _ids(session, f"SELECT id FROM {table}")
                if got_now != expected_now:
                    mismatches.append((f"{mode} current", row_filter, got_now, expected_now))
    assert mismatches == []
    assert log.tickets  # the distributed session's scans ran on the workers


def test_a_newer_filter_column_at_a_timestamp_and_with_a_mask(travel: Travel) -> None:
    # FOR TIMESTAMP AS OF lands on the same snapshot; a mask on the newer column has nothing to mask there (the
    # snapshot's ``region`` is field id 2, another column), while the current snapshot's values are masked.
    before = _readded_region(travel, "masked")
    table = f"{travel.namespace}.masked"
    snapshot = travel.catalog().load_table((travel.namespace, "masked")).snapshot_by_id(before)
    assert snapshot is not None
    at = dt.datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=dt.UTC).isoformat(sep=" ", timespec="milliseconds")
    row_filter = compare(NEW_REGION, "not-eq", "US")
    travel.restrict(
        "masked",
        {
            "required-row-filter": row_filter,
            "required-column-projections": [{"field-id": NEW_REGION, "action": "mask-alphanum"}],
        },
    )
    names = {1: "id", NEW_REGION: "new_region"}
    kept = [row for row in OLD_ROWS if reference_keeps(row_filter, {**row, "new_region": None}, names)]
    expected_old = sorted((row["id"], row["region"]) for row in kept)
    with travel.sessions() as (modes, log):
        for mode, session in modes.items():
            for clause in (f"FOR VERSION AS OF {before}", f"FOR TIMESTAMP AS OF TIMESTAMPTZ '{at}'"):
                assert _answers(session, f"{table} {clause}") == (expected_old, len(expected_old))
            if mode == "distributed":
                assert log.tickets  # the old snapshot's scans ran on the workers
            now = sorted(session.sql(f"SELECT id, region FROM {table} WHERE id >= 5").fetchall())
            assert now == [(5, "xx"), (7, None)]
    assert expected_old == [(0, "EU"), (1, "US"), (2, None), (3, "EU"), (4, "UK")]


def test_a_filter_on_a_column_added_with_an_initial_default(travel: Travel) -> None:
    # A column added with initial-default 'gold': the older snapshot's rows read it as 'gold', at that snapshot
    # exactly as at the current one (whose older files are read the same way).
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    created = travel.catalog().create_table((travel.namespace, "defaulted"), schema=schema)
    table = _append_files(created, [[{"id": 0}, {"id": 1}], [{"id": 2}]])
    before = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.add_column("tier", StringType(), default_value="gold")
    tier = table.refresh().schema().find_field("tier").field_id
    _append_files(table.refresh(), [[{"id": 3, "tier": "silver"}, {"id": 4, "tier": None}]])
    rows = [{"id": i, "tier": "gold"} for i in range(3)] + [{"id": 3, "tier": "silver"}, {"id": 4, "tier": None}]
    names = {1: "id", tier: "tier"}
    mismatches: list[tuple[str, Node, Any, Any]] = []
    with travel.sessions() as (modes, _log):
        for row_filter in filters_on(tier):
            travel.restrict("defaulted", {"required-row-filter": row_filter})
            expected_old = sorted(r["id"] for r in rows[:3] if reference_keeps(row_filter, r, names))
            expected_now = sorted(r["id"] for r in rows if reference_keeps(row_filter, r, names))
            for mode, session in modes.items():
                source = f"{travel.namespace}.defaulted"
                got = (
                    _ids(session, f"SELECT id FROM {source} FOR VERSION AS OF {before}"),
                    _count(session, f"SELECT count(*) FROM {source} FOR VERSION AS OF {before}"),
                    _ids(session, f"SELECT id FROM {source}"),
                )
                if got != (expected_old, len(expected_old), expected_now):
                    mismatches.append((mode, row_filter, got, (expected_old, len(expected_old), expected_now)))
    assert mismatches == []


# A column added with a date, time or timestamp initial-default, and the filter's JSON literal for that default.
TEMPORAL_DEFAULTS: list[tuple[str, Any, Any, str]] = [
    ("d", DateType(), dt.date(2024, 1, 2), "2024-01-02"),
    ("t", TimeType(), dt.time(3, 4, 5), "03:04:05"),
    ("ts", TimestampType(), dt.datetime(2024, 1, 2, 3, 4, 5), "2024-01-02T03:04:05"),
    ("tz", TimestamptzType(), dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "2024-01-02T03:04:05+00:00"),
]


def test_a_filter_equal_to_a_temporal_initial_default_keeps_the_older_files_rows(travel: Travel) -> None:
    # The rows of files written before the column was added hold its initial-default, so ``c = <default>`` keeps
    # them, at the older snapshot and at the current one alike. Before, the current read (and a snapshot that has
    # the column) kept none of them: pyiceberg's reader decided such a file by comparing the default as a Python
    # date/time/datetime with the literal as days/microseconds (never equal) and dropped the file's rows.
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    created = travel.catalog().create_table((travel.namespace, "temporal"), schema=schema)
    table = _append_files(created, [[{"id": 0}, {"id": 1}], [{"id": 2}]])
    before = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        for name, kind, default, _ in TEMPORAL_DEFAULTS:
            update.add_column(name, kind, default_value=default)
    newer = {"id": 3, "d": dt.date(2025, 1, 1), "t": dt.time(1, 0), "ts": dt.datetime(2025, 1, 1)}
    _append_files(table.refresh(), [[newer | {"tz": dt.datetime(2025, 1, 1, tzinfo=dt.UTC)}]])
    source = f"{travel.namespace}.temporal"
    mismatches: list[tuple[str, str, Any]] = []
    with travel.sessions() as (modes, _log):
        for name, _kind, _default, literal in TEMPORAL_DEFAULTS:
            travel.restrict("temporal", {"required-row-filter": {"type": "eq", "term": name, "value": literal}})
            for mode, session in modes.items():
                got = (
                    _ids(session, f"SELECT id FROM {source} FOR VERSION AS OF {before}"),
                    _ids(session, f"SELECT id FROM {source}"),
                    _count(session, f"SELECT count(*) FROM {source}"),
                )
                if got != ([0, 1, 2], [0, 1, 2], 3):
                    mismatches.append((mode, name, got))
        travel.restrict("temporal", {"required-row-filter": {"type": "gt-eq", "term": "id", "value": 0}})
        for mode, session in modes.items():  # the user's own WHERE on the default, pushed to the reader
            got_where = _ids(session, f"SELECT id FROM {source} WHERE d = DATE '2024-01-02'")
            if got_where != [0, 1, 2]:
                mismatches.append((mode, "WHERE d", got_where))
    assert mismatches == []
