"""Storage tampering on Ceph RGW against the stack's ``sqe-catalog`` (``sqe_catalog.integrity``).

The metadata file of a protected table is rewritten in the bucket with the store's root key (the catalog's own
static key, set-up only), behind the catalog's back. The next load must answer 422 (ErrorModel type
``MetadataIntegrityException``), a drop with purge must be refused, and when the file is tampered with after the
drop was accepted, the background cleaner must end the task ``failed``; in every case no object under the
table's prefix is deleted (listed before and after).
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
import requests

from sqe_stack import StackInfo, admin_s3_client
from sqe_stack.catalog import catalog_log_path
from tests.e2e.test_ceph_enforcement import _admin, _rest_catalog, _table_url, _token

pytestmark = [pytest.mark.e2e, pytest.mark.ceph]

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
ENCRYPTED = {"format-version": "3", "encryption.key-id": "K1"}
INTEGRITY = "MetadataIntegrityException"
ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
Change = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Api:
    """Raw REST calls to the stack's catalog as its admin principal."""

    stack: StackInfo
    base: str  # .../v1/{prefix}
    token: str

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return requests.request(method, f"{self.base}/{path}", headers=headers, timeout=60, **kwargs)

    def create(self, ns: str, name: str, properties: dict[str, str]) -> str:
        body = {"name": name, "schema": SCHEMA, "properties": properties}
        response = self.request("POST", f"namespaces/{ns}/tables", json=body)
        assert response.status_code == 200, response.text
        return str(response.json()["metadata-location"])

    def commit_property(self, ns: str, name: str, key: str, value: str) -> str:
        body = {"updates": [{"action": "set-properties", "updates": {key: value}}]}
        response = self.request("POST", f"namespaces/{ns}/tables/{name}", json=body)
        assert response.status_code == 200, response.text
        return str(response.json()["metadata-location"])

    def load(self, ns: str, name: str) -> requests.Response:
        return self.request("GET", f"namespaces/{ns}/tables/{name}")

    def purge(self, ns: str, name: str) -> requests.Response:
        return self.request("DELETE", f"namespaces/{ns}/tables/{name}", params={"purgeRequested": "true"})


@pytest.fixture(scope="module")
def api(ceph_stack: StackInfo) -> Api:
    token = _token(ceph_stack, "admin")
    table_url = _table_url(ceph_stack, {"Authorization": f"Bearer {token}"}, "x", "y")
    return Api(ceph_stack, table_url.split("/namespaces/")[0], token)


@pytest.fixture()
def namespace(api: Api) -> str:
    name = f"cint_{uuid.uuid4().hex[:8]}"
    assert api.request("POST", "namespaces", json={"namespace": [name]}).status_code == 200
    return name


def split(location: str) -> tuple[str, str]:
    parsed = urllib.parse.urlparse(location)
    return parsed.netloc, parsed.path.strip("/")


def tamper(stack: StackInfo, location: str, change: Change) -> None:
    """Rewrite the metadata file on RGW with the store's root key."""
    bucket, key = split(location)
    s3 = admin_s3_client(stack)
    document = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    change(document)
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(document, indent=2).encode())


def objects(stack: StackInfo, location: str) -> list[str]:
    """Every object under the table's prefix (the directory of ``location``'s ``metadata/`` parent)."""
    bucket, key = split(location)
    prefix = key.rsplit("/metadata/", 1)[0] + "/"
    listing = admin_s3_client(stack).list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listing.get("Contents", []) if not o["Key"].endswith("/"))


def assert_integrity_error(response: requests.Response) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == (INTEGRITY, 422)
    assert "Traceback" not in response.text
    return str(error["message"])


def cleanup_tasks(stack: StackInfo, ns: str) -> list[dict[str, Any]]:
    return [t for t in json.loads(_admin(stack, "list-cleanup-tasks")) if t["namespace"] == ns]


def wait_for_cleaner(stack: StackInfo, ns: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        tasks = cleanup_tasks(stack, ns)
        if tasks and not any(t["status"] in ("pending", "running") for t in tasks):
            return tasks
        assert time.monotonic() < deadline, f"the background cleaner did not finish: {tasks}"
        time.sleep(0.25)


def plaintext_with_data(stack: StackInfo, ns: str, name: str) -> str:
    """A protected plaintext table with a data file, written by the writer through pyiceberg (vended keys)."""
    table = _rest_catalog(stack, "writer").create_table((ns, name), schema=ROWS.schema)
    table.append(ROWS)
    table.refresh()
    return str(table.metadata_location)


def _other_snapshots(document: dict[str, Any]) -> None:
    snapshot = {
        "snapshot-id": 1,
        "timestamp-ms": 1,
        "sequence-number": 1,
        "manifest-list": f"{document['location']}/metadata/snap-1.avro",
        "summary": {"operation": "append"},
        "first-row-id": 0,
        "added-rows": 0,
    }
    document["snapshots"] = [snapshot]


def _other_schema(document: dict[str, Any]) -> None:
    fields = document["schemas"][0]["fields"]
    fields.append(dict(fields[0], id=9, name="extra"))


def _other_encryption_keys(document: dict[str, Any]) -> None:
    document["encryption-keys"] = [{"key-id": "evil", "encrypted-key-metadata": "AA=="}]


def _add_key_id(document: dict[str, Any]) -> None:
    document["properties"]["encryption.key-id"] = "K1"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_other_snapshots, id="snapshots"),
        pytest.param(_other_schema, id="schema"),
        pytest.param(_other_encryption_keys, id="encryption-keys"),
    ],
)
def test_tampered_encrypted_metadata_on_rgw_fails_load_and_purge(
    api: Api, ceph_stack: StackInfo, namespace: str, change: Change
) -> None:
    api.create(namespace, "t", ENCRYPTED)
    location = api.commit_property(namespace, "t", "owner", "me")  # two metadata files, a metadata log
    assert api.load(namespace, "t").status_code == 200
    tamper(ceph_stack, location, change)
    assert "trusted digest" in assert_integrity_error(api.load(namespace, "t"))
    before = objects(ceph_stack, location)
    assert len(before) == 2
    assert_integrity_error(api.purge(namespace, "t"))
    assert objects(ceph_stack, location) == before, "a refused purge deletes nothing"
    assert_integrity_error(api.load(namespace, "t"))  # the table is still there, still refused
    assert cleanup_tasks(ceph_stack, namespace) == []


def test_key_id_added_on_rgw_to_protected_plaintext_fails_load_and_purge(
    api: Api, ceph_stack: StackInfo, namespace: str
) -> None:
    location = plaintext_with_data(ceph_stack, namespace, "t")
    before = objects(ceph_stack, location)
    assert any(key.endswith(".parquet") for key in before), before
    tamper(ceph_stack, location, _add_key_id)
    assert "encryption.key-id" in assert_integrity_error(api.load(namespace, "t"))
    assert_integrity_error(api.purge(namespace, "t"))
    assert objects(ceph_stack, location) == before, "a refused purge deletes nothing"
    assert cleanup_tasks(ceph_stack, namespace) == []


@pytest.mark.parametrize(
    ("kind", "change"),
    [pytest.param("encrypted", _other_schema, id="encrypted-schema"), pytest.param("plaintext", _add_key_id)],
)
def test_tampering_after_an_accepted_purge_fails_the_cleanup_task_and_deletes_nothing(
    api: Api, ceph_stack: StackInfo, namespace: str, kind: str, change: Change
) -> None:
    if kind == "encrypted":
        location = api.create(namespace, "t", ENCRYPTED)
    else:
        location = plaintext_with_data(ceph_stack, namespace, "t")
    assert api.purge(namespace, "t").status_code == 204
    # the cleaner runs a task one interval (2 s) after it was persisted: tamper in between
    tamper(ceph_stack, location, change)
    before = objects(ceph_stack, location)
    (task,) = wait_for_cleaner(ceph_stack, namespace)
    assert (task["status"], task["metadata_location"]) == ("failed", location), task
    assert "trusted digest" in task["detail"] or "encryption.key-id" in task["detail"], task
    assert objects(ceph_stack, location) == before, "a failed cleanup task deletes nothing"
    log = catalog_log_path(ceph_stack.dir).read_text(errors="replace")
    assert f"cleanup task {task['id']} of {ceph_stack.warehouse}.{namespace}.t failed integrity verification" in log
