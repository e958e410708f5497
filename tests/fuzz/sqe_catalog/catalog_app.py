"""The real catalog Starlette app in-process, driven through its ASGI interface like uvicorn does.

``raw_path`` carries the percent-encoded path and ``path`` its decoded form, as an ASGI server sends them.
A database snapshot (every row of every table) lets a test prove that a refused request changed nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import MetaData, create_engine, select

from sqe_catalog.api import create_app
from sqe_catalog.auth import AuthStore, create_engine_for
from sqe_catalog.config import CatalogServerConfig, ServerConfig, WarehouseConfig
from tests.helpers.asgi import Reply, asgi_call

TABLE_SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [
        {"id": 1, "name": "id", "type": "long", "required": True},
        {"id": 2, "name": "s", "type": "string", "required": False},
    ],
}


class CatalogApp:
    """One catalog app on a SQLite file with a file:// warehouse ``wh``, an admin token and ``ns.t``."""

    def __init__(self, root: Path) -> None:
        self.database = f"sqlite:///{root}/catalog.db"
        config = CatalogServerConfig(
            server=ServerConfig(database=self.database, cleanup_interval_seconds=0),
            warehouses=(WarehouseConfig(name="wh", location=f"file://{root}/wh"),),
        )
        self.app = create_app(config)
        store = AuthStore(create_engine_for(self.database), b"k", 600, scrypt_n=2)
        client_id, client_secret = store.create_principal("root", is_admin=True)
        self.token = self._issue_token(client_id, client_secret)
        self._engine = create_engine(self.database)
        self.ensure_baseline()
        self._tables = MetaData()
        self._tables.reflect(self._engine)  # every store created its tables at start-up

    def _issue_token(self, client_id: str, client_secret: str) -> str:
        form = urlencode({"grant_type": "client_credentials", "client_id": client_id, "client_secret": client_secret})
        reply = asgi_call(
            self.app,
            "POST",
            "/v1/oauth/tokens",
            headers=[("content-type", "application/x-www-form-urlencoded")],
            body=(form + "&scope=PRINCIPAL_ROLE%3AALL").encode(),
        )
        assert reply.status == 200, reply.body
        return str(reply.json()["access_token"])

    def request(self, method: str, raw_path: str, body: Any = None, **kwargs: Any) -> Reply:
        headers = kwargs.pop("headers", [("authorization", f"Bearer {self.token}")])
        data = body if isinstance(body, bytes) else (b"" if body is None else json.dumps(body).encode())
        return asgi_call(self.app, method, raw_path, headers=headers, body=data, **kwargs)

    def ensure_baseline(self) -> None:
        """Namespace ``ns`` and table ``ns.t`` exist (a fuzzed request that succeeded may have removed them)."""
        if self.request("HEAD", "/v1/wh/namespaces/ns").status == 404:
            assert self.request("POST", "/v1/wh/namespaces", {"namespace": ["ns"]}).status == 200
        if self.request("HEAD", "/v1/wh/namespaces/ns/tables/t").status == 404:
            reply = self.request("POST", "/v1/wh/namespaces/ns/tables", {"name": "t", "schema": TABLE_SCHEMA})
            assert reply.status == 200, reply.body

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table in the catalog database (pointers, pins, digests, grants, ...)."""
        with self._engine.connect() as conn:
            return {
                name: sorted((tuple(row) for row in conn.execute(select(table))), key=repr)
                for name, table in sorted(self._tables.tables.items())
            }
