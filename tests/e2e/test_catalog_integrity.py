"""Key-ID pinning and metadata integrity against the real ``sqe-catalog`` on moto (``sqe_catalog.integrity``).

One test per row of the seed's state, transition and admission tables, plus storage tampering: the metadata file
is rewritten in the bucket with boto3 behind the catalog's back, and the next load must answer 422 and a purge
must refuse and delete nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gzip
import json
import re
import sqlite3
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import requests

from tests.conftest import (
    catalog_variant,
    free_loopback_port,
    restartable_catalog,
    start_catalog_process,
    stop_process,
    write_catalog_config,
)
from tests.helpers.catalog_api import WarehouseApi
from tests.helpers.fault_proxy import FaultProxy

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e

SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": False}],
}
V3 = {"format-version": "3"}
INTEGRITY = "MetadataIntegrityException"


class Api(WarehouseApi):
    NAMESPACE_PREFIX = "integ_"

    def create(self, ns: str, name: str, properties: dict[str, str]) -> requests.Response:
        body = {"name": name, "schema": SCHEMA, "properties": properties}
        return self.request("POST", f"namespaces/{ns}/tables", json=body)

    def set_properties(self, ns: str, name: str, **updates: str) -> requests.Response:
        body = {"updates": [{"action": "set-properties", "updates": updates}]}
        return self.request("POST", f"namespaces/{ns}/tables/{name}", json=body)

    def remove_properties(self, ns: str, name: str, *removals: str) -> requests.Response:
        body = {"updates": [{"action": "remove-properties", "removals": list(removals)}]}
        return self.request("POST", f"namespaces/{ns}/tables/{name}", json=body)


@pytest.fixture(scope="module")
def api(catalog_server: CatalogServer) -> Api:
    return Api(catalog_server)


def assert_integrity_error(response: requests.Response) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == INTEGRITY and error["code"] == 422
    assert "Traceback" not in response.text
    return str(error["message"])


def trusted_row(server: CatalogServer, ns: str, name: str) -> tuple[Any, ...] | None:
    """The table's row in the catalog's own trusted-state table (read-only, straight from its database)."""
    with sqlite3.connect(server.workdir / "catalog.db") as db:
        row = db.execute(
            "SELECT metadata_location, key_id, digest, digest_version FROM sqe_table_integrity"
            " WHERE namespace = ? AND table_name = ?",
            (ns, name),
        ).fetchone()
    return tuple(row) if row is not None else None


def s3_key(location: str) -> tuple[str, str]:
    bucket, _, key = location.removeprefix("s3://").partition("/")
    return bucket, key


def read_stored(server: CatalogServer, location: str) -> dict[str, Any]:
    bucket, key = s3_key(location)
    body = server.moto.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    document: dict[str, Any] = json.loads(body)
    return document


def put_stored(server: CatalogServer, location: str, document: dict[str, Any], indent: int | None = None) -> str:
    """Write ``document`` at ``location`` in the bucket, behind the catalog's back; returns ``location``."""
    bucket, key = s3_key(location)
    server.moto.client("s3").put_object(Bucket=bucket, Key=key, Body=json.dumps(document, indent=indent).encode())
    return location


def tamper(server: CatalogServer, location: str, change: Any) -> None:
    """Rewrite the metadata file in the bucket, behind the catalog's back."""
    document = read_stored(server, location)
    change(document)
    put_stored(server, location, document, indent=2)


def variant(server: CatalogServer, location: str, **properties: str) -> str:
    """A new metadata file beside ``location``: the same table (same UUID) with ``properties`` set, never
    admitted by the catalog; re-admission tests point the table at it."""
    document = read_stored(server, location)
    document["properties"] = {**document.get("properties", {}), **properties}
    return put_stored(server, location.rsplit("/", 1)[0] + f"/99999-{uuid.uuid4()}.metadata.json", document)


def objects(server: CatalogServer, prefix: str) -> list[str]:
    listing = server.moto.client("s3").list_objects_v2(Bucket=server.moto.bucket, Prefix=prefix)
    # without the empty directory markers pyarrow leaves behind when it deletes
    return sorted(obj["Key"] for obj in listing.get("Contents", []) if not obj["Key"].endswith("/"))


def cleanup_tasks(server: CatalogServer, ns: str) -> list[dict[str, Any]]:
    return [t for t in json.loads(server.admin_cli("list-cleanup-tasks")) if t["namespace"] == ns]


def wait_for_cleaner(server: CatalogServer, ns: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The namespace's cleanup tasks once the catalog's background cleaner has finished them all."""
    deadline = time.monotonic() + timeout
    while True:
        tasks = cleanup_tasks(server, ns)
        if not any(t["status"] in ("pending", "running") for t in tasks):
            return tasks
        assert time.monotonic() < deadline, f"the background cleaner did not run: {tasks}"
        time.sleep(0.25)


def legacy_table(server: CatalogServer, ns: str, name: str, properties: dict[str, str] | None = None) -> str:
    """A table as the catalog before this change made it: pyiceberg's SqlCatalog on the same database and bucket
    (a row in iceberg_tables, none in the trusted-state table). Returns its metadata location."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    moto = server.moto
    catalog = SqlCatalog(
        server.warehouse,
        uri=f"sqlite:///{server.workdir / 'catalog.db'}",
        **{
            "s3.endpoint": moto.url,
            "s3.region": moto.region,
            "s3.access-key-id": moto.access_key_id,
            "s3.secret-access-key": moto.secret_access_key,
        },
    )
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    location = f"{server.warehouse_location}/{ns}/{name}"
    table = catalog.create_table((ns, name), schema, location=location, properties=properties or {})
    catalog.engine.dispose()
    return str(table.metadata_location)


# ---------------------------------------------------------------------------------------------------------
# States


def test_create_without_key_id_pins_its_absence(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    created = api.create(ns, "plain", {})
    assert created.status_code == 200, created.text
    row = trusted_row(catalog_server, ns, "plain")
    assert row == (created.json()["metadata-location"], None, None, None), "protected plaintext: marker, no digest"
    assert "sqe" not in json.dumps(created.json()["metadata"]["properties"]), "trusted state is not a table property"


def test_create_with_key_id_pins_key_and_digest(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    created = api.create(ns, "enc", {**V3, "encryption.key-id": "K1"})
    assert created.status_code == 200, created.text
    body = created.json()
    assert body["metadata"]["format-version"] == 3
    location, key_id, digest, version = trusted_row(catalog_server, ns, "enc") or ()
    assert (location, key_id, version) == (body["metadata-location"], "K1", "sqe-canonical-json-sha256-v1")
    assert digest and len(digest) == 44, "Base64 of a SHA-256"
    assert api.load(ns, "enc").status_code == 200


def test_legacy_table_keeps_its_behaviour_and_is_never_enrolled(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    legacy_table(catalog_server, ns, "old")
    assert api.load(ns, "old").status_code == 200
    # a legacy table may gain (and lose) a key id, as before; it is still not enrolled or given a digest
    assert api.set_properties(ns, "old", **{"encryption.key-id": "K9"}).status_code == 200
    assert api.remove_properties(ns, "old", "encryption.key-id").status_code == 200
    assert trusted_row(catalog_server, ns, "old") is None
    # legacy drop with purge deletes as before
    location = api.load(ns, "old").json()["metadata-location"]
    assert api.request("DELETE", f"namespaces/{ns}/tables/old", params={"purgeRequested": "true"}).status_code == 204
    assert [t["status"] for t in wait_for_cleaner(catalog_server, ns)] == ["done"]
    assert objects(catalog_server, s3_key(location)[1]) == []
    assert trusted_row(catalog_server, ns, "old") is None


# ---------------------------------------------------------------------------------------------------------
# Transitions


def test_plaintext_commits_while_the_key_id_stays_absent(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    assert api.create(ns, "t", {}).status_code == 200
    committed = api.set_properties(ns, "t", owner="me")
    assert committed.status_code == 200, committed.text
    assert trusted_row(catalog_server, ns, "t") == (committed.json()["metadata-location"], None, None, None)


def test_plaintext_to_encrypted_is_rejected(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    before = api.create(ns, "t", V3).json()["metadata-location"]
    assert "cannot be set" in assert_integrity_error(api.set_properties(ns, "t", **{"encryption.key-id": "K1"}))
    assert trusted_row(catalog_server, ns, "t") == (before, None, None, None)
    assert api.load(ns, "t").json()["metadata-location"] == before


def test_encrypted_commit_with_the_same_key_replaces_the_digest(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    api.create(ns, "t", {**V3, "encryption.key-id": "K1"})
    first = trusted_row(catalog_server, ns, "t")
    committed = api.set_properties(ns, "t", owner="me")
    assert committed.status_code == 200, committed.text
    second = trusted_row(catalog_server, ns, "t")
    assert first and second and second[0] == committed.json()["metadata-location"] != first[0]
    assert second[1] == "K1" and second[2] != first[2]
    assert api.load(ns, "t").status_code == 200


def test_encrypted_key_change_and_removal_are_rejected(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    api.create(ns, "t", {**V3, "encryption.key-id": "K1"})
    pinned = trusted_row(catalog_server, ns, "t")
    assert "cannot be changed" in assert_integrity_error(api.set_properties(ns, "t", **{"encryption.key-id": "K2"}))
    assert "cannot be removed" in assert_integrity_error(api.remove_properties(ns, "t", "encryption.key-id"))
    assert trusted_row(catalog_server, ns, "t") == pinned


def test_encryption_properties_need_format_version_3(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    for properties in ({"encryption.key-id": "K1"}, {"format-version": "1", "encryption.data-key-length": "16"}):
        assert "format-version >= 3" in assert_integrity_error(api.create(ns, "t", properties))
        assert trusted_row(catalog_server, ns, "t") is None
        assert api.load(ns, "t").status_code == 404


# ---------------------------------------------------------------------------------------------------------
# Admission boundaries


def _register(api: Api, ns: str, name: str, location: str, overwrite: bool = False) -> requests.Response:
    body = {"name": name, "metadata-location": location, "overwrite": overwrite}
    return api.request("POST", f"namespaces/{ns}/register", json=body)


def _events(server: CatalogServer, ns: str) -> list[dict[str, Any]]:
    events = json.loads(server.admin_cli("list-integrity-events"))
    return [e for e in events if e["namespace"] == ns]


def test_register_new_is_trust_on_first_use_with_an_audit_event(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    source = api.create(ns, "src", {**V3, "encryption.key-id": "K1"}).json()["metadata-location"]
    api.request("DELETE", f"namespaces/{ns}/tables/src")  # drop without purge: the file stays
    registered = _register(api, ns, "copy", source)
    assert registered.status_code == 200, registered.text
    row = trusted_row(catalog_server, ns, "copy")
    assert row and row[:2] == (source, "K1") and row[2]
    (event,) = _events(catalog_server, ns)
    assert event["action"] == "register" and event["actor"] == "admin"
    assert (event["displaced_location"], event["new_location"], event["new_digest"]) == (None, source, row[2])


def _gzip_of_blanks(size: int) -> bytes:
    """A gzip stream of a JSON object padded with ``size`` blanks: about a thousandth of that, compressed."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer
    blanks = b" " * (1 << 20)
    parts = [packer.compress(b"{")]
    parts += [packer.compress(blanks) for _ in range(size // len(blanks))]
    return b"".join([*parts, packer.compress(b"}"), packer.flush()])


def test_a_metadata_file_that_decompresses_past_the_limit_is_refused_unread(
    api: Api, catalog_server: CatalogServer
) -> None:
    """A table's writer can put any file under its location and register it: a small gzip that inflates to more
    than MAX_METADATA_FILE_BYTES is a 400 naming the limit, refused before it is inflated and parsed."""
    from sqe_catalog.integrity.canonical import MAX_METADATA_FILE_BYTES

    ns = api.namespace()
    source = api.create(ns, "src", {}).json()["metadata-location"]
    bomb = source.rsplit("/", 1)[0] + f"/99999-{uuid.uuid4()}.metadata.json"
    bucket, key = s3_key(bomb)
    data = _gzip_of_blanks(MAX_METADATA_FILE_BYTES + (1 << 20))
    assert len(data) < MAX_METADATA_FILE_BYTES // 256
    catalog_server.moto.client("s3").put_object(Bucket=bucket, Key=key, Body=data)
    refused = _register(api, ns, "bomb", bomb)
    assert refused.status_code == 400, refused.text
    assert f"decompresses to more than {MAX_METADATA_FILE_BYTES} bytes" in refused.json()["error"]["message"]
    assert api.load(ns, "bomb").status_code == 404
    assert api.load(ns, "src").status_code == 200  # the catalog serves on
    truncated = bomb.replace("99999-", "99998-")
    catalog_server.moto.client("s3").put_object(
        Bucket=bucket, Key=s3_key(truncated)[1], Body=_gzip_of_blanks(1 << 20)[:-6]
    )
    refused = _register(api, ns, "truncated", truncated)  # a gzip stream cut short: the client's file, not a 500
    assert refused.status_code == 400, refused.text
    assert "not a valid gzip stream" in refused.json()["error"]["message"]


def test_register_overwrite_readmits_with_the_pinned_key_only(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    first = api.create(ns, "t", {**V3, "encryption.key-id": "K1"}).json()["metadata-location"]
    second = api.set_properties(ns, "t", owner="me").json()["metadata-location"]
    other_key = variant(catalog_server, second, **{"encryption.key-id": "K2"})
    pinned = trusted_row(catalog_server, ns, "t")
    assert pinned
    # re-admission of an older revision with the same key id: allowed, audited with the displaced revision
    readmitted = _register(api, ns, "t", first, overwrite=True)
    assert readmitted.status_code == 200, readmitted.text
    row = trusted_row(catalog_server, ns, "t")
    assert row and row[0] == first and row[1] == "K1"
    (event,) = _events(catalog_server, ns)
    assert event["action"] == "register-overwrite"
    assert (event["displaced_location"], event["displaced_digest"]) == (second, pinned[2])
    assert (event["new_location"], event["new_digest"]) == (first, row[2])
    # another key id is refused
    assert "cannot be changed" in assert_integrity_error(_register(api, ns, "t", other_key, overwrite=True))
    assert trusted_row(catalog_server, ns, "t") == row


def test_readmission_keeps_the_table_uuid(api: Api, catalog_server: CatalogServer) -> None:
    """Another table's identity is never re-admitted: column tags and restriction entries match by UUID."""
    ns = api.namespace()
    location = api.create(ns, "t", V3).json()["metadata-location"]
    other = variant(catalog_server, location)
    tamper(catalog_server, other, lambda document: document.update({"table-uuid": str(uuid.uuid4())}))
    refused = _register(api, ns, "t", other, overwrite=True)
    assert refused.status_code == 409 and "another table-uuid" in refused.text
    refused = api.notify(ns, "t", "UPDATE", other, int(time.time() * 1000))
    assert refused.status_code == 409 and "another table-uuid" in refused.text
    assert trusted_row(catalog_server, ns, "t")[0] == location  # type: ignore[index]


def test_register_overwrite_requires_table_full_metadata(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    location = api.create(ns, "t", V3).json()["metadata-location"]
    writer = catalog_server.principal_with_grants(
        f"creator_{uuid.uuid4().hex[:6]}",
        [("TABLE_CREATE", ns, None), ("TABLE_WRITE_PROPERTIES", ns, None)],
    )
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {catalog_server.token(writer)}"
    body = {"name": "t", "metadata-location": location, "overwrite": True}
    response = session.post(f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces/{ns}/register", json=body)
    assert response.status_code == 403, response.text


def test_legacy_register_overwrite_moves_the_pointer_without_pinning(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    first = legacy_table(catalog_server, ns, "old")
    second = api.set_properties(ns, "old", owner="me").json()["metadata-location"]
    assert _register(api, ns, "old", first, overwrite=True).status_code == 200
    assert api.load(ns, "old").json()["metadata-location"] == first != second
    assert trusted_row(catalog_server, ns, "old") is None and _events(catalog_server, ns) == []


def test_notification_of_a_missing_table_is_trust_on_first_use(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    source = api.create(ns, "src", V3).json()["metadata-location"]
    other = api.create(ns, "src2", V3).json()["metadata-location"]
    api.request("DELETE", f"namespaces/{ns}/tables/src")
    api.request("DELETE", f"namespaces/{ns}/tables/src2")
    stamp = int(time.time() * 1000)
    assert api.notify(ns, "viaupdate", "UPDATE", source, stamp).status_code == 204
    assert trusted_row(catalog_server, ns, "viaupdate") == (source, None, None, None)
    assert api.notify(ns, "viacreate", "CREATE", other, stamp).status_code == 204
    assert api.notify(ns, "viacreate", "CREATE", other, stamp + 1).status_code == 409, "exists already"
    assert [e["action"] for e in _events(catalog_server, ns)] == ["notification-update", "notification-create"]


def test_notification_update_of_protected_plaintext_keeps_the_absence(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    api.create(ns, "t", V3)
    newer = api.set_properties(ns, "t", owner="me").json()["metadata-location"]
    encrypted = variant(catalog_server, newer, **{"encryption.key-id": "K1"})
    older = api.set_properties(ns, "t", owner="you").json()["metadata-location"]
    stamp = int(time.time() * 1000)
    assert api.notify(ns, "t", "UPDATE", newer, stamp).status_code == 204
    assert trusted_row(catalog_server, ns, "t") == (newer, None, None, None)
    assert "cannot be set" in assert_integrity_error(api.notify(ns, "t", "UPDATE", encrypted, stamp + 1))
    # a stale timestamp is refused before anything is read
    assert api.notify(ns, "t", "UPDATE", older, stamp).status_code == 409
    assert trusted_row(catalog_server, ns, "t") == (newer, None, None, None)


def test_notification_update_of_protected_encrypted_is_rejected(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    first = api.create(ns, "e", {**V3, "encryption.key-id": "K1"}).json()["metadata-location"]
    api.set_properties(ns, "e", owner="me")
    pinned = trusted_row(catalog_server, ns, "e")
    message = assert_integrity_error(api.notify(ns, "e", "UPDATE", first, int(time.time() * 1000)))
    assert "notification cannot replace" in message
    assert trusted_row(catalog_server, ns, "e") == pinned


def test_legacy_notification_update_moves_the_pointer(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    first = legacy_table(catalog_server, ns, "old")
    api.set_properties(ns, "old", owner="me")
    assert api.notify(ns, "old", "UPDATE", first, int(time.time() * 1000)).status_code == 204
    assert api.load(ns, "old").json()["metadata-location"] == first
    assert trusted_row(catalog_server, ns, "old") is None


def test_failed_notification_does_not_use_up_its_timestamp(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    api.create(ns, "t", V3)
    newer = api.set_properties(ns, "t", owner="me").json()["metadata-location"]
    encrypted = variant(catalog_server, newer, **{"encryption.key-id": "K1"})
    stamp = int(time.time() * 1000)
    assert_integrity_error(api.notify(ns, "t", "UPDATE", encrypted, stamp))  # refused: records nothing
    assert api.notify(ns, "t", "UPDATE", f"{catalog_server.warehouse_location}/{ns}/missing.json", stamp).status_code
    assert api.notify(ns, "t", "UPDATE", newer, stamp).status_code == 204, "the same timestamp is still unused"
    assert api.notify(ns, "t", "UPDATE", newer, stamp).status_code == 409, "now it is used"


def test_notification_validate_and_drop(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    location = api.create(ns, "t", V3).json()["metadata-location"]
    stamp = int(time.time() * 1000)
    assert api.notify(ns, "t", "VALIDATE", location, stamp).status_code == 204
    assert api.notify(ns, "t", "VALIDATE", "s3://elsewhere/x.json", stamp + 1).status_code == 400
    assert api.notify(ns, "t", "DROP", "", stamp + 2).status_code == 204
    assert api.load(ns, "t").status_code == 404 and trusted_row(catalog_server, ns, "t") is None


def test_a_broken_protected_table_keeps_its_location(api: Api, catalog_server: CatalogServer) -> None:
    """The overlap check uses the locations the catalog recorded, never the (here unreadable) metadata file."""
    ns = api.namespace()
    location = api.create(ns, "t", V3).json()["metadata-location"]
    bucket, key = s3_key(location)
    catalog_server.moto.client("s3").put_object(Bucket=bucket, Key=key, Body=b"not json")
    inside = {"name": "u", "schema": SCHEMA, "location": f"{catalog_server.warehouse_location}/{ns}/t/u"}
    response = api.request("POST", f"namespaces/{ns}/tables", json=inside)
    assert response.status_code == 400 and f"{ns}.t" in response.json()["error"]["message"]
    assert api.create(ns, "unrelated", V3).status_code == 200, "other creates are not blocked"


def test_a_relocated_file_cannot_free_the_trusted_location(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    location = api.create(ns, "t", V3).json()["metadata-location"]
    tamper(catalog_server, location, lambda d: d.__setitem__("location", f"{catalog_server.warehouse_location}/x"))
    inside = {"name": "u", "schema": SCHEMA, "location": f"{catalog_server.warehouse_location}/{ns}/t/u"}
    assert api.request("POST", f"namespaces/{ns}/tables", json=inside).status_code == 400


def _set_trusted(server: CatalogServer, ns: str, name: str, column: str, value: str | None) -> None:
    with sqlite3.connect(server.workdir / "catalog.db") as db:
        db.execute(
            f"UPDATE sqe_table_integrity SET {column} = ? WHERE namespace = ? AND table_name = ?", (value, ns, name)
        )


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        pytest.param("digest", None, "has no metadata digest", id="key-id-without-digest"),
        pytest.param("digest_version", "sqe-canonical-json-sha256-v999", "digest version", id="unknown-version"),
    ],
)
def test_inconsistent_or_unknown_trusted_state_fails_closed(
    api: Api, catalog_server: CatalogServer, column: str, value: str | None, message: str
) -> None:
    ns = api.namespace()
    api.create(ns, "t", {**V3, "encryption.key-id": "K1"})
    _set_trusted(catalog_server, ns, "t", column, value)
    assert message in assert_integrity_error(api.load(ns, "t"))


def test_drop_and_recreate_starts_a_new_lifetime(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    api.create(ns, "t", V3)
    assert api.request("DELETE", f"namespaces/{ns}/tables/t").status_code == 204
    recreated = api.create(ns, "t", {**V3, "encryption.key-id": "K1"})
    assert recreated.status_code == 200, recreated.text
    row = trusted_row(catalog_server, ns, "t")
    assert row and row[1] == "K1" and row[2]


def test_legacy_drop_without_purge_keeps_files_and_pins_nothing(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    location = legacy_table(catalog_server, ns, "old")
    assert api.request("DELETE", f"namespaces/{ns}/tables/old").status_code == 204
    assert objects(catalog_server, s3_key(location)[1]) == [s3_key(location)[1]]
    assert trusted_row(catalog_server, ns, "old") is None and cleanup_tasks(catalog_server, ns) == []


def test_admission_of_pre_v3_metadata_with_encryption_properties_is_refused(
    api: Api, catalog_server: CatalogServer
) -> None:
    ns = api.namespace()
    location = legacy_table(catalog_server, ns, "old", {"encryption.key-id": "K1"})  # v2 with a key id
    api.request("DELETE", f"namespaces/{ns}/tables/old")
    assert "format-version >= 3" in assert_integrity_error(_register(api, ns, "new", location))
    assert trusted_row(catalog_server, ns, "new") is None and api.load(ns, "new").status_code == 404
    # and a commit to a pinned v2 table may not add one either
    api.create(ns, "v2", {"format-version": "2"})
    assert "format-version >= 3" in assert_integrity_error(
        api.set_properties(ns, "v2", **{"encryption.data-key-length": "16"})
    )


# ---------------------------------------------------------------------------------------------------------
# Storage tampering: load answers 422, purge refuses and deletes nothing


def _assert_refused_purge(api: Api, server: CatalogServer, ns: str, name: str) -> None:
    before = objects(server, f"{server.warehouse}/{ns}/{name}/")
    assert before
    assert_integrity_error(api.request("DELETE", f"namespaces/{ns}/tables/{name}", params={"purgeRequested": "true"}))
    assert objects(server, f"{server.warehouse}/{ns}/{name}/") == before
    assert trusted_row(server, ns, name) is not None, "the table and its pin are still there"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda d: d.__setitem__(
                "snapshots",
                [dict(snapshot_id=1)]
                and [
                    {
                        "snapshot-id": 1,
                        "timestamp-ms": 1,
                        "sequence-number": 1,
                        "manifest-list": "s3://warehouse/wh/x.avro",
                        "summary": {"operation": "append"},
                        "first-row-id": 0,
                        "added-rows": 0,
                    }
                ],
            ),
            id="snapshots",
        ),
        pytest.param(
            lambda d: d["schemas"][0]["fields"].append(dict(d["schemas"][0]["fields"][0], id=9, name="extra")),
            id="schema",
        ),
        pytest.param(
            lambda d: d.__setitem__("encryption-keys", [{"key-id": "evil", "encrypted-key-metadata": "AA=="}]),
            id="encryption-keys",
        ),
        pytest.param(lambda d: d["properties"].__setitem__("encryption.key-id", "K2"), id="key-id-changed"),
    ],
)
def test_tampered_encrypted_metadata_is_detected(api: Api, catalog_server: CatalogServer, change: Any) -> None:
    ns = api.namespace()
    location = api.create(ns, "t", {**V3, "encryption.key-id": "K1"}).json()["metadata-location"]
    tamper(catalog_server, location, change)
    message = assert_integrity_error(api.load(ns, "t"))
    assert "trusted digest" in message or "encryption.key-id cannot be changed" in message
    _assert_refused_purge(api, catalog_server, ns, "t")


def test_whitespace_only_rewrite_is_not_tampering(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    location = api.create(ns, "t", {**V3, "encryption.key-id": "K1"}).json()["metadata-location"]
    tamper(catalog_server, location, lambda d: None)  # same document, indented, keys in another order
    assert api.load(ns, "t").status_code == 200


def test_key_id_added_in_storage_to_protected_plaintext_is_detected(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    location = api.create(ns, "t", V3).json()["metadata-location"]
    tamper(catalog_server, location, lambda d: d["properties"].__setitem__("encryption.key-id", "K1"))
    assert "cannot be set" in assert_integrity_error(api.load(ns, "t"))
    _assert_refused_purge(api, catalog_server, ns, "t")


def test_verified_purge_deletes_and_records_the_task(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    api.create(ns, "t", {**V3, "encryption.key-id": "K1"})
    response = api.request("DELETE", f"namespaces/{ns}/tables/t", params={"purgeRequested": "true"})
    assert response.status_code == 204
    # the drop returned once the task was persisted: nothing is deleted yet, the table is gone
    assert [t["status"] for t in cleanup_tasks(catalog_server, ns)] == ["pending"]
    assert objects(catalog_server, f"{catalog_server.warehouse}/{ns}/t/")
    assert api.load(ns, "t").status_code == 404
    tasks = wait_for_cleaner(catalog_server, ns)
    assert [(t["status"], t["key_id"], bool(t["digest"])) for t in tasks] == [("done", "K1", True)]
    assert objects(catalog_server, f"{catalog_server.warehouse}/{ns}/t/") == []


@pytest.mark.parametrize(
    ("properties", "change"),
    [
        pytest.param(
            {**V3, "encryption.key-id": "K1"},
            lambda d: d["properties"].__setitem__("owner", "attacker"),
            id="encrypted-digest",
        ),
        pytest.param(V3, lambda d: d["properties"].__setitem__("encryption.key-id", "K1"), id="plaintext-key-id"),
    ],
)
def test_cleaner_second_check_failure_is_terminal_and_deletes_nothing(
    api: Api, catalog_server: CatalogServer, properties: dict[str, str], change: Any
) -> None:
    ns = api.namespace()
    location = api.create(ns, "t", properties).json()["metadata-location"]
    assert api.request("DELETE", f"namespaces/{ns}/tables/t", params={"purgeRequested": "true"}).status_code == 204
    # the task waits one cleaner interval (2 s by default) before it runs: tamper in between
    tamper(catalog_server, location, change)
    before = objects(catalog_server, f"{catalog_server.warehouse}/{ns}/t/")
    (task,) = wait_for_cleaner(catalog_server, ns)
    assert task["status"] == "failed" and task["metadata_location"] == location
    assert "trusted digest" in task["detail"] or "cannot be set" in task["detail"]
    assert objects(catalog_server, f"{catalog_server.warehouse}/{ns}/t/") == before, "no file deleted"
    assert f"cleanup task {task['id']} of wh.{ns}.t failed integrity verification" in catalog_server.log_text()
    # terminal: the operator's run-cleanup does not retry it, the task stays for diagnosis
    assert str(task["id"]) not in json.loads(catalog_server.admin_cli("run-cleanup")).get("wh", {})
    assert cleanup_tasks(catalog_server, ns) == [task]


def test_a_purge_that_cannot_read_a_manifest_names_the_table_in_its_warning(
    api: Api, catalog_server: CatalogServer
) -> None:
    # Before: the cleaner's warning named no table ("purge of  could not read a manifest").
    ns = api.namespace()
    metadata = api.create(ns, "t", {}).json()["metadata"]
    snapshot = {
        "snapshot-id": 7,
        "sequence-number": 1,
        "timestamp-ms": int(time.time() * 1000),
        "manifest-list": f"{metadata['location']}/metadata/snap-7-missing.avro",  # never written
        "summary": {"operation": "append"},
        "schema-id": 0,
    }
    updates = [
        {"action": "add-snapshot", "snapshot": snapshot},
        {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 7},
    ]
    committed = api.request("POST", f"namespaces/{ns}/tables/t", json={"updates": updates})
    assert committed.status_code == 200, committed.text
    assert api.request("DELETE", f"namespaces/{ns}/tables/t", params={"purgeRequested": "true"}).status_code == 204
    assert [t["status"] for t in wait_for_cleaner(catalog_server, ns)] == ["done"]
    assert f"purge of {catalog_server.warehouse}.{ns}.t could not read a manifest" in catalog_server.log_text()


def test_integrity_errors_are_logged_without_secrets(catalog_server: CatalogServer) -> None:
    log = catalog_server.log_text()
    assert "integrity check failed" in log
    for secret in catalog_server.secrets:
        assert secret not in log


def test_purge_of_a_rewritten_plaintext_table_never_deletes_another_tables_files(
    api: Api, catalog_server: CatalogServer
) -> None:
    # A protected plaintext table has no digest, so storage can rewrite its file (same path) with another table's
    # location and metadata log. The purge's check refuses a file naming other places than the catalog recorded
    # (and the cleaner would stay inside those recorded places anyway).
    ns = api.namespace()
    victim_location = api.create(ns, "victim", {**V3, "encryption.key-id": "K1"}).json()["metadata-location"]
    location = api.create(ns, "t", V3).json()["metadata-location"]
    victim_root = read_stored(catalog_server, victim_location)["location"]

    def point_at_victim(document: dict[str, Any]) -> None:
        document["location"] = victim_root
        document["metadata-log"] = [{"metadata-file": victim_location, "timestamp-ms": 1}]

    tamper(catalog_server, location, point_at_victim)
    victim_files = objects(catalog_server, f"{catalog_server.warehouse}/{ns}/victim/")
    assert victim_files
    purge = api.request("DELETE", f"namespaces/{ns}/tables/t", params={"purgeRequested": "true"})
    assert "recorded" in assert_integrity_error(purge)
    assert cleanup_tasks(catalog_server, ns) == []
    assert objects(catalog_server, f"{catalog_server.warehouse}/{ns}/victim/") == victim_files
    assert api.load(ns, "victim").status_code == 200


# ---------------------------------------------------------------------------------------------------------
# Admission reads the metadata file once: the store changing it between reads changes nothing admitted


class SwappingStore(FaultProxy):
    """The catalog's S3 endpoint: forwards to moto, and runs an armed ``action`` once, just before it forwards the
    first request for one object after the catalog has fetched that object ``after_reads`` times (a writer or
    another request racing the catalog between, or during, its reads of one file)."""

    def __init__(self, moto_url: str) -> None:
        super().__init__(moto_url, keep_host=True)
        self.key = ""
        self.after_reads = 0
        self.action: Any = None
        self.swapped = threading.Event()
        self.write_prefix = ""  # arm_write: the directory whose first write runs the action

    def arm_write(self, directory: str, action: Any) -> None:
        """Run ``action`` once, just before the first write of an object under ``directory`` is forwarded (a
        commit's new metadata file: after the commit decided how to commit, before it swaps the pointer)."""
        bucket, key = s3_key(directory.rstrip("/"))
        self.reset()
        self.key, self.action, self.swapped = "", action, threading.Event()
        self.write_prefix = f"/{bucket}/{key}/"

    def arm(self, location: str, action: Any, after_reads: int = 1) -> None:
        bucket, key = s3_key(location)
        self.reset()  # reads before now do not count
        self.key, self.after_reads, self.action, self.swapped = (
            f"/{bucket}/{key}",
            after_reads,
            action,
            threading.Event(),
        )
        self.write_prefix = ""

    def take_fault(self, method: str, path: str) -> Any:
        writes = bool(self.write_prefix) and method in ("PUT", "POST") and path.startswith(self.write_prefix)
        if (writes or self._due(path)) and not self.swapped.is_set():
            self.swapped.set()
            self.action()
        return super().take_fault(method, path)

    def _due(self, path: str) -> bool:
        mine = bool(self.key) and path.split("?")[0] == self.key
        return mine and self.count("GET", "^" + re.escape(self.key) + r"(\?|$)") >= self.after_reads


def overwrite(server: CatalogServer, location: str, document: dict[str, Any]) -> Any:
    """An action for ``SwappingStore.arm``: rewrite the object at ``location`` in moto."""
    bucket, key = s3_key(location)
    return lambda: server.moto.client("s3").put_object(Bucket=bucket, Key=key, Body=json.dumps(document).encode())


@pytest.fixture(scope="module")
def swapping(catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Any]]:
    """A catalog whose S3 endpoint is a ``SwappingStore`` in front of the session's moto."""
    store = SwappingStore(catalog_server.moto.url)
    store.start()
    try:
        with catalog_variant(tmp_path_factory.mktemp("swapping"), catalog_server.moto, endpoint=store.url) as server:
            yield Api(server), store
    finally:
        store.stop()


def _encrypted_source(api: Api) -> tuple[str, str, str, dict[str, Any]]:
    """A dropped (files kept) encrypted table's metadata: (namespace, location, its pinned digest, document)."""
    ns = api.namespace()
    location = api.create(ns, "src", {**V3, "encryption.key-id": "K1"}).json()["metadata-location"]
    row = trusted_row(api.server, ns, "src")
    assert row and row[2]
    assert api.request("DELETE", f"namespaces/{ns}/tables/src").status_code == 204
    return ns, location, str(row[2]), read_stored(api.server, location)


def test_register_pins_and_answers_the_bytes_it_checked(swapping: tuple[Api, SwappingStore]) -> None:
    # The store rewrites the file (same key id, other properties) right after the catalog's first read of it.
    api, store = swapping
    ns, location, digest, document = _encrypted_source(api)
    swapped = {**document, "properties": {**document["properties"], "owner": "swapped"}}
    store.arm(location, overwrite(api.server, location, swapped))
    registered = _register(api, ns, "copy", location)
    assert registered.status_code == 200, registered.text
    assert "owner" not in registered.json()["metadata"]["properties"], "answered from a second read"
    assert trusted_row(api.server, ns, "copy") == (location, "K1", digest, "sqe-canonical-json-sha256-v1")
    if not store.swapped.is_set():  # the catalog read the file once: the rewrite comes after the register
        store.action()
    assert "does not match its trusted digest" in assert_integrity_error(api.load(ns, "copy"))


def test_notification_admits_without_reading_the_file_again(swapping: tuple[Api, SwappingStore]) -> None:
    # Before: the admitted revision was read again for an answer nobody gets, and a rewrite in between turned an
    # admission that had already happened into a 422.
    api, store = swapping
    ns, location, digest, document = _encrypted_source(api)
    swapped = {**document, "properties": {**document["properties"], "owner": "swapped"}}
    store.arm(location, overwrite(api.server, location, swapped))
    assert api.notify(ns, "copy", "CREATE", location, int(time.time() * 1000)).status_code == 204
    assert not store.swapped.is_set(), "the notification read the file more than once"
    assert trusted_row(api.server, ns, "copy") == (location, "K1", digest, "sqe-canonical-json-sha256-v1")


def test_a_plaintext_file_rewritten_elsewhere_gets_neither_credentials_nor_commits(
    api: Api, catalog_server: CatalogServer
) -> None:
    # A protected plaintext table has no digest, but the catalog recorded where it lives: a file rewritten in
    # storage (by a holder of the table's write credentials) to name another table's place must not be vended
    # credentials for that place, nor committed on so that the catalog records it there.
    ns = api.namespace()
    victim_location = api.create(ns, "victim", V3).json()["metadata-location"]
    location = api.create(ns, "t", V3).json()["metadata-location"]
    victim_root = read_stored(catalog_server, victim_location)["location"]
    tamper(catalog_server, location, lambda d: d.__setitem__("location", victim_root))
    vended = api.request(
        "GET", f"namespaces/{ns}/tables/t", headers={"X-Iceberg-Access-Delegation": "vended-credentials"}
    )
    assert "recorded" in assert_integrity_error(vended)
    assert "recorded" in assert_integrity_error(api.set_properties(ns, "t", owner="me"))
    assert trusted_row(catalog_server, ns, "t") == (location, None, None, None)
    assert api.load(ns, "victim").status_code == 200


def test_a_register_does_what_was_authorized_when_the_name_is_taken_meanwhile(
    swapping: tuple[Api, SwappingStore],
) -> None:
    # Before: a register with overwrite of a name no table held was authorized as a new table (TABLE_CREATE only),
    # but decided again after reading the file; a table of that name registered meanwhile was then re-admitted by
    # a caller without TABLE_FULL_METADATA and past the gate for changes of restricted tables.
    api, store = swapping
    ns, location, _digest, _document = _encrypted_source(api)
    creator = api.server.principal_with_grants(f"creator_{uuid.uuid4().hex[:6]}", [("TABLE_CREATE", ns, None)])
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {api.server.token(creator)}"
    store.arm(location, lambda: _register(api, ns, "t", location), after_reads=0)  # the admin registers t first
    body = {"name": "t", "metadata-location": location, "overwrite": True}
    raced = session.post(f"{api.server.url}/v1/{api.server.warehouse}/namespaces/{ns}/register", json=body)
    assert store.swapped.is_set() and api.load(ns, "t").status_code == 200
    assert raced.status_code == 409, raced.text
    assert [e["actor"] for e in _events(api.server, ns) if e["table_name"] == "t"] == ["admin"]


def _replace_table(api: Api, ns: str, name: str) -> Any:
    """An action for ``SwappingStore.arm``: drop the table (its files stay) and create another of its name."""

    def replace() -> None:
        assert api.request("DELETE", f"namespaces/{ns}/tables/{name}").status_code == 204
        assert api.create(ns, name, V3).status_code == 200

    return replace


@pytest.mark.parametrize("protected", [True, False], ids=["protected", "legacy"])
def test_a_commit_goes_to_the_table_it_was_gated_on(swapping: tuple[Api, SwappingStore], protected: bool) -> None:
    # Before: the commit was gated (restrictions, integrity) on the table the name held then, and applied to
    # whatever the name held later: a table dropped and created again in between took the commit ungated.
    api, store = swapping
    ns = api.namespace()
    # A legacy table is not yet read by the catalog, so the gate's read is its first.
    location = api.create(ns, "t", V3).json()["metadata-location"] if protected else legacy_table(api.server, ns, "t")
    gated_uuid = read_stored(api.server, location)["table-uuid"]
    store.arm(location, _replace_table(api, ns, "t"), after_reads=0)  # while the gate reads the table
    raced = api.set_properties(ns, "t", owner="me")
    assert store.swapped.is_set()
    assert raced.status_code == 409, raced.text
    error = raced.json()["error"]
    assert error["type"] == "CommitFailedException" and gated_uuid in error["message"]
    replaced = api.load(ns, "t").json()["metadata"]
    assert replaced["table-uuid"] != gated_uuid and "owner" not in replaced["properties"]


def _registered_again(api: Api, ns: str, location: str) -> None:
    assert api.request("DELETE", f"namespaces/{ns}/tables/t").status_code == 204
    assert _register(api, ns, "t", location).status_code == 200


def _notified_again(api: Api, ns: str, location: str) -> None:
    stamp = int(time.time() * 1000)
    assert api.notify(ns, "t", "DROP", "", stamp).status_code == 204
    assert api.notify(ns, "t", "CREATE", location, stamp + 1).status_code == 204


@pytest.mark.parametrize("admit_again", [_registered_again, _notified_again], ids=["register", "notification"])
def test_a_legacy_commit_never_moves_the_pointer_of_a_table_admitted_again_meanwhile(
    swapping: tuple[Api, SwappingStore], admit_again: Any
) -> None:
    # Before: the commit decided "legacy" before pyiceberg's commit ran; the table dropped and registered again
    # from the same file (the same UUID, now protected) in between took the legacy pointer swap, which moved the
    # pointer without its pin: every later load was a 422. And the 409 that fixed it said the table "was dropped
    # and registered again", also when notifications had dropped it and admitted the file again.
    api, store = swapping
    ns = api.namespace()
    location = legacy_table(api.server, ns, "t")
    # once the commit writes its new metadata file: after it decided how to commit, before it swaps the pointer
    store.arm_write(location.rsplit("/", 1)[0], lambda: admit_again(api, ns, location))
    raced = api.set_properties(ns, "t", owner="me")
    assert store.swapped.is_set()
    assert raced.status_code == 409, raced.text
    error = raced.json()["error"]
    assert error["type"] == "CommitFailedException" and "is a protected table now" in error["message"]
    assert "by a register or a notification" in error["message"] and "registered again" not in error["message"]
    loaded = api.load(ns, "t")
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["metadata-location"] == location and "owner" not in loaded.json()["metadata"]["properties"]
    assert trusted_row(api.server, ns, "t") == (location, None, None, None)
    retried = api.set_properties(ns, "t", owner="me")  # the retry commits to the protected table
    assert retried.status_code == 200, retried.text
    assert trusted_row(api.server, ns, "t") == (retried.json()["metadata-location"], None, None, None)


def test_a_commit_to_a_missing_table_is_refused_at_the_gate(api: Api) -> None:
    ns = api.namespace()
    missing = api.set_properties(ns, "absent", owner="me")
    assert missing.status_code == 404, missing.text
    assert missing.json()["error"]["type"] == "NoSuchTableException"


def test_a_legacy_commit_past_the_metadata_limit_is_refused_unwritten(api: Api, catalog_server: CatalogServer) -> None:
    # Before: pyiceberg wrote a legacy table's new metadata file whatever its size (a protected table's is bounded),
    # so the commit succeeded and every later load of the table was a 400.
    from sqe_catalog.integrity.canonical import MAX_METADATA_FILE_BYTES

    ns = api.namespace()
    first = legacy_table(catalog_server, ns, "old", {"write.metadata.compression-codec": "gzip"})
    document = read_stored(catalog_server, first)
    pad = MAX_METADATA_FILE_BYTES - len(json.dumps(document)) - 4096
    document["properties"]["pad"] = "x" * pad
    near_limit = first.rsplit("/", 1)[0] + f"/00001-{uuid.uuid4()}.gz.metadata.json"
    bucket, key = s3_key(near_limit)
    catalog_server.moto.client("s3").put_object(
        Bucket=bucket, Key=key, Body=gzip.compress(json.dumps(document).encode(), 1)
    )
    assert _register(api, ns, "old", near_limit, overwrite=True).status_code == 200  # the legacy pointer moves
    refused = api.set_properties(ns, "old", more="y" * 65536)
    assert refused.status_code == 400, refused.text[:500]
    message = refused.json()["error"]["message"]
    assert f"more than {MAX_METADATA_FILE_BYTES} bytes (MAX_METADATA_FILE_BYTES)" in message
    loaded = api.load(ns, "old")
    assert loaded.status_code == 200 and loaded.json()["metadata-location"] == near_limit, "nothing committed"
    assert trusted_row(catalog_server, ns, "old") is None, "still legacy"


def test_a_v1_table_whose_metadata_names_no_uuid_takes_commits(api: Api, catalog_server: CatalogServer) -> None:
    # Before: table-uuid is optional in v1 and pyiceberg drew a random one at every parse, so the gate's uuid never
    # matched the one the commit read: every commit to such a table was a 409 (and every load named another uuid).
    ns = api.namespace()
    created = api.create(ns, "src", {"format-version": "1"})
    assert created.status_code == 200, created.text
    document = read_stored(catalog_server, created.json()["metadata-location"])
    assert document["format-version"] == 1
    del document["table-uuid"]
    assert api.request("DELETE", f"namespaces/{ns}/tables/src").status_code == 204
    location = created.json()["metadata-location"].rsplit("/", 1)[0] + f"/00001-{uuid.uuid4()}.metadata.json"
    bucket, key = s3_key(location)
    catalog_server.moto.client("s3").put_object(Bucket=bucket, Key=key, Body=json.dumps(document).encode())
    assert _register(api, ns, "src", location).status_code == 200
    first, again = (api.load(ns, "src").json()["metadata"]["table-uuid"] for _ in range(2))
    assert first == again, "one uuid for the table, load after load"
    committed = api.set_properties(ns, "src", owner="me")
    assert committed.status_code == 200, committed.text
    assert read_stored(catalog_server, committed.json()["metadata-location"])["table-uuid"] == first
    assert api.set_properties(ns, "src", owner="you").status_code == 200


# ---------------------------------------------------------------------------------------------------------
# Places a move leaves


@contextlib.contextmanager
def tombstones_refused(server: CatalogServer, ns: str) -> Iterator[None]:
    """The catalog's database refuses every record of a place left in ``ns`` (as a full disk or a lost database
    would refuse the write), for as long as the block runs; other namespaces are not touched."""
    with sqlite3.connect(server.workdir / "catalog.db") as db:
        db.execute(
            "CREATE TRIGGER refuse_tombstones BEFORE INSERT ON sqe_dropped_table_locations"
            f" WHEN NEW.namespace = '{ns}' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
    try:
        yield
    finally:
        with sqlite3.connect(server.workdir / "catalog.db") as db:
            db.execute("DROP TRIGGER refuse_tombstones")


def _moved_copy(server: CatalogServer, location: str, place: str) -> str:
    """A metadata file of the same table (same UUID) whose location is ``place``, written under it."""
    document = {**read_stored(server, location), "location": place}
    return put_stored(server, f"{place}/metadata/00009-{uuid.uuid4()}.metadata.json", document)


@pytest.mark.parametrize("kind", ["protected", "legacy"])
@pytest.mark.parametrize("move", ["commit", "register-overwrite"])
def test_a_move_whose_record_of_the_place_left_fails_does_not_happen(
    api: Api, catalog_server: CatalogServer, kind: str, move: str
) -> None:
    # Before: the move committed first and recorded the place it left in a transaction of its own. When that
    # write failed, the table had moved and its old place, still named by its snapshots, was free for any new
    # table (and its credentials) to claim. Now both are one transaction: the move fails with it.
    ns = api.namespace()
    if kind == "protected":
        location = api.create(ns, "t", V3).json()["metadata-location"]
    else:
        location = legacy_table(catalog_server, ns, "t")
    place = read_stored(catalog_server, location)["location"]
    moved = f"{place}-moved"

    def move_away() -> requests.Response:
        if move == "commit":
            body = {"updates": [{"action": "set-location", "location": moved}]}
            return api.request("POST", f"namespaces/{ns}/tables/t", json=body)
        return _register(api, ns, "t", _moved_copy(catalog_server, location, moved), overwrite=True)

    with tombstones_refused(catalog_server, ns):
        failed = move_away()
    assert failed.status_code == 500, failed.text
    assert "refused by the test" not in failed.text and "Traceback" not in failed.text
    loaded = api.load(ns, "t").json()
    assert loaded["metadata-location"] == location and loaded["metadata"]["location"] == place
    squat = {"name": "squat", "schema": SCHEMA, "location": place}
    held = api.request("POST", f"namespaces/{ns}/tables", json=squat)  # the table holds it still
    assert held.status_code == 400 and "overlaps the location of table" in held.json()["error"]["message"]
    assert move_away().status_code == 200  # the store accepts the record again: the move and its record happen
    assert api.load(ns, "t").json()["metadata"]["location"] == moved
    refused = api.request("POST", f"namespaces/{ns}/tables", json=squat)
    assert refused.status_code == 403 and f"{ns}.t" in refused.json()["error"]["message"]  # reserved for t


class ShortSts(FaultProxy):
    """moto's STS behind a proxy that answers every AssumeRole with an earlier ``Expiration`` (``seconds`` from
    now), as an STS that caps the session (a role's maximum session duration, role chaining) does."""

    def __init__(self, moto_url: str, seconds: int | None) -> None:
        super().__init__(moto_url, keep_host=True)  # moto checks the signature, which covers the Host header
        self.seconds = seconds  # None: moto's own answer (the lifetime asked for)

    def _upstream(self, request: Any, body: bytes) -> tuple[Any, bytes] | None:
        answered = super()._upstream(request, body)
        if answered is None or self.seconds is None or b"<AssumeRoleResponse" not in answered[1]:
            return answered
        expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=self.seconds)
        shortened = f"<Expiration>{expiry:%Y-%m-%dT%H:%M:%SZ}</Expiration>".encode()
        return answered[0], re.sub(rb"<Expiration>[^<]*</Expiration>", shortened, answered[1])


@contextlib.contextmanager
def behind_short_sts(
    catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory, seconds: int
) -> Iterator[tuple[CatalogServer, ShortSts]]:
    """A catalog of its own on the session's moto whose STS answers through ``ShortSts``; stopped on exit."""
    sts = ShortSts(catalog_server.moto.url, seconds=seconds)
    sts.start()
    try:
        with catalog_variant(tmp_path_factory.mktemp("short_sts"), catalog_server.moto, sts_endpoint=sts.url) as server:
            yield server, sts
    finally:
        sts.stop()


def _vended_load(api: Api, ns: str, name: str) -> requests.Response:
    headers = {"X-Iceberg-Access-Delegation": "vended-credentials"}
    return api.request("GET", f"namespaces/{ns}/tables/{name}", headers=headers)


def test_places_left_are_reserved_until_the_expiry_sts_answered(
    catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Before: a drop or a move reserved the places it left for the configured credential lifetime (900 s here)
    # from its own time, whatever STS answered: with credentials that expired after 5 s, the places stayed held
    # for 15 minutes. Now they are held until the latest expiry STS answered for a credential vended for them.
    with behind_short_sts(catalog_server, tmp_path_factory, seconds=10) as (server, _sts):
        api = Api(server)
        ns = api.namespace()
        places, expiries = {}, []
        for name in ("dropped", "moved"):
            assert api.create(ns, name, V3).status_code == 200
            loaded = _vended_load(api, ns, name)
            assert loaded.status_code == 200, loaded.text
            places[name] = loaded.json()["metadata"]["location"]
            config = loaded.json()["storage-credentials"][0]["config"]
            expiries.append(int(config["s3.session-token-expires-at-ms"]))
        assert max(expiries) <= time.time() * 1000 + 10_000, "STS answered the short expiry"
        assert api.request("DELETE", f"namespaces/{ns}/tables/dropped").status_code == 204
        away = {"updates": [{"action": "set-location", "location": f"{places['moved']}-moved"}]}
        assert api.request("POST", f"namespaces/{ns}/tables/moved", json=away).status_code == 200

        def claim(name: str) -> requests.Response:
            body = {"name": f"{name}_again", "schema": SCHEMA, "location": places[name]}
            return api.request("POST", f"namespaces/{ns}/tables", json=body)

        for name in places:  # the credentials vended for the places are still valid
            refused = claim(name)
            assert refused.status_code == 403 and "reserved until" in refused.json()["error"]["message"]
        time.sleep(max(0.0, max(expiries) / 1000 - time.time()) + 0.5)
        for name in places:  # they have expired: an admin (CATALOG_MANAGE_CONTENT) may claim the places
            claimed = claim(name)
            assert claimed.status_code == 200, claimed.text


def test_a_start_covers_credentials_an_older_version_vended_without_recording_them(
    catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A rolling upgrade: a process of an earlier version, which records no expiry, vends on the same database
    # while a newer one records a 5 s expiry; the older one stops and a newer one starts in its place. Before: that
    # start saw an expiry recorded and covered nothing, so a drop reserved the place only until the 5 s expiry,
    # while the older version's credential stayed valid for 15 minutes. Now every start of a serving process
    # raises the record to the lifetime asked for, from then: it cannot tell what older processes vended.
    moto = catalog_server.moto
    sts = ShortSts(moto.url, seconds=5)
    sts.start()
    try:
        workdir = tmp_path_factory.mktemp("rolling")
        with restartable_catalog(workdir, moto, {"sts_endpoint": sts.url}) as (server, restart):
            api = Api(server)
            ns = api.namespace()
            assert api.create(ns, "t", V3).status_code == 200
            loaded = _vended_load(api, ns, "t")  # the newer version records an expiry 5 s away
            assert loaded.status_code == 200, loaded.text
            place = loaded.json()["metadata"]["location"]
            recorded = int(loaded.json()["storage-credentials"][0]["config"]["s3.session-token-expires-at-ms"])
            # The older version's credential for the place: STS answered it, nothing recorded it.
            older = moto.client("sts").assume_role(
                RoleArn=moto.role_arn, RoleSessionName="sqe-older-version", DurationSeconds=900
            )
            older_expiry = older["Credentials"]["Expiration"].timestamp() * 1000
            restart()  # the older process is gone, a newer one takes its place
            api = Api(server)
            assert api.request("DELETE", f"namespaces/{ns}/tables/t").status_code == 204
            time.sleep(max(0.0, recorded / 1000 - time.time()) + 0.5)
            body = {"name": "u", "schema": SCHEMA, "location": place}
            claimed = api.request("POST", f"namespaces/{ns}/tables", json=body)
            assert time.time() * 1000 < older_expiry, "the older version's credential is still valid"
            assert claimed.status_code == 403 and f"{ns}.t" in claimed.json()["error"]["message"], claimed.text
    finally:
        sts.stop()


@pytest.mark.parametrize("change", ["drop", "move"])
def test_a_credential_vended_while_its_table_leaves_the_place_is_not_handed_out(
    catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory, change: str
) -> None:
    # Before: a load read the table, STS answered, and a drop or move committed in between reserved the place only
    # until the latest expiry recorded before it (1 s here), so the place was free to claim while the credential
    # handed out for it stayed valid for 15 minutes. Now the load hands out nothing for a place the table left.
    with behind_short_sts(catalog_server, tmp_path_factory, seconds=1) as (server, sts):
        api = Api(server)
        ns = api.namespace()
        for name in ("other", "t"):
            assert api.create(ns, name, V3).status_code == 200
        assert _vended_load(api, ns, "other").status_code == 200  # records an expiry 1 s away
        place = api.load(ns, "t").json()["metadata"]["location"]
        sts.seconds = None  # STS answers the lifetime asked for (900 s) from now on
        sts.inject("POST", "/", 0, 1, delay=3.0)  # and takes 3 s for the next AssumeRole
        asked = sts.count("POST", "/")
        answers: list[requests.Response] = []
        loading = threading.Thread(target=lambda: answers.append(_vended_load(Api(server), ns, "t")))
        loading.start()
        deadline = time.monotonic() + 20
        while sts.count("POST", "/") == asked and time.monotonic() < deadline:
            time.sleep(0.05)
        if change == "drop":
            assert api.request("DELETE", f"namespaces/{ns}/tables/t").status_code == 204
        else:
            away = {"updates": [{"action": "set-location", "location": f"{place}-moved"}]}
            assert api.request("POST", f"namespaces/{ns}/tables/t", json=away).status_code == 200
        loading.join(timeout=30)
        (loaded,) = answers
        assert "storage-credentials" not in loaded.text
        expected = (404, "NoSuchTableException") if change == "drop" else (503, "ServiceUnavailableException")
        assert (loaded.status_code, loaded.json()["error"]["type"]) == expected, loaded.text
        assert f"{ns}.t" in loaded.json()["error"]["message"]


def test_a_credential_whose_expiry_cannot_be_recorded_is_not_handed_out(
    api: Api, catalog_server: CatalogServer
) -> None:
    # The expiry is recorded before the credential is handed out: when the database refuses the record, the load
    # fails with a 500 naming a request id (the log has the database's line, no traceback) and vends nothing.
    ns = api.namespace()
    assert api.create(ns, "t", V3).status_code == 200
    refuse = "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
    with sqlite3.connect(catalog_server.workdir / "catalog.db") as db:
        for event in ("INSERT", "UPDATE"):
            db.execute(f"CREATE TRIGGER refuse_vended_{event} BEFORE {event} ON sqe_vended_credentials {refuse}")
    logged = catalog_server.log_path.stat().st_size
    time.sleep(1.1)  # STS answers whole seconds: this expiry is later than any recorded, so the record writes
    try:
        failed = _vended_load(api, ns, "t")
    finally:
        with sqlite3.connect(catalog_server.workdir / "catalog.db") as db:
            for event in ("INSERT", "UPDATE"):
                db.execute(f"DROP TRIGGER refuse_vended_{event}")
    assert failed.status_code == 500 and failed.json()["error"]["code"] == 500, failed.text
    assert "storage-credentials" not in failed.text and "refused by the test" not in failed.text
    with catalog_server.log_path.open() as log:
        log.seek(logged)
        written = log.read()
    assert "database error" in written and "Traceback" not in written
    loaded = _vended_load(api, ns, "t")  # recorded again: the credential is handed out
    assert loaded.status_code == 200 and loaded.json()["storage-credentials"], loaded.text


def _staged_with_credentials(api: Api, ns: str, name: str) -> tuple[str, str, int]:
    """Stage-create ``name`` asking for vended credentials: (its place, its table UUID, the credential's expiry)."""
    body = {"name": name, "schema": SCHEMA, "stage-create": True, "properties": V3}
    headers = {"X-Iceberg-Access-Delegation": "vended-credentials"}
    staged = api.request("POST", f"namespaces/{ns}/tables", json=body, headers=headers)
    assert staged.status_code == 200, staged.text
    answer = staged.json()
    config = answer["storage-credentials"][0]["config"]
    expiry = int(config["s3.session-token-expires-at-ms"])
    return answer["metadata"]["location"], answer["metadata"]["table-uuid"], expiry


def _reservation_ends(server: CatalogServer, table_uuid: str) -> list[int]:
    with sqlite3.connect(server.workdir / "catalog.db") as db:
        rows = db.execute("SELECT until_ms FROM sqe_reserved_table_locations WHERE table_uuid = ?", (table_uuid,))
        return [int(until) for (until,) in rows]


def test_a_staged_place_stays_reserved_while_the_credential_its_answer_carried_is_valid(
    catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Before: a stage-create reserved its place until the configured lifetime from the reservation, and vended its
    # credential after that: STS, taking 3 s to answer here, made it valid 3 s longer than the reservation, so the
    # place was free to claim while the credential could still write there. Now the reservation ends when the
    # credential it handed out expires.
    with behind_short_sts(catalog_server, tmp_path_factory, seconds=0) as (server, sts):
        sts.seconds = None  # moto's own answer: the lifetime asked for (900 s), from when it answers
        sts.inject("POST", "/", 0, 1, delay=3.0)
        api = Api(server)
        ns = api.namespace()
        place, table_uuid, expiry = _staged_with_credentials(api, ns, "t")
        (until,) = _reservation_ends(server, table_uuid)
        assert until >= expiry, "the reservation ends before the credential handed out for the place"
        body = {"name": "u", "schema": SCHEMA, "location": place}
        squat = api.request("POST", f"namespaces/{ns}/tables", json=body)
        assert squat.status_code == 403 and "reserved until" in squat.json()["error"]["message"], squat.text


def test_a_staged_place_is_free_once_the_credential_its_answer_carried_expired(
    catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Before: the staged place stayed reserved for the configured lifetime (900 s) whatever STS answered; with a
    # credential that expired after 5 s, nobody could create a table there for 15 minutes. Now the reservation
    # reflects the expiry STS answered for the credential the answer carried.
    with behind_short_sts(catalog_server, tmp_path_factory, seconds=5) as (server, _sts):
        api = Api(server)
        ns = api.namespace()
        place, table_uuid, expiry = _staged_with_credentials(api, ns, "t")
        assert _reservation_ends(server, table_uuid) == [expiry]

        def claim() -> requests.Response:
            body = {"name": "u", "schema": SCHEMA, "location": place}
            return api.request("POST", f"namespaces/{ns}/tables", json=body)

        refused = claim()  # the credential is still valid
        assert refused.status_code == 403 and f"{ns}.t" in refused.json()["error"]["message"], refused.text
        time.sleep(max(0.0, expiry / 1000 - time.time()) + 0.5)
        claimed = claim()
        assert claimed.status_code == 200, claimed.text


# ---------------------------------------------------------------------------------------------------------
# Claims of places across catalog processes on one database


@dataclasses.dataclass
class TwoProcesses:
    """Two catalog processes serving one SQLite database; ``slow``'s storage goes through ``store`` (a proxy
    that can hold its requests), ``fast``'s straight to moto."""

    slow: Api
    fast: Api
    store: FaultProxy


@pytest.fixture(scope="module")
def two_processes(catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoProcesses]:
    moto = catalog_server.moto
    store = FaultProxy(moto.url, keep_host=True)  # moto checks the signature, which covers the Host header
    store.start()
    try:
        with catalog_variant(tmp_path_factory.mktemp("claims_slow"), moto, endpoint=store.url) as slow:
            workdir = tmp_path_factory.mktemp("claims_fast")
            port = free_loopback_port()
            config = write_catalog_config(workdir, moto, port, database=f"sqlite:///{slow.workdir / 'catalog.db'}")
            process = start_catalog_process(config, workdir, port)
            try:  # the same database, so the same principals: the slow one's admin signs in here too
                fast = dataclasses.replace(slow, url=f"http://127.0.0.1:{port}", port=port, pid=process.pid)
                yield TwoProcesses(Api(slow), Api(fast), store)
            finally:
                stop_process(process)
    finally:
        store.stop()


def _requests_to(store: FaultProxy, method: str, path: str) -> int:
    pattern = re.compile(path)
    with store.lock:
        return sum(1 for seen in store.received if method in ("*", seen[0]) and pattern.search(seen[1]))


def _held_until_reached(store: FaultProxy, method: str, path: str, action: Any, passed: int = 0) -> threading.Thread:
    """Start ``action`` on a thread with its ``method`` request (``*``: any) to ``path`` (a regex) held 3 s at
    ``store``, after ``passed`` such requests went through; returns once the held one has reached the store (the
    action is inside it), the thread still running."""
    before = _requests_to(store, method, path)
    if passed:
        store.inject(method, path, 0, passed)  # no delay, no answer of its own: forwarded as they come
    store.inject(method, path, 0, 1, delay=3.0)
    thread = threading.Thread(target=action)
    thread.start()
    deadline = time.monotonic() + 30
    while _requests_to(store, method, path) <= before + passed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _requests_to(store, method, path) > before + passed, "the held request never reached the store"
    return thread


def _move(api: Api, ns: str, name: str, location: str) -> requests.Response:
    body = {"updates": [{"action": "set-location", "location": location}]}
    return api.request("POST", f"namespaces/{ns}/tables/{name}", json=body)


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(f"{b}/") or b.startswith(f"{a}/")


def test_a_move_in_one_process_and_a_claim_of_its_target_in_another_never_both_hold_the_place(
    two_processes: TwoProcesses,
) -> None:
    # Before: claims were serialised by a lock of each process only. A move of t to M in one process checked M
    # free, then wrote its metadata (held here); meanwhile another process created u at M; then the move committed
    # too: t and u both held M, and each one's writers were vended credentials for the other's files. Now the move
    # sees the claim that committed behind its checks, checks again and is refused.
    slow, fast, store = two_processes.slow, two_processes.fast, two_processes.store
    ns = slow.namespace()
    place = slow.create(ns, "t", V3).json()["metadata"]["location"]
    target = f"{place}-target"
    moved: list[requests.Response] = []
    # The move's first write of a metadata file under the target: its checks have passed by then.
    moving = _held_until_reached(
        store,
        "*",
        re.escape(target.removeprefix("s3://")) + "/metadata/",
        lambda: moved.append(_move(slow, ns, "t", target)),
    )
    created = fast.request("POST", f"namespaces/{ns}/tables", json={"name": "u", "schema": SCHEMA, "location": target})
    moving.join(timeout=60)
    (move,) = moved
    assert created.status_code == 200, created.text
    assert move.status_code == 400 and f"overlaps the location of table {ns}.u" in move.json()["error"]["message"]
    t_place = slow.load(ns, "t").json()["metadata"]["location"]
    u_place = slow.load(ns, "u").json()["metadata"]["location"]
    assert not _overlap(t_place, u_place), (t_place, u_place)


def test_the_places_a_move_leaves_are_those_of_the_revision_it_moves_from_when_another_process_moved_it(
    two_processes: TwoProcesses,
) -> None:
    # Before: a move in one process read the table's places (held here, reading its metadata) while another
    # process moved the table from P to N; the first move then committed on that newer revision and recorded as
    # left the places it had read (P), not N: N was neither reserved nor recorded, and a new table could claim it
    # at once while credentials vended for t at N stayed valid. Now the first move sees the other's claim,
    # computes what it leaves again (N), and N stays reserved for t.
    slow, fast, store = two_processes.slow, two_processes.fast, two_processes.store
    ns = slow.namespace()
    created = slow.create(ns, "t", V3).json()
    place, metadata_location = created["metadata"]["location"], created["metadata-location"]
    moved: list[requests.Response] = []
    # The move reads the table's metadata file for its gate, then to find the places the table holds: that read
    # is held, after the table's pointer was read.
    metadata_file = re.escape(metadata_location.removeprefix("s3://"))
    moving = _held_until_reached(
        store, "GET", metadata_file, lambda: moved.append(_move(slow, ns, "t", f"{place}-m")), passed=1
    )
    assert _move(fast, ns, "t", f"{place}-n").status_code == 200
    moving.join(timeout=60)
    (move,) = moved
    assert move.status_code == 200, move.text
    assert slow.load(ns, "t").json()["metadata"]["location"] == f"{place}-m"
    for left in (place, f"{place}-n"):  # both places t left while credentials for them may be valid
        body = {"name": f"squat_{uuid.uuid4().hex[:6]}", "schema": SCHEMA, "location": left}
        squat = fast.request("POST", f"namespaces/{ns}/tables", json=body)
        assert squat.status_code == 403 and f"{ns}.t" in squat.json()["error"]["message"], (left, squat.text)


@pytest.fixture(scope="module")
def uncached_behind_store(
    catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Api, FaultProxy]]:
    """A catalog whose storage goes through a proxy that can hold its requests, caching no metadata file (so every
    read of one reaches the proxy)."""
    moto = catalog_server.moto
    store = FaultProxy(moto.url, keep_host=True)
    store.start()
    try:
        workdir = tmp_path_factory.mktemp("drop_race")
        with catalog_variant(workdir, moto, endpoint=store.url, metadata_cache_entries=0) as server:
            yield Api(server), store
    finally:
        store.stop()


def test_a_drop_keeps_the_places_of_the_revision_it_drops_when_the_table_moved_meanwhile(
    uncached_behind_store: tuple[Api, FaultProxy],
) -> None:
    # Before: a drop read the table's places (here a legacy table's, from its metadata file: that read is held),
    # then deleted the row by name. A move from P to N committing in between recorded P as left; the drop then
    # removed the moved table and recorded as dropped the places it had read (P): N was neither reserved nor
    # recorded, and a new table could claim it at once while credentials vended for t at N stayed valid. Now the
    # drop removes the row only at the pointer it read the places from, and reads them again when it moved.
    api, store = uncached_behind_store
    ns = api.namespace()
    metadata_file = legacy_table(api.server, ns, "probe")  # how many reads of its file a drop makes
    pattern = re.escape(metadata_file.removeprefix("s3://"))
    before = _requests_to(store, "GET", pattern)
    assert api.request("DELETE", f"namespaces/{ns}/tables/probe").status_code == 204
    reads = _requests_to(store, "GET", pattern) - before
    assert reads >= 1

    metadata_file = legacy_table(api.server, ns, "t")
    place = metadata_file.rsplit("/metadata/", 1)[0]
    dropped: list[requests.Response] = []
    dropping = _held_until_reached(
        store,
        "GET",
        re.escape(metadata_file.removeprefix("s3://")),
        lambda: dropped.append(api.request("DELETE", f"namespaces/{ns}/tables/t")),
        passed=reads - 1,  # the drop's last read of the file: the places it records
    )
    assert _move(api, ns, "t", f"{place}-n").status_code == 200
    dropping.join(timeout=60)
    (drop,) = dropped
    assert drop.status_code == 204, drop.text
    assert api.load(ns, "t").status_code == 404
    for left in (place, f"{place}-n"):  # both places t held while credentials for them may be valid
        body = {"name": f"squat_{uuid.uuid4().hex[:6]}", "schema": SCHEMA, "location": left}
        squat = api.request("POST", f"namespaces/{ns}/tables", json=body)
        assert squat.status_code == 403 and f"{ns}.t" in squat.json()["error"]["message"], (left, squat.text)


def test_a_move_that_lost_its_target_to_another_process_leaves_no_metadata_file_there(
    two_processes: TwoProcesses,
) -> None:
    # Before: a move wrote its new metadata file under the target, then found in its transaction that another
    # process had claimed places meanwhile and was refused on its second check; the file it had written stayed
    # under the other table's place, t's schema, snapshots and properties readable with credentials vended for u.
    # Now a claim whose record lost to another process's removes the file it wrote before trying again.
    slow, fast, store = two_processes.slow, two_processes.fast, two_processes.store
    ns = slow.namespace()
    place = slow.create(ns, "t", V3).json()["metadata"]["location"]
    target = f"{place}-target"
    moved: list[requests.Response] = []
    moving = _held_until_reached(
        store,
        "*",
        re.escape(target.removeprefix("s3://")) + "/metadata/",
        lambda: moved.append(_move(slow, ns, "t", target)),
    )
    created = fast.request("POST", f"namespaces/{ns}/tables", json={"name": "u", "schema": SCHEMA, "location": target})
    moving.join(timeout=60)
    (move,) = moved
    assert created.status_code == 200, created.text
    assert move.status_code == 400, move.text
    u_file = s3_key(created.json()["metadata-location"])[1]
    assert objects(slow.server, s3_key(target)[1] + "/") == [u_file]


def test_a_view_create_that_lost_its_place_to_another_process_leaves_no_metadata_file_there(
    two_processes: TwoProcesses,
) -> None:
    # Before: as a move's, a view create's metadata file written before its record lost to another process's
    # claim of the place stayed there, under the table that took it. Now it is deleted before the next attempt.
    slow, fast, store = two_processes.slow, two_processes.fast, two_processes.store
    ns = slow.namespace()
    place = f"{slow.server.warehouse_location}/{ns}/v"  # where a new view v goes
    version = {
        "version-id": 1,
        "schema-id": 0,
        "timestamp-ms": 1,
        "summary": {"operation": "create"},
        "representations": [{"type": "sql", "sql": "SELECT 1 AS id", "dialect": "duckdb"}],
        "default-namespace": [ns],
    }
    created_view: list[requests.Response] = []
    body = {"name": "v", "schema": SCHEMA, "view-version": version}
    creating = _held_until_reached(
        store,
        "*",
        re.escape(place.removeprefix("s3://")) + "/metadata/",
        lambda: created_view.append(slow.request("POST", f"namespaces/{ns}/views", json=body)),
    )
    created = fast.request("POST", f"namespaces/{ns}/tables", json={"name": "u", "schema": SCHEMA, "location": place})
    creating.join(timeout=60)
    (view,) = created_view
    assert created.status_code == 200, created.text
    assert view.status_code == 400 and f"overlaps the location of table {ns}.u" in view.text, view.text
    u_file = s3_key(created.json()["metadata-location"])[1]
    assert objects(slow.server, s3_key(place)[1] + "/") == [u_file]
