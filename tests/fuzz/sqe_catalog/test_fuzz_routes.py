"""Fuzz every route of the catalog app: arbitrary bodies, headers, query strings and path identifiers.

Property for every request: a 4xx ErrorModel (``{"error": {"message", "type", "code"}}`` with one-line
message, no traceback) or a valid 2xx/304, never a 5xx; a refused request changes no row of the catalog
database (pointers, integrity pins, digests, grants); after any request the baseline table still loads
(its pointer, pin and digest agree: the load path verifies them).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sqe import vocabulary
from tests.fuzz.checks import assert_one_line
from tests.fuzz.sqe_catalog.catalog_app import TABLE_SCHEMA, CatalogApp, Reply
from tests.fuzz.strategies import json_objects, json_scalars, json_values

# (method, path template, takes a body). Every route the app serves, plus the token and config endpoints.
ROUTES = [
    ("GET", "/v1/config", False),
    ("POST", "/v1/oauth/tokens", True),
    ("GET", "/v1/{prefix}/namespaces", False),
    ("POST", "/v1/{prefix}/namespaces", True),
    ("GET", "/v1/{prefix}/namespaces/{namespace}", False),
    ("HEAD", "/v1/{prefix}/namespaces/{namespace}", False),
    ("DELETE", "/v1/{prefix}/namespaces/{namespace}", False),
    ("POST", "/v1/{prefix}/namespaces/{namespace}/properties", True),
    ("GET", "/v1/{prefix}/namespaces/{namespace}/tables", False),
    ("POST", "/v1/{prefix}/namespaces/{namespace}/tables", True),
    ("POST", "/v1/{prefix}/namespaces/{namespace}/register", True),
    ("GET", "/v1/{prefix}/namespaces/{namespace}/tables/{table}", False),
    ("HEAD", "/v1/{prefix}/namespaces/{namespace}/tables/{table}", False),
    ("POST", "/v1/{prefix}/namespaces/{namespace}/tables/{table}", True),
    ("DELETE", "/v1/{prefix}/namespaces/{namespace}/tables/{table}", False),
    ("POST", "/v1/{prefix}/tables/rename", True),
    ("GET", "/v1/{prefix}/namespaces/{namespace}/tables/{table}/credentials", False),
    ("POST", "/v1/{prefix}/namespaces/{namespace}/tables/{table}/notifications", True),
]
_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]
_NAMES = st.one_of(
    st.sampled_from(["ns", "t", "", ".", "..", "a.b", "a/b", "%", "%2F", "\x00", "\x1f", "ns\x1fsub", " ", "x" * 300]),
    st.text(max_size=12),
)
_IDENTIFIER = st.fixed_dictionaries(
    {"namespace": st.one_of(st.lists(_NAMES, max_size=3), json_scalars), "name": _NAMES}
)

# Near-valid commit requirements and updates (the Iceberg REST shapes), mixed with arbitrary objects.
_REQUIREMENTS = st.one_of(
    st.builds(lambda u: {"type": "assert-table-uuid", "uuid": u}, st.one_of(st.uuids().map(str), json_scalars)),
    st.just({"type": "assert-create"}),
    st.builds(lambda i: {"type": "assert-current-schema-id", "current-schema-id": i}, json_scalars),
    st.builds(lambda i: {"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": i}, json_scalars),
    st.builds(lambda i: {"type": "assert-last-assigned-field-id", "last-assigned-field-id": i}, json_scalars),
    json_objects,
)
_UPDATES = st.one_of(
    st.builds(
        lambda p: {"action": "set-properties", "updates": p},
        st.dictionaries(_NAMES, st.one_of(_NAMES, json_scalars), max_size=3),
    ),
    st.builds(lambda r: {"action": "remove-properties", "removals": r}, st.lists(_NAMES, max_size=3)),
    st.builds(lambda v: {"action": "upgrade-format-version", "format-version": v}, json_scalars),
    st.builds(
        lambda loc: {"action": "set-location", "location": loc},
        st.one_of(_NAMES, st.just("file:///elsewhere"), st.just("s3://other/x")),
    ),
    st.builds(lambda s: {"action": "add-schema", "schema": s}, st.one_of(st.just(TABLE_SCHEMA), json_objects)),
    st.builds(lambda i: {"action": "set-current-schema", "schema-id": i}, json_scalars),
    st.builds(lambda u: {"action": "assign-uuid", "uuid": u}, st.uuids().map(str)),
    st.builds(lambda s: {"action": "add-snapshot", "snapshot": s}, json_objects),
    st.builds(
        lambda i: {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": i}, json_scalars
    ),
    st.builds(lambda ids: {"action": "remove-snapshots", "snapshot-ids": ids}, st.lists(json_scalars, max_size=2)),
    json_objects,
)
_COMMIT = st.fixed_dictionaries(
    {"requirements": st.lists(_REQUIREMENTS, max_size=3), "updates": st.lists(_UPDATES, max_size=3)},
    optional={"identifier": _IDENTIFIER},
)
_BODIES: dict[str, st.SearchStrategy[Any]] = {
    "/v1/{prefix}/namespaces": st.fixed_dictionaries(
        {"namespace": st.one_of(st.lists(_NAMES, max_size=3), json_scalars)},
        optional={"properties": st.one_of(st.dictionaries(_NAMES, _NAMES, max_size=3), json_values())},
    ),
    "/v1/{prefix}/namespaces/{namespace}/properties": st.fixed_dictionaries(
        {},
        optional={
            "removals": st.one_of(st.lists(_NAMES, max_size=3), json_scalars),
            "updates": st.one_of(st.dictionaries(_NAMES, _NAMES, max_size=3), json_values()),
        },
    ),
    "/v1/{prefix}/namespaces/{namespace}/tables": st.fixed_dictionaries(
        {"name": _NAMES, "schema": st.one_of(st.just(TABLE_SCHEMA), json_objects)},
        optional={
            "location": st.one_of(_NAMES, st.just("file:///tmp/elsewhere")),
            "properties": st.one_of(st.dictionaries(_NAMES, _NAMES, max_size=3), json_values()),
            "stage-create": json_scalars,
            "partition-spec": json_objects,
            "write-order": json_objects,
        },
    ),
    "/v1/{prefix}/namespaces/{namespace}/register": st.fixed_dictionaries(
        {"name": _NAMES, "metadata-location": st.one_of(_NAMES, st.just("file:///nope/v1.metadata.json"))},
        optional={"overwrite": json_scalars},
    ),
    "/v1/{prefix}/namespaces/{namespace}/tables/{table}": _COMMIT,
    "/v1/{prefix}/tables/rename": st.fixed_dictionaries({"source": _IDENTIFIER, "destination": _IDENTIFIER}),
    "/v1/{prefix}/namespaces/{namespace}/tables/{table}/notifications": st.fixed_dictionaries(
        {"notification-type": st.sampled_from(["CREATE", "UPDATE", "DROP", "VALIDATE", "x"])},
        optional={
            "payload": st.one_of(
                json_objects,
                st.fixed_dictionaries(
                    {
                        "table-name": _NAMES,
                        "timestamp": json_scalars,
                        "metadata-location": _NAMES,
                        "metadata": json_objects,
                    }
                ),
            )
        },
    ),
}


@pytest.fixture(scope="module")
def catalog() -> Iterator[CatalogApp]:
    with tempfile.TemporaryDirectory() as tmp:
        yield CatalogApp(Path(tmp))


def _segment(value: str) -> str:
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    method, template, takes_body = draw(st.sampled_from(ROUTES))
    if draw(st.integers(0, 9)) == 0:
        method = draw(st.sampled_from(_METHODS))
    path = template.format(
        prefix=_segment(draw(st.one_of(st.just("wh"), _NAMES))),
        namespace=_segment(draw(st.one_of(st.just("ns"), st.just("ns\x1fsub"), _NAMES))),
        table=_segment(draw(st.one_of(st.just("t"), _NAMES))),
    )
    body: Any = None
    if takes_body or draw(st.booleans()):
        structured = _BODIES.get(template, json_objects)
        body = draw(st.one_of(structured, structured, json_values(), st.binary(max_size=40)))
    query = draw(
        st.dictionaries(
            st.sampled_from(["pageToken", "pageSize", "purgeRequested", "snapshots", "warehouse", "parent", "x"]),
            st.one_of(_NAMES, st.sampled_from(["-1", "0", "1", "true", "false", "all", "refs", "9" * 30])),
            max_size=3,
        )
    )
    return {
        "method": method,
        "path": path,
        "body": body,
        "query": urlencode(query, encoding="utf-8", errors="surrogatepass"),
    }


@st.composite
def headers(draw: st.DrawFn, token: str) -> list[tuple[str, str]]:
    auth = draw(
        st.sampled_from([f"Bearer {token}", f"Bearer {token}", f"Bearer {token}x", "Bearer ", "Basic Zm9vOmJhcg==", ""])
    )
    latin1 = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=30)
    extra = draw(
        st.lists(
            st.tuples(
                st.sampled_from(
                    [
                        vocabulary.ACCESS_DELEGATION_HEADER,
                        vocabulary.CAPABILITIES_HEADER,
                        "If-None-Match",
                        "Content-Type",
                        "Content-Length",
                        "X-Forwarded-For",
                    ]
                ),
                st.one_of(latin1, st.sampled_from(["vended-credentials", "read-restrictions.v1", "*", "true"])),
            ),
            max_size=3,
        )
    )
    return [("authorization", auth), *extra] if auth else extra


def _check_reply(reply: Reply, method: str) -> None:
    assert reply.status < 500, (reply.status, reply.body[:300])
    assert b"Traceback" not in reply.body
    if reply.status in (307, 308):  # Starlette's trailing-slash redirect to the route without it
        assert reply.headers["location"] and reply.body == b""
        return
    if method == "HEAD":
        return  # the ASGI server sends no body for HEAD, whatever the app wrote
    if reply.status in (204, 304):
        assert reply.body == b""
        return
    document = json.loads(reply.body)  # every answer with a body is JSON
    if reply.status >= 400 and "error_description" not in document:  # the token endpoint speaks OAuth
        error = document["error"]
        assert set(error) >= {"message", "type", "code"}
        assert error["code"] == reply.status
        assert isinstance(error["type"], str) and error["type"]
        assert_one_line(error["message"])


def _baseline_loads(catalog: CatalogApp) -> None:
    reply = catalog.request("GET", "/v1/wh/namespaces/ns/tables/t")
    assert reply.status in (200, 404), (reply.status, reply.body[:300])


@given(st.data())
def test_every_route_answers_typed_and_refusals_change_nothing(catalog: CatalogApp, data: st.DataObject) -> None:
    catalog.ensure_baseline()
    request = data.draw(requests())
    sent_headers = data.draw(headers(catalog.token))
    before = catalog.snapshot()
    reply = catalog.request(
        request["method"], request["path"], request["body"], query=request["query"], headers=sent_headers
    )
    _check_reply(reply, request["method"])
    if reply.status >= 300:
        assert catalog.snapshot() == before, f"refused request ({reply.status}) changed the database"
    _baseline_loads(catalog)


@given(_COMMIT, st.booleans())
def test_commits_to_the_protected_table(catalog: CatalogApp, commit: dict[str, Any], right_uuid: bool) -> None:
    """Commits against ns.t: a refused one leaves pointer and pin as they were; an accepted one loads verified."""
    catalog.ensure_baseline()
    loaded = catalog.request("GET", "/v1/wh/namespaces/ns/tables/t")
    assert loaded.status == 200
    if right_uuid:
        table_uuid = loaded.json()["metadata"]["table-uuid"]
        commit = {**commit, "requirements": [{"type": "assert-table-uuid", "uuid": table_uuid}]}
    before = catalog.snapshot()
    reply = catalog.request("POST", "/v1/wh/namespaces/ns/tables/t", commit)
    _check_reply(reply, "POST")
    if reply.status >= 300:
        assert catalog.snapshot() == before
        return
    after = catalog.request("GET", "/v1/wh/namespaces/ns/tables/t")
    assert after.status == 200, after.body[:300]
    assert after.json()["metadata-location"] == reply.json()["metadata-location"]


# ------------------------------------------------------------------------- regressions found by the fuzzer


def test_removing_an_absent_property_is_a_400_and_changes_nothing(catalog: CatalogApp) -> None:
    # pyiceberg raised KeyError for the missing key: the catalog answered 500.
    catalog.ensure_baseline()
    before = catalog.snapshot()
    commit = {"requirements": [], "updates": [{"action": "remove-properties", "removals": ["no-such-property"]}]}
    reply = catalog.request("POST", "/v1/wh/namespaces/ns/tables/t", commit)
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["type"] == vocabulary.ERROR_BAD_REQUEST
    assert "no-such-property" in reply.json()["error"]["message"]
    assert catalog.snapshot() == before


def test_an_error_echoing_a_control_character_stays_one_line(catalog: CatalogApp) -> None:
    # "unknown warehouse: \r0" was sent as a two-line ErrorModel message.
    reply = catalog.request("GET", "/v1/%0D0/namespaces")
    assert reply.status == 404
    assert reply.json()["error"]["message"] == "unknown warehouse: \\r0"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/wh/namespaces/%20"),
        ("HEAD", "/v1/wh/namespaces/%20"),
        ("GET", "/v1/wh/namespaces/ns/tables/%20%20"),
        ("DELETE", "/v1/wh/namespaces/%20/tables/t"),
    ],
)
def test_a_whitespace_only_identifier_is_a_400(catalog: CatalogApp, method: str, path: str) -> None:
    # pyiceberg's NoSuchNamespaceError for a blank segment escaped untranslated: the catalog answered 500.
    reply = catalog.request(method, path)
    assert reply.status == 400, reply.body
    if method != "HEAD":
        assert "whitespace" in reply.json()["error"]["message"]
