"""A claim of places that keeps losing to other catalog processes' claims, against the real ``sqe-catalog``.

Every claim (create, stage-create, register, a commit that moves a table, a view create or replace) records its
places in a transaction that also advances the warehouse's claim counter from the value it read before its
checks; another process's claim committing meanwhile makes it roll back (``ClaimRaced``) and try again. Here that
rival is made certain, not timed: SQLite triggers on the catalog's database advance the counter whenever a claim
writes its record (``rival_claims``), as another process's claim committing right then would. So every attempt
loses, and what the catalog answers once it gives up is what is tested:

- on a commit (table commit, create transaction, view replace) 409 ``CommitFailedException``: nothing was
  committed, and Iceberg clients retry that on a fresh base; a 5xx there means "commit state unknown" to them
  (neither retried nor cleaned up);
- on a create (table create, stage-create, register, view create), where clients read 409 as "already exists",
  503 ``ServiceUnavailableException`` with ``Retry-After`` (Iceberg's Java client retries it by itself).

Either way nothing is left behind: no table, no metadata file, no place kept, and the same call succeeds once the
rival is gone.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
import requests
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from sqe_catalog.contention import MAX_ATTEMPTS, MIN_ATTEMPTS
from tests.conftest import pyiceberg_catalog
from tests.e2e.test_catalog_integrity import legacy_table
from tests.helpers.catalog_api import WarehouseApi
from tests.helpers.waiting import wait_until

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
CONTENTION = "kept being claimed concurrently by other catalog processes"
ATTEMPTS = re.compile(r"\((\d+) attempts\)")
# Where each kind of claim writes its record (then advances the claim counter, in the same transaction).
CLAIM_RECORDS = ("iceberg_tables", "sqe_catalog_views", "sqe_reserved_table_locations")


@contextlib.contextmanager
def rival_claims(server: CatalogServer) -> Iterator[None]:
    """While inside: every record of a claim finds the claim counter advanced past the value its claim read, as
    when another catalog process's claim committed behind its checks (the trigger's update rolls back with the
    refused record, so each attempt loses afresh)."""
    names = [f"rival_{table}_{event.lower()}" for table in CLAIM_RECORDS for event in ("INSERT", "UPDATE")]
    try:  # also when one fails to be created: those made before it must not outlive this block
        with _database(server) as db:
            for table in CLAIM_RECORDS:
                for event in ("INSERT", "UPDATE"):
                    db.execute(
                        f"CREATE TRIGGER rival_{table}_{event.lower()} AFTER {event} ON {table} "
                        "BEGIN UPDATE sqe_location_claims SET epoch = epoch + 1; END"
                    )
        yield
    finally:
        with _database(server) as db:
            for name in names:
                db.execute(f"DROP TRIGGER IF EXISTS {name}")


@contextlib.contextmanager
def _database(server: CatalogServer) -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(server.workdir / "catalog.db", timeout=30)
    try:
        with db:  # one transaction, committed
            yield db
    finally:
        db.close()


class Api(WarehouseApi):
    NAMESPACE_PREFIX = "contended_"

    def create(self, ns: str, name: str, **body: Any) -> requests.Response:
        return self.request("POST", f"namespaces/{ns}/tables", json={"name": name, "schema": SCHEMA, **body})

    def commit(self, ns: str, name: str, updates: list[dict[str, Any]], **body: Any) -> requests.Response:
        return self.request("POST", f"namespaces/{ns}/tables/{name}", json={"updates": updates, **body})

    def objects(self, location: str) -> list[str]:
        """The objects stored under ``location`` (a place a claim asked for)."""
        prefix = location.removeprefix(f"s3://{self.server.moto.bucket}/") + "/"
        listing = self.server.moto.client("s3").list_objects_v2(Bucket=self.server.moto.bucket, Prefix=prefix)
        return sorted(o["Key"] for o in listing.get("Contents", []) if not o["Key"].endswith("/"))


@pytest.fixture(scope="module")
def api(own_catalog: CatalogServer) -> Api:
    # A catalog of this module's own: the triggers are on its database alone.
    return Api(own_catalog)


def commit_failed(response: requests.Response) -> str:
    """The message of a 409 CommitFailedException, which names the contention."""
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("CommitFailedException", 409), error
    assert CONTENTION in error["message"], error
    return _tried_again(str(error["message"]))


def retry_later(response: requests.Response) -> str:
    """The message of a 503 ServiceUnavailableException with Retry-After, which names the contention."""
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) > 0, response.headers
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("ServiceUnavailableException", 503), error
    assert CONTENTION in error["message"], error
    return _tried_again(str(error["message"]))


def _tried_again(message: str) -> str:
    """``message``, once it says the claim was made at least ``MIN_ATTEMPTS`` times before the catalog gave up."""
    attempts = ATTEMPTS.search(message)
    assert attempts is not None and int(attempts.group(1)) >= MIN_ATTEMPTS, message
    return message


def view_body(ns: str, name: str) -> dict[str, Any]:
    version = {
        "version-id": 1,
        "schema-id": 0,
        "timestamp-ms": 1,
        "summary": {"operation": "create"},
        "representations": [{"type": "sql", "sql": "SELECT 1 AS id", "dialect": "duckdb"}],
        "default-namespace": [ns],
    }
    return {"name": name, "schema": SCHEMA, "view-version": version}


# ---------------------------------------------------------------------------------------------------------
# Commits: 409 CommitFailedException (before: 503, "commit state unknown" to Iceberg's clients)


def test_a_move_that_keeps_losing_its_claim_is_a_commit_failure_and_leaves_nothing(api: Api) -> None:
    ns = api.namespace()
    created = api.create(ns, "t").json()
    place, current = created["metadata"]["location"], created["metadata-location"]
    target = f"{place}-moved"
    move = [{"action": "set-location", "location": target}]
    with rival_claims(api.server):
        refused = api.commit(ns, "t", move)
    assert f"commit of table {ns}.t" in commit_failed(refused)
    assert api.load(ns, "t").json()["metadata-location"] == current  # nothing committed
    assert api.objects(target) == []  # each attempt's metadata file was removed
    moved = api.commit(ns, "t", move)  # nothing kept the target claimed
    assert moved.status_code == 200, moved.text
    assert moved.json()["metadata"]["location"] == target


def test_a_legacy_tables_move_that_keeps_losing_its_claim_is_a_commit_failure_and_leaves_nothing(api: Api) -> None:
    # A table without a pin (made before the catalog kept them) commits on its own path (IntegrityGuard's legacy
    # commit), which writes its metadata file with pyiceberg's catalog: removed all the same.
    ns = api.namespace()
    current = legacy_table(api.server, ns, "old")
    place, target = f"{api.server.warehouse_location}/{ns}/old", f"{api.server.warehouse_location}/{ns}/old-moved"
    move = [{"action": "set-location", "location": target}]
    with rival_claims(api.server):
        refused = api.commit(ns, "old", move)
    assert f"commit of table {ns}.old" in commit_failed(refused)
    assert api.load(ns, "old").json()["metadata-location"] == current
    assert api.objects(target) == [] and api.objects(place) == [current.split("/", 3)[3]]  # nothing new anywhere
    moved = api.commit(ns, "old", move)
    assert moved.status_code == 200, moved.text
    assert moved.json()["metadata"]["location"] == target


def test_pyiceberg_sees_a_create_transaction_that_keeps_losing_its_claim_as_a_commit_failure(api: Api) -> None:
    # pyiceberg's own create transaction: its stage-create, then the commit (assert-create) that claims the place.
    ns = api.namespace()
    catalog = pyiceberg_catalog(api.server, api.server.admin)
    transaction = catalog.create_table_transaction(f"{ns}.t", Schema(NestedField(1, "id", LongType())))
    with rival_claims(api.server), pytest.raises(CommitFailedException, match=CONTENTION):
        transaction.commit_transaction()
    assert not catalog.table_exists(f"{ns}.t")


def test_a_create_transaction_that_keeps_losing_its_claim_is_a_commit_failure_and_leaves_nothing(api: Api) -> None:
    ns = api.namespace()
    place = f"{api.server.warehouse_location}/{ns}/t"
    updates = [
        {"action": "assign-uuid", "uuid": str(uuid.uuid4())},
        {"action": "upgrade-format-version", "format-version": 2},
        {"action": "add-schema", "schema": SCHEMA, "last-column-id": 1},
        {"action": "set-current-schema", "schema-id": -1},
        {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
        {"action": "set-default-spec", "spec-id": -1},
        {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
        {"action": "set-default-sort-order", "sort-order-id": -1},
    ]
    create = {"requirements": [{"type": "assert-create"}]}
    with rival_claims(api.server):
        refused = api.commit(ns, "t", updates, **create)
    assert f"commit of table {ns}.t" in commit_failed(refused)
    assert api.load(ns, "t").status_code == 404
    assert api.objects(place) == []
    created = api.commit(ns, "t", updates, **create)
    assert created.status_code == 200, created.text
    assert created.json()["metadata"]["location"] == place  # the default place: nothing kept it


def test_a_view_replace_that_keeps_losing_its_claim_is_a_commit_failure_and_leaves_nothing(api: Api) -> None:
    ns = api.namespace()
    created = api.request("POST", f"namespaces/{ns}/views", json=view_body(ns, "v")).json()
    current = created["metadata-location"]
    replace = {
        "requirements": [{"type": "assert-view-uuid", "uuid": created["metadata"]["view-uuid"]}],
        "updates": [{"action": "set-properties", "updates": {"owner": "me"}}],
    }
    with rival_claims(api.server):
        refused = api.request("POST", f"namespaces/{ns}/views/v", json=replace)
    assert f"replace of view {ns}.v" in commit_failed(refused)
    assert api.request("GET", f"namespaces/{ns}/views/v").json()["metadata-location"] == current
    assert api.objects(current.rsplit("/metadata/", 1)[0]) == [current.split("/", 3)[3]]
    replaced = api.request("POST", f"namespaces/{ns}/views/v", json=replace)
    assert replaced.status_code == 200, replaced.text


# ---------------------------------------------------------------------------------------------------------
# Creates: 503 with Retry-After (before: 503 without it; a 409 would read as "already exists")


def test_a_create_that_keeps_losing_its_claim_is_retryable_unavailability_and_leaves_nothing(api: Api) -> None:
    ns = api.namespace()
    place = f"{api.server.warehouse_location}/{ns}/t"
    with rival_claims(api.server):
        refused = api.create(ns, "t")
    assert f"create of table {ns}.t" in retry_later(refused)
    assert api.load(ns, "t").status_code == 404
    assert api.objects(place) == []
    created = api.create(ns, "t")
    assert created.status_code == 200, created.text
    assert created.json()["metadata"]["location"] == place  # the default place: nothing kept it


def test_a_stage_create_that_keeps_losing_its_claim_is_retryable_unavailability_and_reserves_nothing(
    api: Api,
) -> None:
    ns = api.namespace()
    place = f"{api.server.warehouse_location}/{ns}/t"
    with rival_claims(api.server):
        refused = api.create(ns, "t", **{"stage-create": True})
    assert f"stage-create of table {ns}.t" in retry_later(refused)
    # No reservation was left: another table may take the place at once.
    squatter = api.create(ns, "u", location=place)
    assert squatter.status_code == 200, squatter.text


def test_a_register_that_keeps_losing_its_claim_is_retryable_unavailability_and_changes_nothing(api: Api) -> None:
    ns = api.namespace()
    current = api.create(ns, "t").json()["metadata-location"]
    body = {"name": "t", "metadata-location": current, "overwrite": True}
    with rival_claims(api.server):
        refused = api.request("POST", f"namespaces/{ns}/register", json=body)
    assert f"register-overwrite of table {ns}.t" in retry_later(refused)
    assert api.load(ns, "t").json()["metadata-location"] == current
    registered = api.request("POST", f"namespaces/{ns}/register", json=body)
    assert registered.status_code == 200, registered.text


def test_a_notification_that_keeps_losing_its_claim_is_retryable_unavailability_and_uses_up_nothing(
    api: Api,
) -> None:
    # A Polaris-style notification of a missing table admits its metadata as a register does. Its timestamp is
    # recorded only with the admission: refused here, the same notification is still not stale afterwards.
    ns = api.namespace()
    source = api.create(ns, "src").json()["metadata-location"]
    assert api.request("DELETE", f"namespaces/{ns}/tables/src").status_code == 204
    stamp = int(time.time() * 1000)
    with rival_claims(api.server):
        refused = api.notify(ns, "t", "CREATE", source, stamp)
    assert f"notification-create of table {ns}.t" in retry_later(refused)
    assert api.load(ns, "t").status_code == 404
    notified = api.notify(ns, "t", "CREATE", source, stamp)
    assert notified.status_code == 204, notified.text
    assert api.load(ns, "t").json()["metadata-location"] == source


def test_a_view_create_that_keeps_losing_its_claim_is_retryable_unavailability_and_leaves_nothing(api: Api) -> None:
    ns = api.namespace()
    place = f"{api.server.warehouse_location}/{ns}/v"
    with rival_claims(api.server):
        refused = api.request("POST", f"namespaces/{ns}/views", json=view_body(ns, "v"))
    assert f"create of view {ns}.v" in retry_later(refused)
    assert api.request("GET", f"namespaces/{ns}/views/v").status_code == 404
    assert api.objects(place) == []
    created = api.request("POST", f"namespaces/{ns}/views", json=view_body(ns, "v"))
    assert created.status_code == 200, created.text
    assert created.json()["metadata-location"].startswith(f"{place}/metadata/")


def test_a_burst_of_contended_writes_leaves_threads_for_reads_and_tokens(api: Api) -> None:
    """More contended creates than Starlette's 40 threads, each waiting out its backoff in its thread: a load
    and a token request are answered while every one of them still waits (they used to queue behind them)."""
    ns = api.namespace()
    headers = dict(api.session.headers)
    url = f"{api.server.url}/v1/{api.server.warehouse}/namespaces/{ns}/tables"

    def create(name: str) -> requests.Response:
        body = {"name": name, "schema": SCHEMA}
        return requests.post(url, json=body, headers=headers, timeout=120)  # a connection of its own

    burst = 41  # one more than Starlette's threads (anyio's default limiter: 40)
    with rival_claims(api.server), ThreadPoolExecutor(burst) as pool:
        creates = [pool.submit(create, f"t{i}") for i in range(burst)]
        time.sleep(0.5)  # every create is in flight: the first ones losing their claims, the rest queued
        listed = api.request("GET", f"namespaces/{ns}/tables")
        token = api.server.token(api.server.admin)
        waiting = sum(not create.done() for create in creates)
        refused = [create.result() for create in creates]
    assert listed.status_code == 200 and listed.json()["identifiers"] == [] and token
    assert waiting == burst, f"{burst - waiting} creates ended before the load and the token were answered"
    for response in refused:
        retry_later(response)


def test_a_burst_of_contended_writes_leaves_threads_for_scan_planning(api: Api) -> None:
    """Planning a scan is a read that comes as a POST (``.../plan``, ``.../tasks``): a reader's planning is
    answered while every contended create still waits, as a load is (it must not queue behind the writes)."""
    ns = api.namespace()
    assert api.create(ns, "planned").status_code == 200  # before the rival: a table to plan on
    headers = dict(api.session.headers)
    url = f"{api.server.url}/v1/{api.server.warehouse}/namespaces/{ns}/tables"

    def create(name: str) -> requests.Response:
        return requests.post(url, json={"name": name, "schema": SCHEMA}, headers=headers, timeout=120)

    burst = 17  # one more than the writes' threads: the last one queues however fast the others lose
    with rival_claims(api.server), ThreadPoolExecutor(burst) as pool:
        creates = [pool.submit(create, f"t{i}") for i in range(burst)]
        time.sleep(0.5)  # every create is in flight
        planned = api.request("POST", f"namespaces/{ns}/tables/planned/plan", json={})
        waiting = sum(not create.done() for create in creates)
        refused = [create.result() for create in creates]
    assert planned.status_code == 200, planned.text
    assert planned.json()["status"] == "completed", planned.json()
    assert waiting == burst, f"{burst - waiting} creates ended before the scan was planned"
    for response in refused:
        retry_later(response)


def test_a_contended_create_whose_client_left_is_not_claimed_again(api: Api) -> None:
    """A create losing every claim whose client disconnects: the catalog stops making the claim again, where it
    used to go on for its whole patience (its write thread held for an answer no one reads), and creates nothing."""
    ns = api.namespace()
    stopped = re.compile(r"claims (\d+) times; its client left")
    seen = len(stopped.findall(api.server.log_path.read_text()))
    address = urlsplit(api.server.url)
    body = json.dumps({"name": "t", "schema": SCHEMA}).encode()
    head = "".join(f"{name}: {value}\r\n" for name, value in api.session.headers.items() if name.lower() != "host")
    request = (
        f"POST /v1/{api.server.warehouse}/namespaces/{ns}/tables HTTP/1.1\r\nHost: {address.netloc}\r\n{head}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with rival_claims(api.server):
        with socket.create_connection((address.hostname, address.port), timeout=30) as client:
            client.sendall(request)
            time.sleep(0.5)  # the create has lost a claim or more by now; then the client leaves
        wait_until(
            lambda: len(stopped.findall(api.server.log_path.read_text())) > seen,
            "the catalog never stopped claiming for the client that left",
            timeout=60,
        )
    found = stopped.findall(api.server.log_path.read_text())
    assert 1 <= int(found[-1]) < MAX_ATTEMPTS
    assert api.load(ns, "t").status_code == 404
