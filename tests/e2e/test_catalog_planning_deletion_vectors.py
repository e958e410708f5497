"""Server-side scan planning of a format-v3 table whose deletion vectors share one Puffin file.

The table has two data files; ONE Puffin file holds a deletion vector for each, at different offsets. The
catalog's plan (``POST .../plan``) lists each vector as its own delete file with its ``referenced-data-file``,
``content-offset`` and ``content-size-in-bytes``, on the task of the data file it names; an engine planning
through the catalog reads exactly the rows (and holds each blob to exactly the entries) local planning does.
Real sqe-catalog on moto S3.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
import requests
from pyroaring import BitMap

from sqe.errors import DeleteFileLimitError, SQEError
from sqe.execution.cache import clear_process_caches
from sqe.execution.delete_limits import VectorEntry, task_vector_entries
from tests.conftest import pyiceberg_catalog
from tests.e2e.test_engine_manifest_limits import register_at_v3
from tests.e2e.test_engine_range_cache import session_for
from tests.unit.sqe.iceberg_local import add_deletion_vectors

if TYPE_CHECKING:
    from pathlib import Path

    from sqe.session import Session
    from tests.conftest import CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

ROWS = 100  # per data file: ids 0..99 in the first, 100..199 in the second
DELETED = {0: [0, 7], 1: [1, 2, 99]}  # positions deleted in each data file (by its index in append order)


def _table(workdir: Path, server: CatalogServer, stated: dict[int, int] | None = None) -> tuple[str, list[str], str]:
    """A v3 table of two data files, both with a deletion vector in one Puffin file (``stated``: a data file's
    entry misstates its vector's cardinality); its name, its data files in append order and the Puffin file."""
    ns = f"dvplan_{uuid.uuid4().hex[:6]}"
    catalog = pyiceberg_catalog(server, server.admin)
    catalog.create_namespace(ns)
    with session_for(workdir, server, server.admin) as session:
        session.sql(f"CREATE TABLE {ns}.events AS SELECT i AS id FROM range(0, {ROWS}) r(i)")
        [first] = [t.file.file_path for t in catalog.load_table((ns, "events")).scan().plan_files()]
        session.sql(f"INSERT INTO {ns}.events SELECT i AS id FROM range({ROWS}, {2 * ROWS}) r(i)")
    loaded = catalog.load_table((ns, "events"))
    files = [first, *(t.file.file_path for t in loaded.scan().plan_files() if t.file.file_path != first)]
    vectors = {files[i]: {0: BitMap(positions)} for i, positions in DELETED.items()}
    misstated = {files[i]: count for i, count in (stated or {}).items()}
    puffin, _ = add_deletion_vectors(loaded, vectors, misstated)
    register_at_v3(server, loaded)
    return f"{ns}.events", files, puffin


def _plan_json(server: CatalogServer, table: str) -> dict[str, Any]:
    ns, name = table.split(".")
    url = f"{server.url}/v1/{server.warehouse}/namespaces/{ns}/tables/{name}/plan"
    headers = {"Authorization": f"Bearer {server.token(server.admin)}"}
    planned = requests.post(url, json={}, headers=headers, timeout=60)
    assert planned.status_code == 200, planned.text
    body: dict[str, Any] = planned.json()
    assert body["status"] == "completed" and not body.get("plan-tasks")
    return body


def test_the_plan_lists_each_deletion_vector_of_one_puffin_file_with_its_offset_and_size(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    # Before: manifests were read as format v2's (no referenced data file, offset or size), and the plan's
    # delete files were told apart by path alone: both vectors became one entry, which every task referenced.
    table, files, puffin = _table(tmp_path, catalog_server)
    body = _plan_json(catalog_server, table)
    deletes = body["delete-files"]
    assert [d["file-path"] for d in deletes] == [puffin, puffin]
    by_file = {d["referenced-data-file"]: d for d in deletes}
    assert set(by_file) == set(files)
    # the blobs lie back to back after the 4-byte magic, in the order written
    first, second = by_file[files[0]], by_file[files[1]]
    assert first["content-offset"] == 4 and second["content-offset"] == 4 + first["content-size-in-bytes"]
    assert first["content-size-in-bytes"] > 12 and second["content-size-in-bytes"] > 12
    assert [first["record-count"], second["record-count"]] == [len(DELETED[0]), len(DELETED[1])]
    assert {d["content"] for d in deletes} == {"position-deletes"} and {d["file-format"] for d in deletes} == {"puffin"}
    # each data file's task references its own vector only
    for task in body["file-scan-tasks"]:
        [ref] = task["delete-file-references"]
        assert deletes[ref]["referenced-data-file"] == task["data-file"]["file-path"]


def _tasks(session: Session) -> list[Any]:
    return [task for stream in session.last_streams for task in stream.plan.tasks]


def _vector_entries(session: Session) -> dict[str, dict[str, VectorEntry]]:
    return task_vector_entries(_tasks(session))


def test_an_engine_planning_through_the_catalog_reads_what_local_planning_reads(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    # Before: the engine's tasks from the catalog's plan carried no deletion vector entry (pyiceberg's conversion
    # keeps none of the v3 fields), so no blob was held to its entry; locally, one of the two entries was lost.
    table, files, puffin = _table(tmp_path, catalog_server)
    sql = f"SELECT id FROM {table} WHERE id >= 0"
    expected = sorted(set(range(2 * ROWS)) - {0, 7, ROWS + 1, ROWS + 2, ROWS + 99})
    clear_process_caches()
    (tmp_path / "local").mkdir()
    with (
        session_for(tmp_path, catalog_server, catalog_server.admin, server_side_planning=True) as remote,
        session_for(tmp_path / "local", catalog_server, catalog_server.admin) as local,
    ):
        through_catalog = sorted(row[0] for row in remote.sql(sql).fetchall())
        remote_entries = _vector_entries(remote)
        assert remote._remote is not None and remote._remote.plans == 1
        planned_here = sorted(row[0] for row in local.sql(sql).fetchall())
        local_entries = _vector_entries(local)
    assert through_catalog == planned_here == expected
    assert set(remote_entries) == {puffin} and set(remote_entries[puffin]) == set(files)
    assert remote_entries == local_entries
    assert [remote_entries[puffin][f].positions for f in files] == [len(DELETED[0]), len(DELETED[1])]


@pytest.mark.parametrize(
    ("remote", "misstated"),
    [(True, 0), (True, 1), (False, 1)],  # locally, the first vector's entry was always the one kept (and checked)
    ids=["planned-by-catalog-first-vector", "planned-by-catalog-second-vector", "planned-locally-second-vector"],
)
def test_a_vector_whose_entry_misstates_its_cardinality_is_refused(
    catalog_server: CatalogServer, tmp_path: Path, misstated: int, remote: bool
) -> None:
    # Before: through the catalog's plan no blob was checked against its entry, so the rows were returned; planned
    # locally, only the entry read first survived (pyiceberg keeps one delete file per path), the other unchecked.
    table, _files, _puffin = _table(tmp_path, catalog_server, {misstated: len(DELETED[misstated]) + 1})
    clear_process_caches()
    planning = {"server_side_planning": True} if remote else {}
    session = session_for(tmp_path, catalog_server, catalog_server.admin, **planning)
    with session, pytest.raises(SQEError) as raised:
        session.sql(f"SELECT id FROM {table} WHERE id >= 0").fetchall()
    assert type(raised.value) is DeleteFileLimitError, raised.value
    stated = len(DELETED[misstated])
    assert str(raised.value) == (
        "cannot apply the scan's deletes: a deletion vector of the table names "
        f"{stated} positions, its delete-file entry {stated + 1}"
    )
