"""A warehouse's REST routes as the admin calls them over loopback, for the catalog's end-to-end tests."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import requests

if TYPE_CHECKING:
    from tests.conftest import CatalogServer


class WarehouseApi:
    """Plain requests to one catalog server's warehouse under the admin's token; each test module adds the
    routes it needs. ``NAMESPACE_PREFIX`` tells a module's namespaces apart on a shared catalog."""

    NAMESPACE_PREFIX = "ns_"

    def __init__(self, server: CatalogServer) -> None:
        self.server = server
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {server.token(server.admin)}"

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        url = f"{self.server.url}/v1/{self.server.warehouse}/{path}"
        return self.session.request(method, url, timeout=60, **kwargs)

    def namespace(self) -> str:
        ns = f"{self.NAMESPACE_PREFIX}{uuid.uuid4().hex[:8]}"
        assert self.request("POST", "namespaces", json={"namespace": [ns]}).status_code == 200
        return ns

    def load(self, ns: str, name: str) -> requests.Response:
        return self.request("GET", f"namespaces/{ns}/tables/{name}")

    def notify(self, ns: str, name: str, kind: str, location: str, timestamp: int) -> requests.Response:
        payload = {"table-name": name, "timestamp": timestamp, "metadata-location": location}
        body = {"notification-type": kind, "payload": payload}
        return self.request("POST", f"namespaces/{ns}/tables/{name}/notifications", json=body)
