"""A multi-warehouse session: sibling warehouses on another catalog process, each with its own principal.

Every catalog object of the session (the main one and the sibling) must send the access-delegation header:
the proof is that both tables are read through vended credentials while SQE holds no S3 key and the environment
carries bogus AWS keys that moto (IAM auth on) rejects.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog

import sqe.api
from sqe.config import CatalogConfig, SiblingWarehouseConfig, SQEConfig, StorageConfig
from sqe.errors import NoSuchTableError
from tests.conftest import BOGUS_AWS_ENV, catalog_variant

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

SIBLING = "wh2"


def _principal(server: CatalogServer, warehouse: str, name: str) -> CatalogPrincipal:
    principal = server.create_principal(name)
    role = f"{name}_role"
    server.admin_cli("create-role", role)
    server.admin_cli("assign-role", name, role)
    for privilege in ("NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA"):
        server.admin_cli("grant", role, privilege, "--warehouse", warehouse)
    return principal


def _create(server: CatalogServer, principal: CatalogPrincipal, warehouse: str, ns: str, rows: list[int]) -> None:
    """pyiceberg (no S3 key of its own) creates ``ns.t`` in ``warehouse`` and appends ``rows``."""
    catalog = RestCatalog(
        f"mw-{warehouse}",
        uri=server.url,
        warehouse=warehouse,
        credential=principal.credential,
        scope="PRINCIPAL_ROLE:ALL",
        **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
    )
    catalog.create_namespace(ns)
    schema = pa.schema([("id", pa.int64()), ("tag", pa.string())])
    table = catalog.create_table((ns, "t"), schema=schema)
    table.append(pa.table({"id": rows, "tag": [f"{warehouse}-{i}" for i in rows]}, schema=schema))


def test_sibling_warehouse_on_another_catalog_is_joined_through_vended_credentials(
    catalog_server: CatalogServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moto = catalog_server.moto
    ns = f"mw_{uuid.uuid4().hex[:6]}"
    main_user = _principal(catalog_server, catalog_server.warehouse, f"mw_main_{ns}")
    _create(catalog_server, main_user, catalog_server.warehouse, ns, [1, 2, 3])
    with catalog_variant(tmp_path, moto, name=SIBLING, location=f"s3://{moto.bucket}/{SIBLING}") as sibling:
        sibling_user = _principal(sibling, SIBLING, f"mw_sibling_{ns}")
        _create(sibling, sibling_user, SIBLING, ns, [2, 3, 4])
        for name, value in BOGUS_AWS_ENV.items():
            monkeypatch.setenv(name, value)
        config = SQEConfig(
            catalog=CatalogConfig(
                uri=catalog_server.url,
                warehouse=catalog_server.warehouse,
                client_id=main_user.client_id,
                client_secret=main_user.client_secret,
                require_vended_credentials=True,
                warehouses=(
                    SiblingWarehouseConfig(
                        name=SIBLING,
                        uri=sibling.url,
                        client_id=sibling_user.client_id,
                        client_secret=sibling_user.client_secret,
                    ),
                ),
            ),
            storage=StorageConfig(endpoint=moto.url, region=moto.region, path_style=True),
        )
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
