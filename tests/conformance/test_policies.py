"""Policy conformance: every case of ``policies/v*/*.json`` against the real ``sqe-catalog`` (session fixture).

A case is tags + policies + subject + schema -> canonical ``read-restrictions`` JSON or an error code:

- ``schema``: ``[name, type, required]`` per top-level column (field ids 1..n in order);
- ``tags``: ``{"on": "outer"|"namespace"|"table"|"column", "column"?, "tag", "value"?}`` (the case's table lives in
  namespace ``<outer>.<inner>``: ``outer`` tests inheritance from a parent namespace);
- ``policies``: ``{"type", "expression", "tags": [{"tag", "selector", "value"?}], "enabled"?}``;
- ``user``: ``alice`` (member of ``auditors`` and ``mask``) or ``bob`` (member of ``sales``); ``ghost`` is a group
  that does not exist;
- ``via``: ``reader`` (default: a delegated token of the trusted reader) or ``own-token``; ``capabilities``: the
  ``X-Gravitino-Client-Capabilities`` values sent (default ``["read-restrictions.v1"]``);
- ``expect``: ``{"read-restrictions": JSON|null}``, ``{"load-error": code}`` (403 with that code and a request
  id, no policy name), ``{"status": 403|406}`` (refused, no metadata) or ``{"save-error": code}`` (creating the
  policy answers 400 with that code).

``{alice}``, ``{bob}``, ``{auditors}``, ``{sales}``, ``{mask}``, ``{ghost}`` in a case are replaced by the module's
real names. Policies are created disabled, attached and enabled through the REST endpoints, and deleted after
the case; tag names are prefixed per case, so no case selects another's tables.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests

from sqe.vocabulary import CAPABILITIES_HEADER, READ_RESTRICTIONS_V1

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parent / "policies"
DECLARED = {CAPABILITIES_HEADER: READ_RESTRICTIONS_V1}


def _cases() -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for path in sorted(ROOT.glob("v*/*.json")):
        document = json.loads(path.read_text(encoding="utf-8"))
        assert document["version"] == int(path.parent.name[1:]), path
        for case in document["cases"]:
            cases.append((f"{path.parent.name}/{path.stem}/{case['id']}", case))
    return cases


CASES = _cases()


@dataclass
class Conformance:
    server: CatalogServer
    reader: CatalogPrincipal
    users: dict[str, CatalogPrincipal]
    names: dict[str, str]
    admin_token: str
    suffix: str

    def api(self, method: str, path: str, body: Any = None) -> requests.Response:
        url = f"{self.server.url}/v1/{self.server.warehouse}{path}"
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        return requests.request(method, url, json=body, headers=headers, timeout=30)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        reply = self.api(method, path, body)
        assert reply.status_code in (200, 204), f"{method} {path}: {reply.status_code} {reply.text}"
        return reply.json() if reply.content else None

    def substitute(self, case: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(case)
        for placeholder, real in self.names.items():
            text = text.replace("{" + placeholder + "}", real)
        result: dict[str, Any] = json.loads(text)
        return result


@pytest.fixture(scope="module")
def conformance(catalog_server: CatalogServer, catalog_reader: CatalogPrincipal) -> Iterator[Conformance]:
    suffix = uuid.uuid4().hex[:6]
    names = {who: f"pc_{who}_{suffix}" for who in ("alice", "bob")}
    names |= {group: f"pc_{group}_{suffix}" for group in ("auditors", "sales", "mask", "ghost")}
    users = {
        who: catalog_server.principal_with_grants(names[who], [("TABLE_READ_DATA", None, None)])
        for who in ("alice", "bob")
    }
    for group in ("auditors", "sales", "mask"):
        catalog_server.admin_cli("create-group", names[group])
    catalog_server.admin_cli("add-to-group", names["alice"], names["auditors"])
    catalog_server.admin_cli("add-to-group", names["alice"], names["mask"])
    catalog_server.admin_cli("add-to-group", names["bob"], names["sales"])
    token = catalog_server.token(catalog_server.admin)
    yield Conformance(catalog_server, catalog_reader, users, names, token, suffix)


def _create_table(c: Conformance, namespace: list[str], schema: list[list[Any]]) -> None:
    c.ok("POST", "/namespaces", {"namespace": namespace[:1]})
    c.ok("POST", "/namespaces", {"namespace": namespace})
    fields = [
        {"id": i, "name": name, "type": kind, "required": required}
        for i, (name, kind, required) in enumerate(schema, start=1)
    ]
    body = {"name": "t", "schema": {"type": "struct", "schema-id": 0, "fields": fields}}
    c.ok("POST", f"/namespaces/{'%1F'.join(namespace)}/tables", body)


def _tag(c: Conformance, namespace: list[str], tag: dict[str, Any], prefix: str) -> None:
    on = tag["on"]
    target: dict[str, Any] = {"namespace": namespace[:1] if on == "outer" else namespace}
    if on in ("table", "column"):
        target["table"] = "t"
    if on == "column":
        target["column"] = tag["column"]
    body: dict[str, Any] = {"object": target, "tag": prefix + tag["tag"]}
    if tag.get("value") is not None:
        body["value"] = tag["value"]
    c.ok("POST", "/tags", body)


def _policy(c: Conformance, name: str, policy: dict[str, Any], prefix: str) -> requests.Response:
    body = {"name": name, "policyType": policy["type"], "content": policy.get("content")}
    if body["content"] is None:
        body["content"] = {"expression": policy["expression"]}
    return c.api("POST", "/policies", body)


def _load(c: Conformance, case: dict[str, Any], namespace: list[str]) -> requests.Response:
    """Through the reader by default; ``"via": "own-token"`` is the user's own token (never trusted), and
    ``"capabilities"`` replaces the capability header lines (``[]``: none sent)."""
    user = c.users[case.get("user", "alice")]
    own = case.get("via") == "own-token"
    token = c.server.token(user) if own else c.server.delegated_token(user, c.reader)
    url = f"{c.server.url}/v1/{c.server.warehouse}/namespaces/{'%1F'.join(namespace)}/tables/t"
    lines = case.get("capabilities", [READ_RESTRICTIONS_V1])
    headers = [("Authorization", f"Bearer {token}"), *((CAPABILITIES_HEADER, line) for line in lines)]
    with requests.Session() as session:
        request = requests.Request("GET", url).prepare()
        request.headers.clear()
        for name, value in headers:  # several lines of one header, as a client may send them
            request.headers[name] = value if name not in request.headers else f"{request.headers[name]}, {value}"
        return session.send(request, timeout=30)


@pytest.mark.parametrize("case", [case for _, case in CASES], ids=[name for name, _ in CASES])
def test_policy_case(conformance: Conformance, case: dict[str, Any]) -> None:
    c = conformance
    case = c.substitute(case)
    key = f"{case['id'].replace('-', '_')}_{c.suffix}"
    prefix = f"{key}_"
    namespace = [f"pc_{key}", "inner"]
    created: list[str] = []
    try:
        if "schema" in case:
            _create_table(c, namespace, case["schema"])
        for tag in case.get("tags", []):
            _tag(c, namespace, tag, prefix)
        for i, policy in enumerate(case.get("policies", [])):
            name = f"{key}_p{i}"
            reply = _policy(c, name, policy, prefix)
            if "save-error" in case["expect"]:
                assert reply.status_code == 400, reply.text
                assert f"[{case['expect']['save-error']}]" in reply.json()["error"]["message"], reply.text
                return
            assert reply.status_code == 200, reply.text
            assert reply.json()["enabled"] is False, "new policies start disabled"
            created.append(name)
            for selector in policy.get("tags", []):
                c.ok("POST", f"/policies/{name}/tags", {**selector, "tag": prefix + selector["tag"]})
            if policy.get("enabled", True):
                assert c.ok("PUT", f"/policies/{name}", {"enabled": True})["enabled"] is True
        assert "save-error" not in case["expect"], "a save error was expected"
        reply = _load(c, case, namespace)
        expect = case["expect"]
        if "status" in expect:
            assert reply.status_code == expect["status"], reply.text
            assert "storage-credentials" not in reply.text and "metadata-location" not in reply.text
            return
        if "load-error" in expect:
            assert reply.status_code == 403, reply.text
            message = reply.json()["error"]["message"]
            assert f"[{expect['load-error']}]" in message and "(request id " in message, message
            assert not any(name in message for name in created), "no policy name for a plain end user"
            assert c.names["auditors"] not in message and c.names["ghost"] not in message
            return
        assert reply.status_code == 200, reply.text
        assert reply.json().get("read-restrictions") == expect["read-restrictions"]
    finally:
        for name in created:
            c.api("DELETE", f"/policies/{name}")


def test_the_suite_covers_every_mask_action() -> None:
    from sqe.restrictions import ACTIONS

    used = set()
    for _name, case in CASES:
        for policy in case.get("policies", []):
            used |= {action for action in ACTIONS if f'action(\\"{action}\\")' in json.dumps(policy)}
    assert used == set(ACTIONS)
