"""DuckDB with its iceberg extension as a third-party client of ``sqe-catalog``, loaded offline from the wheels.

The extension wheels (``duckdb-extension-{httpfs,avro,iceberg}``, dev extra) each ship one
``extensions/v<duckdb version>/<name>.duckdb_extension``. ``INSTALL '<path>'`` copies it into a per-test extension
directory and ``LOAD`` loads it; auto-install and auto-load are off, so nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

# httpfs reads and writes S3, avro reads manifests, iceberg speaks REST: loaded in this order.
EXTENSIONS = ("httpfs", "avro", "iceberg")


def extension_file(name: str) -> Path:
    """The ``.duckdb_extension`` file inside the installed ``duckdb_extension_<name>`` wheel."""
    folder = Path(str(importlib.resources.files(f"duckdb_extension_{name}") / "extensions"))
    return folder / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"


def offline_duckdb(extension_directory: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with httpfs, avro and iceberg installed from the wheels' files; no downloads."""
    con = duckdb.connect(
        config={
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
            "extension_directory": str(extension_directory),
        }
    )
    for name in EXTENSIONS:
        con.execute(f"INSTALL '{extension_file(name)}'")
        con.execute(f"LOAD {name}")
    return con


def attach_catalog(
    con: duckdb.DuckDBPyConnection, server: CatalogServer, principal: CatalogPrincipal, alias: str = "lake"
) -> None:
    """``ATTACH`` the server's warehouse as ``alias``: OAuth2 client credentials, vended S3 credentials only."""
    secret = f"{alias}_oauth"
    con.execute(
        f"CREATE SECRET {secret} (TYPE iceberg, CLIENT_ID '{principal.client_id}', "
        f"CLIENT_SECRET '{principal.client_secret}', OAUTH2_SERVER_URI '{server.url}/v1/oauth/tokens', "
        "OAUTH2_SCOPE 'PRINCIPAL_ROLE:ALL')"
    )
    con.execute(
        f"ATTACH '{server.warehouse}' AS {alias} (TYPE iceberg, SECRET {secret}, ENDPOINT '{server.url}', "
        "ACCESS_DELEGATION_MODE 'vended_credentials', SUPPORT_NESTED_NAMESPACES true)"
    )
