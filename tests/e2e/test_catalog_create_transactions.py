"""Create transactions (a commit whose requirements hold ``assert-create``) against the real ``sqe-catalog`` on moto.

A create transaction makes a table just as ``POST .../tables`` does, so it must pass every check a create passes:
the read-restrictions gate on the table it would make, the location rules (inside the warehouse, no overlap
with a table, a dropped table's files, a reserved place, another namespace's area) and the pin a new table
starts with. Each test sends the raw commit of a create transaction (what pyiceberg's
``create_table_transaction`` sends once its stage-create returned), so no stage-create gates it first. Only the
gate was missing; the location checks and the pin already held for create transactions and are pinned down here.
The stage-create tests at the end check what pyiceberg's own create transaction needs from the stage-create
answer: its vended credential in ``config`` too, for exactly the callers it goes to in ``storage-credentials``.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
import requests
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

import sqe.api
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.unit.sqe_catalog.test_restrictions import SCHEMA  # id, email, region

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

DECLARED = {"X-Gravitino-Client-Capabilities": "read-restrictions.v1"}
VENDED = {"X-Iceberg-Access-Delegation": "vended-credentials"}
CREDENTIAL_KEYS = ("s3.access-key-id", "s3.secret-access-key", "s3.session-token", "s3.session-token-expires-at-ms")


def table_updates() -> list[dict[str, Any]]:
    """A create transaction's schema, unpartitioned spec and unsorted order, each added and made the default."""
    return [
        {"action": "add-schema", "schema": SCHEMA, "last-column-id": 3},
        {"action": "set-current-schema", "schema-id": -1},
        {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
        {"action": "set-default-spec", "spec-id": -1},
        {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
        {"action": "set-default-sort-order", "sort-order-id": -1},
    ]


class Client:
    """Raw REST calls of one bearer token in the session's warehouse."""

    def __init__(self, server: CatalogServer, token: str) -> None:
        self.server = server
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return self.session.request(
            method, f"{self.server.url}/v1/{self.server.warehouse}/{path}", timeout=60, **kwargs
        )

    def create_transaction(
        self,
        ns: str,
        name: str,
        location: str | None = None,
        headers: dict[str, str] | None = None,
        properties: dict[str, str] | None = None,
    ) -> requests.Response:
        """The commit of a create transaction (assert-create), as pyiceberg sends it, without its stage-create."""
        updates: list[dict[str, Any]] = [
            {"action": "assign-uuid", "uuid": str(uuid.uuid4())},
            {"action": "upgrade-format-version", "format-version": 2},
            *table_updates(),
        ]
        if location is not None:
            updates.append({"action": "set-location", "location": location})
        if properties:
            updates.append({"action": "set-properties", "updates": properties})
        body = {"requirements": [{"type": "assert-create"}], "updates": updates}
        return self.request("POST", f"namespaces/{ns}/tables/{name}", json=body, headers=headers)

    def exists(self, ns: str, name: str) -> bool:
        return self.request("HEAD", f"namespaces/{ns}/tables/{name}").status_code == 204


def error_of(response: requests.Response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and "Traceback" not in response.text
    return f"{error['type']}: {error['message']}"


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def admin(catalog_server: CatalogServer) -> Client:
    return Client(catalog_server, catalog_server.token(catalog_server.admin))


def namespace(admin: Client) -> str:
    ns = unique("ctx")
    assert admin.request("POST", "namespaces", json={"namespace": [ns]}).status_code == 200
    return ns


def creator(server: CatalogServer, *namespaces: str) -> CatalogPrincipal:
    """A principal that may create tables (and read their data) in ``namespaces`` only."""
    grants = [(privilege, ns, None) for ns in namespaces for privilege in ("TABLE_CREATE", "TABLE_READ_DATA")]
    return server.principal_with_grants(unique("creator"), grants)


def restrict_new_tables(admin: Client, ns: str) -> None:
    """An enabled row-filter policy selected by a tag on ``ns``: every table made there is restricted."""
    tag, policy = unique("sensitivity"), unique("rf")
    body = {
        "name": policy,
        "policyType": "system_row_filter",
        "content": {"expression": 'filter := col("region") == "EU"'},
    }
    assert admin.request("POST", "policies", json=body).status_code == 200
    selector = {"tag": tag, "selector": "ALL_VALUES"}
    assert admin.request("POST", f"policies/{policy}/tags", json=selector).status_code == 200
    assert admin.request("PUT", f"policies/{policy}", json={"enabled": True}).status_code == 200
    assigned = admin.request("POST", "tags", json={"object": {"namespace": [ns]}, "tag": tag})
    assert assigned.status_code == 204, assigned.text


def test_a_create_transaction_is_gated_like_a_create(
    admin: Client, catalog_server: CatalogServer, catalog_reader: CatalogPrincipal
) -> None:
    # Before: the gate ran on POST .../tables only; a create transaction's commit made a table its restrictions
    # say the caller may only be served through a trusted reader, and answered with its metadata.
    ns = namespace(admin)
    restrict_new_tables(admin, ns)
    user = creator(catalog_server, ns)
    own = Client(catalog_server, catalog_server.token(user))
    assert "trusted reader" in error_of(
        own.request("POST", f"namespaces/{ns}/tables", json={"name": "a", "schema": SCHEMA}, headers=DECLARED), 403
    )
    assert "trusted reader" in error_of(own.create_transaction(ns, "t", headers=DECLARED), 403)
    assert not admin.exists(ns, "t"), "a refused create leaves no table"
    error_of(own.create_transaction(ns, "t"), 406)  # the capability is not declared
    assert not admin.exists(ns, "t")
    via_reader = Client(catalog_server, catalog_server.delegated_token(user, catalog_reader))
    served = via_reader.create_transaction(ns, "t", headers=DECLARED)
    assert served.status_code == 200, served.text
    loaded = via_reader.request("GET", f"namespaces/{ns}/tables/t", headers=DECLARED)
    assert loaded.status_code == 200 and loaded.json()["read-restrictions"], loaded.text


def test_a_create_transaction_may_not_take_another_namespaces_area(
    admin: Client, catalog_server: CatalogServer
) -> None:
    ns, other = namespace(admin), namespace(admin)
    own = Client(catalog_server, catalog_server.token(creator(catalog_server, ns)))
    inside_other = f"{catalog_server.warehouse_location}/{other}/mine"
    refused = error_of(own.create_transaction(ns, "t", location=inside_other), 403)
    assert f"area of namespace {other}" in refused and "TABLE_CREATE" in refused
    assert not admin.exists(ns, "t")
    assert admin.create_transaction(ns, "t", location=inside_other).status_code == 200  # may create there


def test_a_create_transaction_stays_inside_the_warehouse_and_off_other_tables(
    admin: Client, catalog_server: CatalogServer
) -> None:
    ns = namespace(admin)
    outside = error_of(admin.create_transaction(ns, "t", location="s3://elsewhere/t"), 400)
    assert "inside the warehouse location" in outside
    taken = admin.create_transaction(ns, "first")
    assert taken.status_code == 200, taken.text
    inner = f"{taken.json()['metadata']['location']}/inner"
    assert "overlaps the location of table" in error_of(admin.create_transaction(ns, "t", location=inner), 400)
    data_path = {"write.data.path": inner}
    assert "overlaps the location of table" in error_of(admin.create_transaction(ns, "t", properties=data_path), 400)
    assert "py-io-impl" in error_of(admin.create_transaction(ns, "t", properties={"py-io-impl": "x.Y"}), 400)
    assert not admin.exists(ns, "t")


def test_a_create_transaction_claims_no_dropped_or_reserved_place(admin: Client, catalog_server: CatalogServer) -> None:
    ns = namespace(admin)
    own = Client(catalog_server, catalog_server.token(creator(catalog_server, ns)))
    dropped = admin.create_transaction(ns, "gone").json()["metadata"]["location"]
    assert admin.request("DELETE", f"namespaces/{ns}/tables/gone").status_code == 204  # files kept
    refused = error_of(own.create_transaction(ns, "t", location=dropped), 403)
    assert "dropped or moved table" in refused and "CATALOG_MANAGE_CONTENT" in refused
    staged = admin.request(
        "POST", f"namespaces/{ns}/tables", json={"name": "s", "schema": SCHEMA, "stage-create": True}
    )
    assert staged.status_code == 200, staged.text
    place = staged.json()["metadata"]["location"]
    assert "reserved until" in error_of(admin.create_transaction(ns, "other", location=place), 403)
    assert admin.create_transaction(ns, "s", location=place).status_code == 200  # the staged table's own place


def test_a_create_transaction_pins_the_new_table(catalog_server: CatalogServer, admin: Client) -> None:
    ns = namespace(admin)
    catalog = pyiceberg_catalog(catalog_server, catalog_server.admin)
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "region", StringType()))
    for name, properties in (("plain", {}), ("enc", {"format-version": "3", "encryption.key-id": "K1"})):
        transaction = catalog.create_table_transaction(f"{ns}.{name}", schema, properties=properties)
        table = transaction.commit_transaction()
        with sqlite3.connect(catalog_server.workdir / "catalog.db") as db:
            pin = db.execute(
                "SELECT metadata_location, key_id FROM sqe_table_integrity WHERE namespace = ? AND table_name = ?",
                (ns, name),
            ).fetchone()
        assert pin == (table.metadata_location, properties.get("encryption.key-id")), name


def test_a_create_transaction_gets_the_default_table_properties_as_a_create_does(admin: Client) -> None:
    # Before: the server's default_table_properties were merged only into POST .../tables; a create transaction
    # sent without a stage-create (whose answer carries them) made a table without them.
    ns = namespace(admin)
    created = admin.create_transaction(ns, "plain")
    assert created.status_code == 200, created.text
    assert created.json()["metadata"]["properties"]["write.parquet.compression-codec"] == "zstd"
    own = admin.create_transaction(ns, "own", properties={"write.parquet.compression-codec": "snappy"})
    assert own.status_code == 200, own.text
    assert own.json()["metadata"]["properties"]["write.parquet.compression-codec"] == "snappy", "the commit's wins"
    loaded = admin.request("GET", f"namespaces/{ns}/tables/plain").json()["metadata"]["properties"]
    assert loaded["write.parquet.compression-codec"] == "zstd"


@pytest.mark.parametrize("missing", ["everything", "add-spec", "add-schema", "add-sort-order"])
def test_a_create_transaction_missing_a_schema_spec_or_sort_order_is_a_400(admin: Client, missing: str) -> None:
    # Before: pyiceberg looked the new table's default schema, spec or sort order up with next() over an empty
    # list; the StopIteration surfaced as a 500.
    ns = namespace(admin)
    kept = [] if missing == "everything" else [u for u in table_updates() if u["action"] != missing]
    body = {"requirements": [{"type": "assert-create"}], "updates": kept}
    refused = admin.request("POST", f"namespaces/{ns}/tables/t", json=body)
    assert "BadRequestException: invalid table update" in error_of(refused, 400)
    assert not admin.exists(ns, "t")


def stage_create(client: Client, server: CatalogServer, ns: str, name: str, headers: dict[str, str]) -> dict[str, Any]:
    """A stage-create's answer (200 asserted); its vended secrets join ``server.secrets``."""
    body = {"name": name, "schema": SCHEMA, "stage-create": True}
    staged = client.request("POST", f"namespaces/{ns}/tables", json=body, headers=headers)
    assert staged.status_code == 200, staged.text
    answer: dict[str, Any] = staged.json()
    for config in [answer["config"], *(c["config"] for c in answer.get("storage-credentials", []))]:
        server.secrets.update(config[key] for key in ("s3.secret-access-key", "s3.session-token") if key in config)
    return answer


def vended_keys(config: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in config.items() if key in CREDENTIAL_KEYS}


@pytest.mark.usefixtures("bogus_aws_env")
def test_a_pyiceberg_create_transaction_appends_with_the_staged_tables_credential(
    admin: Client, catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    # Before: the stage-create answer carried its vended credential in storage-credentials only; pyiceberg picks
    # an entry there by the answer's metadata-location, which a staged table has none of, so the append wrote
    # with the (bogus) ambient keys and failed. Now the credential is in config too, as Polaris sends it.
    ns = namespace(admin)
    catalog = pyiceberg_catalog(catalog_server, engine_writer)
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "region", StringType()))
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "region": ["EU", "US"]})
    transaction = catalog.create_table_transaction(f"{ns}.orders", schema)
    transaction.append(rows)
    transaction.commit_transaction()
    read = catalog.load_table(f"{ns}.orders").scan().to_arrow().sort_by("id")
    assert read.to_pylist() == [{"id": 1, "region": "EU"}, {"id": 2, "region": "US"}]
    config = write_sqe_config(tmp_path / "sqe.toml", catalog_server.url, engine_writer, catalog_server.moto)
    with sqe.api.connect(config) as session:
        assert session.sql(f"SELECT id, region FROM {ns}.orders ORDER BY id").fetchall() == [(1, "EU"), (2, "US")]


def test_a_stage_create_puts_its_storage_credential_in_config_too(
    admin: Client, catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    ns = namespace(admin)
    writer = Client(catalog_server, catalog_server.token(engine_writer))
    staged = stage_create(writer, catalog_server, ns, "t", VENDED)
    [entry] = staged["storage-credentials"]
    assert entry["prefix"] == staged["metadata"]["location"]
    assert vended_keys(staged["config"]) == entry["config"], "the same credential, with its expiry"
    assert set(entry["config"]) == set(CREDENTIAL_KEYS)
    assert "s3.endpoint" in staged["config"], "the client settings stay"
    undelegated = stage_create(writer, catalog_server, ns, "u", {})
    assert not vended_keys(undelegated["config"]) and "storage-credentials" not in undelegated


def test_a_stage_create_vends_into_config_only_to_whom_storage_credentials_go(
    admin: Client, catalog_server: CatalogServer, catalog_reader: CatalogPrincipal
) -> None:
    ns = namespace(admin)
    create_only = catalog_server.principal_with_grants(unique("create_only"), [("TABLE_CREATE", ns, None)])
    no_data = Client(catalog_server, catalog_server.token(create_only))
    body = {"name": "t", "schema": SCHEMA, "stage-create": True}
    refused = no_data.request("POST", f"namespaces/{ns}/tables", json=body, headers=VENDED)
    assert "TABLE_READ_DATA" in error_of(refused, 403), "no data grant: no credential, in either place"
    assert not vended_keys(stage_create(no_data, catalog_server, ns, "t", {})["config"])
    restricted = namespace(admin)
    restrict_new_tables(admin, restricted)
    user = creator(catalog_server, restricted)
    own = Client(catalog_server, catalog_server.token(user))
    path = f"namespaces/{restricted}/tables"
    assert "trusted reader" in error_of(own.request("POST", path, json=body, headers={**VENDED, **DECLARED}), 403)
    error_of(own.request("POST", path, json=body, headers=VENDED), 406)
    via_reader = Client(catalog_server, catalog_server.delegated_token(user, catalog_reader))
    served = stage_create(via_reader, catalog_server, restricted, "t", {**VENDED, **DECLARED})
    [entry] = served["storage-credentials"]
    assert served["read-restrictions"], "served through the trusted reader, restrictions attached"
    assert vended_keys(served["config"]) == entry["config"], "the reader's own (read-only) credential, nothing more"
