"""Server-side scan planning of ``sqe-catalog`` (``POST .../plan``, ``.../tasks``, ``GET``/``DELETE .../plan/{id}``)
with pyiceberg's REST planning client: plans per caller, the row filter of a restricted user prunes files, and no
file that only hidden rows match is ever planned for it."""

from __future__ import annotations

import json
import time
import uuid
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
import requests
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.rest.scan_planning import PlanTableScanRequest
from pyiceberg.expressions import EqualTo, NotEqualTo

from tests.conftest import pyiceberg_catalog
from tests.helpers.avro import avro_long

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

    from tests.conftest import CatalogPrincipal, CatalogServer, MotoServer

pytestmark = pytest.mark.e2e

ROWS_EU = pa.table({"id": pa.array([1, 2], pa.int64()), "region": pa.array(["EU", "EU"])})
ROWS_US = pa.table({"id": pa.array([3, 4], pa.int64()), "region": pa.array(["US", "US"])})
EU_ONLY = {"required-row-filter": {"type": "eq", "left": {"type": "reference", "id": 2}, "right": "EU"}}


def _table(server: CatalogServer, writer: CatalogPrincipal) -> tuple[str, list[str]]:
    ns = f"plan_{uuid.uuid4().hex[:6]}"
    catalog = pyiceberg_catalog(server, writer)
    catalog.create_namespace(ns)
    table = catalog.create_table((ns, "sales"), schema=ROWS_EU.schema)
    table.append(ROWS_EU)
    table.append(ROWS_US)  # two data files: one with only EU rows, one with only US rows
    files = [task.file.file_path for task in catalog.load_table((ns, "sales")).scan().plan_files()]
    assert len(files) == 2
    return ns, files


def _planner(server: CatalogServer, token: str) -> RestCatalog:
    return RestCatalog(
        f"planner-{uuid.uuid4().hex[:6]}",
        uri=server.url,
        warehouse=server.warehouse,
        token=token,
        **{"header.X-Gravitino-Client-Capabilities": "read-restrictions.v1"},
    )


def test_unrestricted_plan_prunes_with_the_callers_filter(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    ns, files = _table(catalog_server, engine_writer)
    planner = _planner(catalog_server, catalog_server.token(engine_writer))
    every = planner.plan_scan((ns, "sales"), PlanTableScanRequest())
    assert sorted(t.file.file_path for t in every) == sorted(files)
    us = planner.plan_scan((ns, "sales"), PlanTableScanRequest(filter=EqualTo("region", "US")))
    assert len(us) == 1 and us[0].file.file_path in files
    assert us[0].file.value_counts, "an unrestricted caller gets the column statistics"


def test_a_filter_listing_more_values_than_the_limit_is_refused_before_it_is_parsed(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    """Each in/not-in value costs the catalog microseconds to parse and bind: past MAX_PLAN_FILTER_VALUES the
    plan is a 400 naming the limit; at the limit it plans."""
    from sqe.vocabulary import MAX_PLAN_FILTER_VALUES

    ns, files = _table(catalog_server, engine_writer)
    url = f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces/{ns}/tables/sales/plan"
    headers = {"Authorization": f"Bearer {catalog_server.token(engine_writer)}"}
    regions = ["US", *(f"r{i}" for i in range(MAX_PLAN_FILTER_VALUES - 1))]
    at_limit = {"filter": {"type": "in", "term": "region", "values": regions}}
    planned = requests.post(url, json=at_limit, headers=headers, timeout=60)
    assert planned.status_code == 200, planned.text
    # pyiceberg prunes by statistics only with sets of at most 200 values: both files may match
    assert {t["data-file"]["file-path"] for t in planned.json()["file-scan-tasks"]} <= set(files)
    past = {"filter": {"type": "not", "child": {"type": "in", "term": "region", "values": [*regions, "EU"]}}}
    refused = requests.post(url, json=past, headers=headers, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["type"] == "BadRequestException" and "Traceback" not in refused.text
    assert f"list {MAX_PLAN_FILTER_VALUES + 1} values, more than {MAX_PLAN_FILTER_VALUES}" in error["message"]


def _or_of_equalities(values: list[str]) -> dict[str, Any]:
    """A balanced or-tree of ``region = value`` predicates: 2 * len(values) - 1 JSON objects."""
    if len(values) == 1:
        return {"type": "eq", "term": "region", "value": values[0]}
    half = len(values) // 2
    return {"type": "or", "left": _or_of_equalities(values[:half]), "right": _or_of_equalities(values[half:])}


def test_a_filter_with_more_predicates_than_the_limit_is_refused_before_it_is_parsed(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    """Found by review: an or-tree of equalities listed no in/not-in value, so it passed MAX_PLAN_FILTER_VALUES,
    yet each predicate costs far more to parse than a listed value (200,000 of them held a core for 34 s). Past
    MAX_PLAN_FILTER_PREDICATES objects the plan is a 400 naming the limit; within it, it plans."""
    from sqe.vocabulary import MAX_PLAN_FILTER_PREDICATES

    ns, files = _table(catalog_server, engine_writer)
    url = f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces/{ns}/tables/sales/plan"
    headers = {"Authorization": f"Bearer {catalog_server.token(engine_writer)}"}
    leaves = (MAX_PLAN_FILTER_PREDICATES + 1) // 2  # 2 * leaves - 1 objects: the limit (or one under it)
    regions = ["US", *(f"r{i}" for i in range(leaves - 1))]
    planned = requests.post(url, json={"filter": _or_of_equalities(regions)}, headers=headers, timeout=60)
    assert planned.status_code == 200, planned.text
    assert {t["data-file"]["file-path"] for t in planned.json()["file-scan-tasks"]} <= set(files)
    past = {"filter": _or_of_equalities([*regions, "EU"])}
    refused = requests.post(url, json=past, headers=headers, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["type"] == "BadRequestException" and "Traceback" not in refused.text
    assert f"more than {MAX_PLAN_FILTER_PREDICATES} (MAX_PLAN_FILTER_PREDICATES)" in error["message"]


def test_the_engines_plan_request_for_a_long_chain_of_conjuncts_plans_and_prunes(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    """Found by review: the engine left out a filter of more than 64 conjuncts (joined left-deep, one level each),
    so such a query planned every file. Balanced, 500 conjuncts (999 predicates, just under the limit the catalog
    counts) nest 10 levels: the catalog takes the engine's request and prunes with it."""
    from sqe.planning.planner import join_conjuncts
    from sqe.planning.remote import plan_request

    ns, files = _table(catalog_server, engine_writer)
    url = f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces/{ns}/tables/sales/plan"
    headers = {"Authorization": f"Bearer {catalog_server.token(engine_writer)}"}
    conjuncts = [EqualTo("region", "US"), *(NotEqualTo("region", f"r{i}") for i in range(499))]
    body = plan_request(join_conjuncts(conjuncts), ["id", "region"], None)
    planned = requests.post(url, json=body, headers=headers, timeout=60)
    assert planned.status_code == 200, planned.text
    tasks = planned.json()["file-scan-tasks"]
    assert len(tasks) == 1 and tasks[0]["data-file"]["file-path"] in files


def test_a_callers_plans_hold_at_most_max_plan_tasks_per_caller_tasks(tmp_path: Path, moto_server: MotoServer) -> None:
    """Stored plans keep every file task in memory: a new plan drops the caller's oldest plans once their tasks
    pass ``[server] max_plan_tasks_per_caller``, so repeated plans of a large table cannot fill the catalog."""
    from tests.conftest import restartable_catalog

    with restartable_catalog(tmp_path, moto_server, {}, max_plan_tasks_per_caller=3) as (server, _restart):
        ns, files = _table(server, server.admin)
        base = f"{server.url}/v1/{server.warehouse}/namespaces/{ns}/tables/sales/plan"
        headers = {"Authorization": f"Bearer {server.token(server.admin)}"}

        def plan() -> str:
            made = requests.post(base, json={}, headers=headers, timeout=60)
            assert made.status_code == 200 and len(made.json()["file-scan-tasks"]) == len(files), made.text
            return str(made.json()["plan-id"])

        first, second = plan(), plan()  # 2 + 2 tasks: past 3, the first plan makes room for the second
        gone = requests.get(f"{base}/{first}", headers=headers, timeout=60)
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "NoSuchPlanIdException"
        kept = requests.get(f"{base}/{second}", headers=headers, timeout=60)
        assert kept.status_code == 200 and len(kept.json()["file-scan-tasks"]) == len(files)


def _table_and_analyst(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, prefix: str
) -> tuple[str, CatalogPrincipal]:
    """A fresh sales table and a new principal who may read it."""
    ns, _files = _table(catalog_server, engine_writer)
    analyst = catalog_server.principal_with_grants(f"{prefix}_{uuid.uuid4().hex[:6]}", [("TABLE_READ_DATA", ns, None)])
    return ns, analyst


def _restrict_to_eu(catalog_server: CatalogServer, ns: str, analyst: CatalogPrincipal, tmp_path: Path) -> None:
    rules = tmp_path / "eu.json"
    rules.write_text(json.dumps(EU_ONLY), encoding="utf-8")
    target = ["--warehouse", catalog_server.warehouse, "--namespace", ns, "--table", "sales"]
    catalog_server.admin_cli("set-restrictions", *target, "--principal", analyst.name, "--file", str(rules))


def _through_reader(
    catalog_server: CatalogServer, analyst: CatalogPrincipal, reader: CatalogPrincipal
) -> dict[str, str]:
    """Headers of a call the reader makes for ``analyst``, declaring read-restrictions."""
    return {
        "Authorization": f"Bearer {catalog_server.delegated_token(analyst, reader)}",
        "X-Gravitino-Client-Capabilities": "read-restrictions.v1",
    }


def test_row_filtered_user_never_plans_hidden_files(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, catalog_reader: CatalogPrincipal, tmp_path: Path
) -> None:
    ns, analyst = _table_and_analyst(catalog_server, engine_writer, "eu")
    _restrict_to_eu(catalog_server, ns, analyst, tmp_path)

    # The analyst's own token is refused (restricted metadata only through a trusted reader).
    base = f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces/{ns}/tables/sales"
    own = {
        "Authorization": f"Bearer {catalog_server.token(analyst)}",
        "X-Gravitino-Client-Capabilities": "read-restrictions.v1",
    }
    assert requests.post(f"{base}/plan", json={}, headers=own, timeout=30).status_code == 403

    planner = _planner(catalog_server, catalog_server.delegated_token(analyst, catalog_reader))
    planned = planner.plan_scan((ns, "sales"), PlanTableScanRequest())
    assert len(planned) == 1, "the US-only file is pruned by the analyst's row filter"
    # Its own predicate on hidden rows never makes the hidden file appear, and stats are not handed out.
    hidden = planner.plan_scan((ns, "sales"), PlanTableScanRequest(filter=EqualTo("region", "US")))
    assert {t.file.file_path for t in hidden} == {t.file.file_path for t in planned}
    assert all(not t.file.lower_bounds and not t.file.value_counts for t in hidden)

    # Plans belong to their caller: GET and DELETE by id, a foreign caller gets 404.
    headers = _through_reader(catalog_server, analyst, catalog_reader)
    plan = requests.post(f"{base}/plan", json={}, headers=headers, timeout=30).json()
    assert plan["status"] == "completed" and len(plan["file-scan-tasks"]) == 1
    again = requests.get(f"{base}/plan/{plan['plan-id']}", headers=headers, timeout=30)
    assert again.status_code == 200 and again.json()["file-scan-tasks"] == plan["file-scan-tasks"]
    admin = {"Authorization": f"Bearer {catalog_server.token(catalog_server.admin)}"}
    assert requests.get(f"{base}/plan/{plan['plan-id']}", headers=admin, timeout=30).status_code == 404
    assert requests.delete(f"{base}/plan/{plan['plan-id']}", headers=headers, timeout=30).status_code == 204
    assert requests.get(f"{base}/plan/{plan['plan-id']}", headers=headers, timeout=30).status_code == 404


def test_a_plan_made_before_a_restriction_is_not_served_after_it(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, catalog_reader: CatalogPrincipal, tmp_path: Path
) -> None:
    ns, analyst = _table_and_analyst(catalog_server, engine_writer, "late")
    base = f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces/{ns}/tables/sales"
    headers = _through_reader(catalog_server, analyst, catalog_reader)
    us_filter = {"type": "eq", "term": "region", "value": "US"}
    plan = requests.post(f"{base}/plan", json={"filter": us_filter}, headers=headers, timeout=30).json()
    [task] = plan["file-scan-tasks"]  # unrestricted yet: the US-only file, with its statistics
    assert task["data-file"].get("value-counts")

    _restrict_to_eu(catalog_server, ns, analyst, tmp_path)

    # Now restricted to EU rows: the plan of the hidden US file (and its statistics) is no longer the caller's.
    later = requests.get(f"{base}/plan/{plan['plan-id']}", headers=headers, timeout=30)
    assert later.status_code == 404, later.text
    assert later.json()["error"]["type"] == "NoSuchPlanIdException"


# ---------------------------------------------------------------------------------------------------------
# Manifest lists and manifests planning reads are bounded, stored and inflated (sqe.planning.avro_limits)


def _deflate_bomb(real: bytes, inflated: int) -> bytes:
    """The Avro file ``real`` (its header: schema, deflate codec, sync marker) with one block that inflates past
    ``inflated`` bytes instead of its own: a few hundred KiB stored."""
    sync = real[-16:]  # every block ends with the header's sync marker
    header = real[: real.index(sync) + len(sync)]
    assert b"deflate" in header
    packer = zlib.compressobj(1, zlib.DEFLATED, -15)  # raw deflate, as Avro's deflate codec
    chunk = b"a" * (1 << 20)
    block = b"".join([*(packer.compress(chunk) for _ in range(inflated // len(chunk) + 1)), packer.flush()])
    return header + avro_long(1) + avro_long(len(block)) + block + sync


def _oversized_or_bomb(case: str, real: bytes) -> tuple[bytes, str]:
    """The file's new content and how the refusal names the limit it passes."""
    from sqe.planning.avro_limits import MAX_MANIFEST_BYTES, MAX_MANIFEST_DECOMPRESSED_BYTES

    if case == "stored":
        return b"\0" * (MAX_MANIFEST_BYTES + 1), f"holds more than {MAX_MANIFEST_BYTES} bytes (MAX_MANIFEST_BYTES)"
    limit = MAX_MANIFEST_DECOMPRESSED_BYTES
    return _deflate_bomb(real, limit), f"inflates to more than {limit} bytes (MAX_MANIFEST_DECOMPRESSED_BYTES)"


def swap_manifest(server: CatalogServer, writer: CatalogPrincipal, table: tuple[str, str], kind: str, case: str) -> str:
    """Overwrite the table's manifest list or first manifest (a plain S3 write, as its writer could); the text
    naming the limit it passes."""
    loaded = pyiceberg_catalog(server, writer).load_table(table)
    snapshot = loaded.current_snapshot()
    assert snapshot is not None
    target = snapshot.manifest_list if kind == "manifest list" else snapshot.manifests(loaded.io)[0].manifest_path
    bucket, _, key = target.removeprefix("s3://").partition("/")
    s3 = server.moto.client("s3")
    data, limit = _oversized_or_bomb(case, s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    return limit


@pytest.mark.parametrize("case", ["stored", "inflated"])
@pytest.mark.parametrize("kind", ["manifest list", "manifest"])
def test_planning_refuses_manifests_past_the_limits_unread(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, kind: str, case: str
) -> None:
    # Before: pyiceberg read a manifest list or manifest whole, and inflated each block whole, whatever its size.
    ns, _files = _table(catalog_server, engine_writer)
    limit = swap_manifest(catalog_server, engine_writer, (ns, "sales"), kind, case)
    url = f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces/{ns}/tables/sales/plan"
    headers = {"Authorization": f"Bearer {catalog_server.token(engine_writer)}"}
    refused = requests.post(url, json={}, headers=headers, timeout=120)
    assert refused.status_code == 422, refused.text[:500]
    error = refused.json()["error"]
    assert error["type"] == "UnprocessableEntityException", error
    assert error["message"] == f"cannot plan this scan: a {kind} of the table {limit}"


def _cleanup_tasks(server: CatalogServer) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = json.loads(server.admin_cli("list-cleanup-tasks"))
    return tasks


def _two_appends(server: CatalogServer, writer: CatalogPrincipal) -> tuple[str, list[str], Table, Snapshot]:
    """``_table``'s table as pyiceberg loads it, and its current snapshot."""
    ns, files = _table(server, writer)
    table = pyiceberg_catalog(server, writer).load_table((ns, "sales"))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return ns, files, table, snapshot


def _bomb_and_purge(server: CatalogServer, ns: str, manifest: str) -> tuple[str, set[str]]:
    """Turn ``manifest`` into an inflation bomb, drop the table with purge and wait for the cleaner: the limit
    the refusal names and the objects left under the table."""
    bucket, _, key = manifest.removeprefix("s3://").partition("/")
    s3 = server.moto.client("s3")
    bomb, limit = _oversized_or_bomb("inflated", s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    s3.put_object(Bucket=bucket, Key=key, Body=bomb)
    url = f"{server.url}/v1/{server.warehouse}/namespaces/{ns}/tables/sales"
    headers = {"Authorization": f"Bearer {server.token(server.admin)}"}
    dropped = requests.delete(url, params={"purgeRequested": "true"}, headers=headers, timeout=60)
    assert dropped.status_code == 204, dropped.text
    deadline = time.monotonic() + 60
    while any(t["namespace"] == ns and t["status"] in ("pending", "running") for t in _cleanup_tasks(server)):
        assert time.monotonic() < deadline, "the cleaner did not finish the purge"
        time.sleep(0.25)
    remaining = s3.list_objects_v2(Bucket=bucket, Prefix=key.rsplit("/metadata/", 1)[0])
    return limit, {f"s3://{bucket}/{o['Key']}" for o in remaining.get("Contents", [])}


def test_a_purge_reads_manifests_no_further_than_planning(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    # Before: the catalog's cleaner read and inflated a manifest of any size to list the files it deletes.
    ns, files, table, snapshot = _two_appends(catalog_server, engine_writer)
    manifests = [m.manifest_path for m in snapshot.manifests(table.io)]
    limit, left = _bomb_and_purge(catalog_server, ns, manifests[0])
    expected = (
        f"could not read a manifest: files it names are not purged: a manifest list or manifest of the table {limit}"
    )
    assert expected in catalog_server.log_path.read_text()
    # the other manifest's data file is deleted; the refused one's is left, never the purge's failure
    assert len(left & set(files)) == 1


def test_a_purge_refusing_one_manifest_still_deletes_the_files_the_next_manifest_names(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    # Before: a refused manifest stopped the reading of its whole manifest list, so the files the manifests listed
    # after it named were left too (here no older snapshot lists them again: it was expired).
    ns, files, table, current = _two_appends(catalog_server, engine_writer)
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in table.snapshots() if s != current]).commit()
    assert len(pyiceberg_catalog(catalog_server, engine_writer).load_table((ns, "sales")).snapshots()) == 1
    refused, kept = current.manifests(table.io)
    kept_files = {entry.data_file.file_path for entry in kept.fetch_manifest_entry(table.io)}
    _limit, left = _bomb_and_purge(catalog_server, ns, refused.manifest_path)
    assert kept_files and not kept_files & left, "the next manifest's data file is deleted"
    assert len(left & set(files)) == 1, "only the refused manifest's data file is left"
