"""A multi-warehouse session: sibling warehouses on another catalog process, each with its own principal.

Every catalog object of the session (the main one and the sibling) must send the access-delegation header:
the proof is that both tables are read through vended credentials while SQE holds no S3 key and the environment
carries bogus AWS keys that moto (IAM auth on) rejects.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StringType
from pyiceberg.view.metadata import SQLViewRepresentation, ViewVersion

import sqe.api
from sqe.config import CatalogConfig, SiblingWarehouseConfig, SQEConfig, StorageConfig
from sqe.errors import NoSuchTableError
from tests.conftest import BOGUS_AWS_ENV, catalog_variant
from tests.helpers.fault_proxy import FaultProxy

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

SIBLING = "wh2"


def _principal(server: CatalogServer, warehouse: str, name: str) -> CatalogPrincipal:
    principal = server.create_principal(name)
    role = f"{name}_role"
    server.admin_cli("create-role", role)
    server.admin_cli("assign-role", name, role)
    for privilege in ("NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA", "VIEW_FULL_METADATA"):
        server.admin_cli("grant", role, privilege, "--warehouse", warehouse)
    return principal


def _pyiceberg(server: CatalogServer, principal: CatalogPrincipal, warehouse: str) -> RestCatalog:
    return RestCatalog(
        f"mw-{warehouse}",
        uri=server.url,
        warehouse=warehouse,
        credential=principal.credential,
        scope="PRINCIPAL_ROLE:ALL",
        **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
    )


def _create(server: CatalogServer, principal: CatalogPrincipal, warehouse: str, ns: str, rows: list[int]) -> None:
    """pyiceberg (no S3 key of its own) creates ``ns.t`` in ``warehouse`` and appends ``rows``."""
    catalog = _pyiceberg(server, principal, warehouse)
    catalog.create_namespace(ns)
    schema = pa.schema([("id", pa.int64()), ("tag", pa.string())])
    table = catalog.create_table((ns, "t"), schema=schema)
    table.append(pa.table({"id": rows, "tag": [f"{warehouse}-{i}" for i in rows]}, schema=schema))


@contextmanager
def _two_warehouses(
    main: CatalogServer, tmp_path: Path, prefix: str, main_rows: list[int], sibling_rows: list[int]
) -> Iterator[tuple[str, CatalogPrincipal, CatalogServer, CatalogPrincipal]]:
    """``ns.t`` in the main warehouse and in ``SIBLING`` (another catalog process), each with its own principal:
    (ns, main principal, sibling catalog, sibling principal)."""
    moto = main.moto
    ns = f"{prefix}_{uuid.uuid4().hex[:6]}"
    main_user = _principal(main, main.warehouse, f"{prefix}_main_{ns}")
    _create(main, main_user, main.warehouse, ns, main_rows)
    with catalog_variant(tmp_path, moto, name=SIBLING, location=f"s3://{moto.bucket}/{SIBLING}") as sibling:
        sibling_user = _principal(sibling, SIBLING, f"{prefix}_sibling_{ns}")
        _create(sibling, sibling_user, SIBLING, ns, sibling_rows)
        yield ns, main_user, sibling, sibling_user


def test_sibling_warehouse_on_another_catalog_is_joined_through_vended_credentials(
    catalog_server: CatalogServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _two_warehouses(catalog_server, tmp_path, "mw", [1, 2, 3], [2, 3, 4]) as (
        ns,
        main_user,
        sibling,
        sibling_user,
    ):
        for name, value in BOGUS_AWS_ENV.items():
            monkeypatch.setenv(name, value)
        config = _config(catalog_server, main_user, sibling, sibling_user)
        query = (
            f"SELECT a.id, a.tag AS main_tag, b.tag AS sibling_tag FROM {catalog_server.warehouse}.{ns}.t a "
            f"JOIN {SIBLING}.{ns}.t b ON a.id = b.id ORDER BY a.id"
        )
        with sqe.api.connect(config) as session:
            rows = session.sql(query).arrow().to_pylist()
            explain = session.explain_tables(query).to_pylist()
            with pytest.raises(NoSuchTableError):
                session.sql(f"SELECT * FROM nowhere.{ns}.t").arrow()
    assert rows == [
        {"id": 2, "main_tag": "wh-2", "sibling_tag": f"{SIBLING}-2"},
        {"id": 3, "main_tag": "wh-3", "sibling_tag": f"{SIBLING}-3"},
    ]
    assert sorted(row["table"] for row in explain) == sorted(
        [f"{catalog_server.warehouse}.{ns}.t", f"{SIBLING}.{ns}.t"]
    )
    assert {row["credential_source"] for row in explain} == {"vended"}


def _config(
    main: CatalogServer,
    main_user: CatalogPrincipal,
    sibling: CatalogServer,
    sibling_user: CatalogPrincipal,
    *,
    via: tuple[str, str] | None = None,
) -> SQEConfig:
    """A session whose default warehouse is ``main``'s, with ``sibling``'s warehouse as ``SIBLING``; ``via``: the
    (main, sibling) catalog URIs to use instead of the servers' own (proxies in front of them)."""
    moto = main.moto
    main_uri, sibling_uri = via or (main.url, sibling.url)
    return SQEConfig(
        catalog=CatalogConfig(
            uri=main_uri,
            warehouse=main.warehouse,
            client_id=main_user.client_id,
            client_secret=main_user.client_secret,
            require_vended_credentials=True,
            warehouses=(
                SiblingWarehouseConfig(
                    name=SIBLING,
                    uri=sibling_uri,
                    client_id=sibling_user.client_id,
                    client_secret=sibling_user.client_secret,
                ),
            ),
        ),
        storage=StorageConfig(endpoint=moto.url, region=moto.region, path_style=True),
    )


def test_names_in_a_view_resolve_in_the_views_warehouse_not_the_invokers(
    catalog_server: CatalogServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both warehouses hold ``ns.t``; a view stored in the sibling reads the sibling's, from a session whose
    default warehouse is the main one: SQE's own view (``ns.t``), and pyiceberg's (one-part ``t``, no
    default-catalog: the spec's fallback is the warehouse the view is stored in)."""
    with _two_warehouses(catalog_server, tmp_path, "mwv", [1, 2, 3], [7, 8]) as (ns, main_user, sibling, sibling_user):
        schema = Schema(NestedField(1, "tag", StringType(), required=False))
        version = ViewVersion(
            version_id=1,
            schema_id=0,
            representations=[SQLViewRepresentation(type="sql", sql="SELECT tag FROM t", dialect="spark")],
            default_namespace=(ns,),
        )
        _pyiceberg(sibling, sibling_user, SIBLING).create_view((ns, "third_party"), schema, version)
        for name, value in BOGUS_AWS_ENV.items():
            monkeypatch.setenv(name, value)
        with sqe.api.connect(_config(catalog_server, main_user, sibling, sibling_user)) as session:
            session.sql(f"CREATE VIEW {SIBLING}.{ns}.own AS SELECT tag FROM {ns}.t")
            own = session.sql(f"SELECT tag FROM {SIBLING}.{ns}.own ORDER BY tag").arrow().column("tag").to_pylist()
            third = session.sql(f"SELECT * FROM {SIBLING}.{ns}.third_party ORDER BY 1").arrow().column(0).to_pylist()
            joined = session.sql(
                f"SELECT count(*) AS n FROM {ns}.t a JOIN {SIBLING}.{ns}.own b ON a.tag = b.tag"
            ).arrow()
        stored = _pyiceberg(sibling, sibling_user, SIBLING).load_view((ns, "own")).metadata
    assert own == third == [f"{SIBLING}-7", f"{SIBLING}-8"]
    assert joined.column("n").to_pylist() == [0]  # the outer ns.t is still the invoker's default warehouse's
    current = next(v for v in stored.versions if v.version_id == stored.current_version_id)
    # no default-catalog: the spec's fallback (the view's own catalog) is what SQE means, in any engine
    assert (current.default_catalog, tuple(current.default_namespace)) == (None, (ns,))


class _RecordingProxy(FaultProxy):
    """A FaultProxy that also keeps, per request, the token form's ``client_id``/``client_secret`` (token
    requests) and the bearer token sent (every other request), to tell whose credentials reached this address."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.token_forms: list[dict[str, list[str]]] = []
        self.bearers: set[str] = set()
        self.bodies: list[bytes] = []

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        with self.lock:
            self.bodies.append(body)
            if request.path == "/v1/oauth/tokens":
                self.token_forms.append(parse_qs(body.decode()))
            elif request.headers.get("Authorization", "").startswith("Bearer "):
                self.bearers.add(request.headers["Authorization"])
        request.rfile = io.BytesIO(body)  # FaultProxy reads it again
        super().handle(request)


@contextmanager
def _proxied(server: CatalogServer) -> Iterator[_RecordingProxy]:
    proxy = _RecordingProxy(server.url)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def test_each_warehouses_tokens_are_fetched_and_refreshed_at_its_own_catalog_only(
    catalog_server: CatalogServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each warehouse's client asks its own catalog for its principal's tokens, at the start and again when the
    catalog no longer takes a token (a 401: a new one is fetched and the call sent again): no token request of the
    primary reaches the sibling's address or the other way round, and no bearer token is sent to both."""
    with _two_warehouses(catalog_server, tmp_path, "mwt", [1, 2], [2, 3]) as (ns, main_user, sibling, sibling_user):
        for name, value in BOGUS_AWS_ENV.items():
            monkeypatch.setenv(name, value)
        with _proxied(catalog_server) as main_proxy, _proxied(sibling) as sibling_proxy:
            config = _config(catalog_server, main_user, sibling, sibling_user, via=(main_proxy.url, sibling_proxy.url))
            query = f"SELECT count(*) FROM {ns}.t a JOIN {SIBLING}.{ns}.t b ON a.id = b.id"
            with sqe.api.connect(config) as session:
                first = session.sql(query).fetchall()
                for proxy in (main_proxy, sibling_proxy):  # the next table load of each is refused once
                    proxy.inject("GET", rf"/namespaces/{ns}/tables/t$", 401, 1)
                again = session.sql(query).fetchall()
    assert first == again == [(1,)]
    assert main_proxy.count("GET", rf"/namespaces/{ns}/tables/t$") >= 3  # refused once, then sent again
    assert sibling_proxy.count("GET", rf"/namespaces/{ns}/tables/t$") >= 3
    for proxy, user in ((main_proxy, main_user), (sibling_proxy, sibling_user)):
        assert len(proxy.token_forms) >= 2, proxy.token_forms  # the first token, and the one after the 401
        assert {(f["client_id"][0], f["client_secret"][0]) for f in proxy.token_forms} == {
            (user.client_id, user.client_secret)
        }
    assert main_user.client_secret.encode() not in b"".join(sibling_proxy.bodies)
    assert sibling_user.client_secret.encode() not in b"".join(main_proxy.bodies)
    assert main_proxy.bearers and sibling_proxy.bearers and not main_proxy.bearers & sibling_proxy.bearers
