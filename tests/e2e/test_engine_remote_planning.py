"""Server-side scan planning from SQE (``[catalog] server_side_planning = true``) against the real catalog on moto.

The table has two data files: one holding only EU rows, one only US rows. A user whose row filter hides US rows
reads through the trusted reader; the catalog plans, prunes with that filter, and the US file never reaches SQE.
An unrestricted user's results through the catalog's plan equal local planning.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

import sqe.api
from sqe.session import Session
from tests.conftest import CatalogPrincipal, CatalogServer, pyiceberg_catalog, write_sqe_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROWS_EU = pa.table({"id": pa.array([1, 2], pa.int64()), "region": pa.array(["EU", "EU"])})
ROWS_US = pa.table({"id": pa.array([3, 4], pa.int64()), "region": pa.array(["US", "US"])})
EU_ONLY = {"required-row-filter": {"type": "eq", "left": {"type": "reference", "id": 2}, "right": "EU"}}


@dataclass
class Planned:
    namespace: str
    us_file: str
    eu_file: str
    analyst: Path
    writer_remote: Path
    writer_local: Path


@pytest.fixture(scope="module")
def planned(
    catalog_server: CatalogServer,
    engine_writer: CatalogPrincipal,
    catalog_reader: CatalogPrincipal,
    tmp_path_factory: pytest.TempPathFactory,
) -> Planned:
    workdir = tmp_path_factory.mktemp("remote_planning")
    suffix = uuid.uuid4().hex[:6]
    namespace = f"rplan_{suffix}"
    catalog = pyiceberg_catalog(catalog_server, engine_writer)
    catalog.create_namespace(namespace)
    table = catalog.create_table((namespace, "sales"), schema=ROWS_EU.schema)
    table.append(ROWS_EU)
    eu_file = next(iter(t.file.file_path for t in table.scan().plan_files()))
    table.append(ROWS_US)
    us_file = next(t.file.file_path for t in table.scan().plan_files() if t.file.file_path != eu_file)
    analyst = catalog_server.principal_with_grants(f"rp_analyst_{suffix}", [("TABLE_READ_DATA", namespace, None)])
    rules = workdir / "eu.json"
    rules.write_text(json.dumps(EU_ONLY), encoding="utf-8")
    target = ["--warehouse", catalog_server.warehouse, "--namespace", namespace, "--table", "sales"]
    catalog_server.admin_cli("set-restrictions", *target, "--principal", analyst.name, "--file", str(rules))
    reader = {"reader_client_id": catalog_reader.client_id, "reader_client_secret": catalog_reader.client_secret}
    remote = {"server_side_planning": True}
    moto = catalog_server.moto
    return Planned(
        namespace,
        us_file,
        eu_file,
        write_sqe_config(workdir / "analyst.toml", catalog_server.url, analyst, moto, catalog=reader | remote),
        write_sqe_config(workdir / "writer_remote.toml", catalog_server.url, engine_writer, moto, catalog=remote),
        write_sqe_config(workdir / "writer_local.toml", catalog_server.url, engine_writer, moto),
    )


def _planned_files(session: Session) -> set[str]:
    return {task.file.file_path for stream in session.last_streams for task in stream.plan.tasks}


def _remote_plans(session: Session) -> int:
    remote = session._remote
    return remote.plans if remote is not None else 0


def test_a_row_filtered_users_plan_never_holds_a_file_only_hidden_rows_match(planned: Planned) -> None:
    with sqe.api.connect(planned.analyst) as session:
        rows = sorted(session.sql(f"SELECT id, region FROM {planned.namespace}.sales").fetchall())
        assert rows == [(1, "EU"), (2, "EU")]
        assert _planned_files(session) == {planned.eu_file}
        # the user's own predicate selects only hidden rows: no file, no rows
        assert session.sql(f"SELECT id FROM {planned.namespace}.sales WHERE region = 'US'").fetchall() == []
        assert planned.us_file not in _planned_files(session)
        assert _remote_plans(session) == 2  # both scans planned by the catalog, not from manifests here


@pytest.mark.parametrize(
    "where", ["", "WHERE region = 'US'", "WHERE id <= 2", "WHERE id > 100"], ids=["all", "us", "low", "none"]
)
def test_an_unrestricted_users_results_equal_local_planning(planned: Planned, where: str) -> None:
    sql = f"SELECT id, region FROM {planned.namespace}.sales {where}"
    with sqe.api.connect(planned.writer_remote) as remote, sqe.api.connect(planned.writer_local) as local:
        through_catalog = sorted(remote.sql(sql).fetchall())
        remote_files = _planned_files(remote)
        planned_here = sorted(local.sql(sql).fetchall())
        local_files = _planned_files(local)
        assert _remote_plans(remote) == 1 and _remote_plans(local) == 0
    assert through_catalog == planned_here
    assert remote_files == local_files  # an unrestricted caller's filter prunes the same way in the catalog
