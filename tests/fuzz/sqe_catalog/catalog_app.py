"""The real catalog Starlette app in-process, driven through its ASGI interface like uvicorn does.

``raw_path`` carries the percent-encoded path and ``path`` its decoded form, as an ASGI server sends them.
A database snapshot (every row of every table) lets a test prove that a refused request changed nothing.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode

from sqlalchemy import MetaData, create_engine, select
from starlette.applications import Starlette

from sqe_catalog.api import create_app
from sqe_catalog.auth import AuthStore, create_engine_for
from sqe_catalog.config import CatalogServerConfig, ServerConfig, WarehouseConfig

TABLE_SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [
        {"id": 1, "name": "id", "type": "long", "required": True},
        {"id": 2, "name": "s", "type": "string", "required": False},
    ],
}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def asgi_call(
    app: Starlette, method: str, raw_path: str, *, query: str = "", headers: list[tuple[str, str]], body: bytes = b""
) -> Reply:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode("ascii"),
        "query_string": query.encode("ascii"),
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8181),
    }
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Reply(start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, content)


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
