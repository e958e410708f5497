"""Tag-based policies end to end: ``sqe-catalog serve`` on moto resolves policies per end user, SQE enforces them.

Namespace ``pol_<sfx>`` carries ``sensitivity=restricted`` (schema-inherited); table ``orders`` inherits it, table
``public_orders`` overrides it with ``sensitivity=public``. Columns ``owner`` and ``phone`` of both tables carry
``pii``. Two policies, created disabled, previewed, then enabled:

- row filter (selected by ``TAG_VALUE("restricted")``): auditors see EU rows, everyone else their own rows
  (``col("owner") == session_user()``);
- column mask (selected by ``pii``): auditors ``show-last-4``, everyone else ``replace-with-null``.

SQE runs as a trusted reader exactly as deployed: ``[catalog] client_id/client_secret`` are the end user's and
``reader_client_id/reader_client_secret`` a reader principal's (the engine exchanges the tokens itself). alice is
an auditor, bob is not. The filter reads raw ``owner`` values before the mask nulls them (bob still sees exactly
his rows). An SQE without the reader identity, and pyiceberg with a copied capability header, are refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
import requests
from pyiceberg.exceptions import ForbiddenError

import sqe.api
from sqe.config import CatalogConfig, SQEConfig, StorageConfig
from sqe.errors import PermissionDeniedError
from sqe.restrictions.string_masks import mask_alphanum, show_last_4
from sqe.session import Session
from sqe.vocabulary import CAPABILITIES_HEADER, READ_RESTRICTIONS_V1
from tests.conftest import CatalogPrincipal, pyiceberg_catalog

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e

FILTER = 'filter := col("region") == "EU" if is_group_member("{auditors}") else := col("owner") == session_user()'
MASK = 'mask := action("show-last-4") if is_group_member("{auditors}") else := action("replace-with-null")'


@dataclass
class World:
    server: CatalogServer
    namespace: str
    users: dict[str, CatalogPrincipal]
    reader: CatalogPrincipal
    admin_token: str
    writer: CatalogPrincipal

    def api(self, method: str, path: str, body: Any = None) -> Any:
        reply = requests.request(
            method,
            f"{self.server.url}/v1/{self.server.warehouse}{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=30,
        )
        assert reply.status_code in (200, 204), reply.text
        return reply.json() if reply.content else None

    def session(self, who: str, *, through_reader: bool = True) -> Session:
        user, moto = self.users[who], self.server.moto
        reader: dict[str, Any] = {}
        if through_reader:
            reader = {"reader_client_id": self.reader.client_id, "reader_client_secret": self.reader.client_secret}
        config = SQEConfig(
            catalog=CatalogConfig(
                uri=self.server.url,
                warehouse=self.server.warehouse,
                client_id=user.client_id,
                client_secret=user.client_secret,
                scope="PRINCIPAL_ROLE:ALL",
                access_delegation="vended-credentials",
                require_vended_credentials=True,
                **reader,
            ),
            storage=StorageConfig(endpoint=moto.url, region=moto.region, path_style=True),
        )
        return sqe.api.connect(config)

    def rows(self, who: str, table: str = "orders") -> list[dict[str, Any]]:
        with self.session(who) as session:
            sql = f"SELECT id, owner, region, phone FROM {self.namespace}.{table} ORDER BY id"
            return list(session.sql(sql).arrow().to_pylist())


@pytest.fixture(scope="module")
def world(catalog_server: CatalogServer, engine_writer: CatalogPrincipal) -> Iterator[World]:
    sfx = uuid.uuid4().hex[:6]
    users = {
        who: catalog_server.principal_with_grants(f"{who}_{sfx}", [("TABLE_READ_DATA", None, None)])
        for who in ("alice", "bob")
    }
    auditors = f"auditors_{sfx}"
    catalog_server.admin_cli("create-group", auditors)
    catalog_server.admin_cli("add-to-group", users["alice"].name, auditors)
    reader = catalog_server.create_principal(f"pol_engine_{sfx}", reader=True)
    namespace = f"pol_{sfx}"
    alice, bob = users["alice"].name, users["bob"].name
    orders = pa.table(
        {
            "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
            "owner": [alice, bob, bob, "carol", alice],
            "region": ["EU", "EU", "US", "EU", "US"],
            "phone": ["+44 20 7946 0001", "+44 20 7946 0002", "+1 555 0103", "+33 1 0104", "+1 555 0105"],
        }
    )
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        writer = pyiceberg_catalog(catalog_server, engine_writer)
        writer.create_namespace(namespace)
        for table in ("orders", "public_orders", "drift", "swap"):
            writer.create_table((namespace, table), schema=orders.schema).append(orders)
    world = World(
        catalog_server,
        namespace,
        users,
        reader,
        catalog_server.token(catalog_server.admin),
        engine_writer,
    )
    world.api(
        "POST", "/tags", {"object": {"namespace": [namespace]}, "tag": f"sensitivity_{sfx}", "value": "restricted"}
    )
    world.api(
        "POST",
        "/tags",
        {
            "object": {"namespace": [namespace], "table": "public_orders"},
            "tag": f"sensitivity_{sfx}",
            "value": "public",
        },
    )
    for table in ("orders", "public_orders"):
        for column in ("owner", "phone"):
            world.api(
                "POST",
                "/tags",
                {"object": {"namespace": [namespace], "table": table, "column": column}, "tag": f"pii_{sfx}"},
            )
    restricted = {"tag": f"sensitivity_{sfx}", "selector": "TAG_VALUE", "value": "restricted"}
    pii = {"tag": f"pii_{sfx}", "selector": "ALL_VALUES"}
    for name, kind, expression, selector in (
        (f"rows_{sfx}", "system_row_filter", FILTER, restricted),
        (f"mask_{sfx}", "system_column_mask", MASK, pii),
    ):
        content = {"expression": expression.replace("{auditors}", auditors)}
        assert (
            world.api("POST", "/policies", {"name": name, "policyType": kind, "content": content})["enabled"] is False
        )
        world.api("POST", f"/policies/{name}/tags", selector)
    yield world
    for name in (f"rows_{sfx}", f"mask_{sfx}"):
        world.api("DELETE", f"/policies/{name}")


@pytest.fixture(scope="module")
def enabled(world: World) -> World:
    """The policies previewed (nothing enabled yet: every user reads raw rows), then enabled."""
    for table in ("orders", "public_orders"):
        assert len(world.rows("bob", table)) == 5, "disabled policies are not served"
    body = {"user": world.users["bob"].name, "table": {"namespace": [world.namespace], "name": "orders"}}
    report = world.api("POST", "/restrictions/preview", body)
    assert report["error"] is None and report["read-restrictions"]["required-row-filter"]["right"] == body["user"]
    assert {p["status"] for p in report["policies"] if p["name"].endswith(world.namespace[4:])} == {"applied"}
    for policy in report["policies"]:
        if policy["name"].endswith(world.namespace[4:]):
            world.api("PUT", f"/policies/{policy['name']}", {"enabled": True})
    return world


def _last_4(value: str) -> str:
    return str(show_last_4(pa.array([value], pa.string()))[0].as_py())


def test_each_user_sees_exactly_their_rows_and_masks(enabled: World) -> None:
    alice, bob = enabled.users["alice"].name, enabled.users["bob"].name
    assert enabled.rows("alice") == [
        {"id": 1, "owner": _last_4(alice), "region": "EU", "phone": _last_4("+44 20 7946 0001")},
        {"id": 2, "owner": _last_4(bob), "region": "EU", "phone": _last_4("+44 20 7946 0002")},
        {"id": 4, "owner": _last_4("carol"), "region": "EU", "phone": _last_4("+33 1 0104")},
    ], "an auditor: EU rows (schema-inherited tag), show-last-4"
    assert _last_4("+33 1 0104").endswith("0104") and not _last_4("+33 1 0104").startswith("+33")
    assert enabled.rows("bob") == [
        {"id": 2, "owner": None, "region": "EU", "phone": None},
        {"id": 3, "owner": None, "region": "US", "phone": None},
    ], "session_user(): bob's own rows, filtered on raw owner values before the mask nulls them"


def test_a_nearer_tag_value_lifts_the_row_filter_but_not_the_masks(enabled: World) -> None:
    rows = enabled.rows("bob", "public_orders")
    assert [r["id"] for r in rows] == [1, 2, 3, 4, 5], "sensitivity=public overrides the namespace's value"
    assert {r["phone"] for r in rows} == {None} and {r["owner"] for r in rows} == {None}
    phones = {r["phone"] for r in enabled.rows("alice", "public_orders")}
    assert phones == {
        _last_4(p) for p in ("+44 20 7946 0001", "+44 20 7946 0002", "+1 555 0103", "+33 1 0104", "+1 555 0105")
    }


def test_an_untrusted_client_is_refused(enabled: World) -> None:
    with enabled.session("bob", through_reader=False) as session, pytest.raises(PermissionDeniedError) as err:
        session.sql(f"SELECT id FROM {enabled.namespace}.orders").arrow()
    assert err.value.status == 403 and "trusted reader" in str(err.value)
    token = enabled.server.token(enabled.users["bob"])
    reply = requests.get(
        f"{enabled.server.url}/v1/{enabled.server.warehouse}/namespaces/{enabled.namespace}/tables/orders",
        headers={"Authorization": f"Bearer {token}", CAPABILITIES_HEADER: READ_RESTRICTIONS_V1},
        timeout=30,
    )
    assert reply.status_code == 403 and "storage-credentials" not in reply.text, "a copied header is no trust"


def test_a_conflicting_policy_fails_the_query_closed(enabled: World) -> None:
    sfx = enabled.namespace[4:]
    name = f"conflict_{sfx}"
    content = {"expression": 'mask := action("mask-alphanum")'}
    enabled.api("POST", "/policies", {"name": name, "policyType": "system_column_mask", "content": content})
    enabled.api("POST", f"/policies/{name}/tags", {"tag": f"pii_{sfx}", "selector": "ALL_VALUES"})
    enabled.api("PUT", f"/policies/{name}", {"enabled": True})
    try:
        with enabled.session("bob") as session, pytest.raises(PermissionDeniedError) as err:
            session.sql(f"SELECT id FROM {enabled.namespace}.orders").arrow()
        assert "[resolve-mask-conflict]" in str(err.value) and "request id" in str(err.value)
        assert name not in str(err.value), "bob may not view policies: no policy name"
    finally:
        enabled.api("DELETE", f"/policies/{name}")
    assert len(enabled.rows("bob")) == 2


def test_a_renamed_column_fails_the_inherited_filter_closed(enabled: World) -> None:
    """``drift`` inherits the row filter; after ``owner`` is renamed, ``col("owner")`` binds to nothing."""
    rows_policy = f"rows_{enabled.namespace[4:]}"
    enabled.api("PUT", f"/policies/{rows_policy}", {"enabled": False})  # the writer is an end user like others
    try:
        with pytest.MonkeyPatch.context() as env:
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
                env.delenv(name, raising=False)
            writer = pyiceberg_catalog(enabled.server, enabled.writer)
            table = writer.load_table((enabled.namespace, "drift"))
            with table.update_schema() as update:
                update.rename_column("owner", "holder")
    finally:
        enabled.api("PUT", f"/policies/{rows_policy}", {"enabled": True})
    with enabled.session("bob") as session, pytest.raises(PermissionDeniedError) as err:
        session.sql(f"SELECT id FROM {enabled.namespace}.drift").arrow()
    assert "[bind-unknown-column]" in str(err.value), "never an unrestricted answer"


def _evolve_as_writer(world: World, table_name: str, change: Any) -> None:
    """``change(update)`` on ``table_name``'s schema by the writer, an end user (the row filter is off for it)."""
    rows_policy = f"rows_{world.namespace[4:]}"
    world.api("PUT", f"/policies/{rows_policy}", {"enabled": False})
    try:
        with pytest.MonkeyPatch.context() as env:
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
                env.delenv(name, raising=False)
            table = pyiceberg_catalog(world.server, world.writer).load_table((world.namespace, table_name))
            with table.update_schema() as update:
                change(update)
    finally:
        world.api("PUT", f"/policies/{rows_policy}", {"enabled": True})


def test_a_column_renamed_onto_an_exempt_columns_name_stays_masked(enabled: World) -> None:
    """Found by review: in ``swap`` (``class=secret``: masked, but for columns that exempt themselves with
    ``class=none``), ``phone`` renamed onto the name of the dropped, exempt ``region`` took its exemption by name:
    bob read the phone numbers raw."""
    sfx = enabled.namespace[4:]
    name, tag = f"secret_{sfx}", f"class_{sfx}"
    content = {"expression": 'mask := action("mask-alphanum")'}
    enabled.api("POST", "/policies", {"name": name, "policyType": "system_column_mask", "content": content})
    enabled.api("POST", f"/policies/{name}/tags", {"tag": tag, "selector": "TAG_VALUE", "value": "secret"})
    table = {"namespace": [enabled.namespace], "table": "swap"}
    enabled.api("POST", "/tags", {"object": table, "tag": tag, "value": "secret"})
    for column in ("id", "owner", "region"):
        enabled.api("POST", "/tags", {"object": {**table, "column": column}, "tag": tag, "value": "none"})
    try:

        def phone_onto_region(update: Any) -> None:
            update.delete_column("region")
            update.rename_column("phone", "region")

        _evolve_as_writer(enabled, "swap", phone_onto_region)
        enabled.api("PUT", f"/policies/{name}", {"enabled": True})
        with enabled.session("bob") as session:
            sql = f"SELECT id, region FROM {enabled.namespace}.swap ORDER BY id"
            rows = session.sql(sql).arrow().to_pylist()
    finally:
        enabled.api("DELETE", f"/policies/{name}")
    masked = mask_alphanum(pa.array(["+44 20 7946 0002", "+1 555 0103"], pa.string())).to_pylist()
    assert rows == [{"id": 2, "region": masked[0]}, {"id": 3, "region": masked[1]}], "bob's rows, masked"


def test_a_writers_transaction_that_would_unbind_the_row_filter_is_refused(enabled: World) -> None:
    """Found by review: a writer the row filter exempts (so its commits pass the gate), not a policy manager,
    renamed the filter's column in a pyiceberg transaction: the commit went through and every governed query of
    the table failed [bind-unknown-column]. Now the catalog refuses the commit and nothing changes."""
    sfx = enabled.namespace[4:]
    namespace, writers, tag, policy = f"guard_{sfx}", f"writers_{sfx}", f"guarded_{sfx}", f"guard_rows_{sfx}"
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "region": ["EU", "US"]})
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        writer = pyiceberg_catalog(enabled.server, enabled.writer)
        writer.create_namespace(namespace)
        writer.create_table((namespace, "t"), schema=rows.schema).append(rows)
        enabled.server.admin_cli("create-group", writers)
        enabled.server.admin_cli("add-to-group", enabled.writer.name, writers)
        enabled.api("POST", "/tags", {"object": {"namespace": [namespace], "table": "t"}, "tag": tag})
        expression = f'filter := true if is_group_member("{writers}") else := col("region") == "EU"'
        content = {"expression": expression}
        enabled.api("POST", "/policies", {"name": policy, "policyType": "system_row_filter", "content": content})
        enabled.api("POST", f"/policies/{policy}/tags", {"tag": tag, "selector": "ALL_VALUES"})
        enabled.api("PUT", f"/policies/{policy}", {"enabled": True})
        try:
            table = writer.load_table((namespace, "t"))
            transaction = table.transaction()
            with pytest.raises(ForbiddenError) as err, transaction, transaction.update_schema() as update:
                update.rename_column("region", "area")
            message = str(err.value)
            assert "the table's row filter would no longer apply" in message and tag not in message
            assert "no top-level column 'region'" in message and "CATALOG_MANAGE_POLICIES" in message
            assert policy not in message and writers not in message
            assert [f.name for f in writer.load_table((namespace, "t")).schema().fields] == ["id", "region"]
            with enabled.session("bob") as session:
                served = session.sql(f"SELECT id, region FROM {namespace}.t ORDER BY id").arrow().to_pylist()
            assert served == [{"id": 1, "region": "EU"}], "bob's query still works, filtered"
        finally:
            enabled.api("DELETE", f"/policies/{policy}")


def test_the_catalog_log_holds_no_secret(enabled: World) -> None:
    log = enabled.server.log_text()
    assert "resolve-mask-conflict" in log
    for secret in enabled.server.secrets:
        if secret:
            assert secret not in log
