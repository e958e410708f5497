"""Table and view locations are disjoint: vended table credentials never reach a view's metadata file.

A table's writers holding a view's metadata file could rewrite its SQL, which runs in every invoker's session, so
the catalog refuses a table at, inside or around a view's location, and a view at, inside or around a table's
(or another view's), with the 400 the table-overlap refusal uses. Everything against the real catalog server.
"""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest
import requests

from sqe import vocabulary

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
VERSION = {
    "version-id": 1,
    "schema-id": 0,
    "timestamp-ms": 1,
    "summary": {"operation": "create"},
    "representations": [{"type": "sql", "sql": "SELECT 1 AS id", "dialect": "duckdb"}],
    "default-namespace": [],
}


class Api:
    def __init__(self, server: CatalogServer) -> None:
        self.server = server
        self.base = f"{server.url}/v1/{server.warehouse}"
        self.headers = {"Authorization": f"Bearer {server.token(server.admin)}"}

    def post(self, path: str, body: dict[str, Any]) -> requests.Response:
        return requests.post(f"{self.base}/{path}", json=body, headers=self.headers, timeout=30)

    def namespace(self, *levels: str) -> str:
        ns = list(levels) or [f"vloc_{uuid.uuid4().hex[:8]}"]
        assert self.post("namespaces", {"namespace": ns}).status_code == 200
        return vocabulary.NAMESPACE_SEPARATOR.join(ns)

    def create_table(self, ns: str, name: str, location: str | None = None, **properties: str) -> requests.Response:
        body: dict[str, Any] = {"name": name, "schema": SCHEMA, "properties": properties}
        if location:
            body["location"] = location
        return self.post(f"namespaces/{ns}/tables", body)

    def create_view(self, ns: str, name: str) -> requests.Response:
        return self.post(f"namespaces/{ns}/views", {"name": name, "schema": SCHEMA, "view-version": VERSION})

    def area(self, ns: str) -> str:
        return "/".join((self.server.warehouse_location.rstrip("/"), *ns.split(vocabulary.NAMESPACE_SEPARATOR)))


@pytest.fixture
def api(catalog_server: CatalogServer) -> Api:
    return Api(catalog_server)


def assert_overlap(reply: requests.Response, kind: str, name: str) -> None:
    """The table-overlap refusal's 400 ErrorModel, naming the ``kind`` (table / view) overlapped."""
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == vocabulary.ERROR_BAD_REQUEST
    assert f"overlaps the location of {kind} {name}" in error["message"]


def test_a_table_at_inside_or_around_a_view_location_is_refused(api: Api) -> None:
    ns = api.namespace()
    created = api.create_view(ns, "v")
    assert created.status_code == 200, created.text
    view_location = created.json()["metadata"]["location"]
    assert view_location == f"{api.area(ns)}/v"
    assert created.json()["metadata-location"].startswith(f"{view_location}/metadata/")

    assert_overlap(api.create_table(ns, "t", view_location), "view", f"{ns}.v")  # equal
    assert_overlap(api.create_table(ns, "t", f"{view_location}/metadata"), "view", f"{ns}.v")  # inside
    assert_overlap(api.create_table(ns, "t", api.area(ns)), "view", f"{ns}.v")  # around
    # the other ways a table claims a place: a data or metadata path, a staged create
    here = f"{api.area(ns)}/t"
    assert_overlap(api.create_table(ns, "t", here, **{"write.data.path": view_location}), "view", f"{ns}.v")
    assert_overlap(api.create_table(ns, "t", here, **{"write.metadata.path": view_location}), "view", f"{ns}.v")
    staged = {"name": "t", "schema": SCHEMA, "location": view_location, "stage-create": True}
    assert_overlap(api.post(f"namespaces/{ns}/tables", staged), "view", f"{ns}.v")

    # an unrelated place is still fine, and such a table cannot move onto the view by a commit
    assert api.create_table(ns, "t", here).status_code == 200
    for update in (
        {"action": "set-location", "location": view_location},
        {"action": "set-properties", "updates": {"write.data.path": f"{view_location}/data"}},
        {"action": "set-properties", "updates": {"write.metadata.path": view_location}},
    ):
        assert_overlap(api.post(f"namespaces/{ns}/tables/t", {"updates": [update]}), "view", f"{ns}.v")


def test_a_view_at_inside_or_around_a_table_location_is_refused(api: Api) -> None:
    ns = api.namespace()
    area = api.area(ns)
    assert api.create_table(ns, "at", f"{area}/v1").status_code == 200
    assert api.create_table(ns, "under", f"{area}/v2/data").status_code == 200
    assert api.create_table(ns, "paths", f"{area}/p", **{"write.data.path": f"{area}/v3"}).status_code == 200
    # the view's default place is a table's, holds one, or is a table's data path: the view goes beside it
    for view in ("v1", "v2", "v3"):
        created = api.create_view(ns, view)
        assert created.status_code == 200, created.text
        assert created.json()["metadata"]["location"].startswith(f"{area}/{view}-")

    whole = api.namespace()  # a table holding its whole namespace's area: every view there is inside it
    assert api.create_table(whole, "all", api.area(whole)).status_code == 200
    assert_overlap(api.create_view(whole, "v"), "table", f"{whole}.all")

    # an unrelated place is still fine
    assert api.create_view(ns, "elsewhere").status_code == 200


def test_a_view_inside_another_view_is_refused(api: Api) -> None:
    ns = api.namespace()
    assert api.create_view(ns, "outer").status_code == 200
    nested = api.namespace(ns, "outer")  # its views' places are inside view outer's
    assert_overlap(api.create_view(nested, "inner"), "view", f"{ns}.outer")


def test_view_metadata_is_written_only_under_the_recorded_location(api: Api, catalog_server: CatalogServer) -> None:
    """A view metadata file whose ``location`` was rewritten in storage does not steer where a replace writes."""
    ns = api.namespace()
    created = api.create_view(ns, "v").json()
    location, current = created["metadata"]["location"], created["metadata-location"]
    bucket, _, key = current.removeprefix("s3://").partition("/")
    s3 = catalog_server.moto.client("s3")
    document = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    elsewhere = f"{api.area(ns)}/elsewhere"
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps({**document, "location": elsewhere}).encode())

    update = {"action": "set-properties", "updates": {"comment": "moved?"}}
    reply = api.post(f"namespaces/{ns}/views/v", {"updates": [update]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["metadata-location"].startswith(f"{location}/metadata/")
    assert reply.json()["metadata"]["location"] == location
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=elsewhere.removeprefix(f"s3://{bucket}/"))
    assert listed.get("KeyCount", 0) == 0


def test_registering_a_table_at_a_view_location_is_refused(api: Api, catalog_server: CatalogServer) -> None:
    ns = api.namespace()
    view_location = api.create_view(ns, "v").json()["metadata"]["location"]
    made = api.create_table(ns, "t").json()
    bucket, _, key = made["metadata-location"].removeprefix("s3://").partition("/")
    s3 = catalog_server.moto.client("s3")
    document = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    moved = {**document, "table-uuid": str(uuid.uuid4()), "location": view_location, "metadata-log": []}
    copy_key = key.replace("/t/metadata/", "/t/metadata/moved-")
    s3.put_object(Bucket=bucket, Key=copy_key, Body=json.dumps(moved).encode())

    reply = api.post(f"namespaces/{ns}/register", {"name": "r", "metadata-location": f"s3://{bucket}/{copy_key}"})
    assert_overlap(reply, "view", f"{ns}.v")


def test_concurrent_table_and_view_creates_never_both_take_a_place(api: Api) -> None:
    """Check and create run under one lock: of a table and a view racing for one place, only the table gets it."""
    ns = api.namespace()
    area = api.area(ns)
    names = [f"p{i}" for i in range(8)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        tables = [pool.submit(api.create_table, ns, f"t_{name}", f"{area}/{name}") for name in names]
        views = [pool.submit(api.create_view, ns, name) for name in names]
        outcomes = [(t.result().status_code, v.result().status_code) for t, v in zip(tables, views, strict=True)]
    assert all(table == 200 and view in (200, 400) for table, view in outcomes), outcomes
    # a view that saw the table's place taken went beside it; one that lost the race under the lock was refused
    views_made = [v.result().json()["metadata"]["location"] for v in views if v.result().status_code == 200]
    assert not set(views_made) & {f"{area}/{name}" for name in names}, views_made


def test_a_name_renamed_away_can_be_used_again(api: Api) -> None:
    """Renames move no files: a new view or table under the old name of a renamed view or table goes beside the
    place the renamed one still holds, as beside a dropped table's."""
    ns = api.namespace()
    area = api.area(ns)
    assert api.create_view(ns, "v").status_code == 200
    assert api.create_view(ns, "u").status_code == 200
    assert api.create_table(ns, "t").status_code == 200
    for kind, old in (("views", "v"), ("views", "u"), ("tables", "t")):
        source, target = {"namespace": [ns], "name": old}, {"namespace": [ns], "name": f"{old}_renamed"}
        assert api.post(f"{kind}/rename", {"source": source, "destination": target}).status_code == 204

    view = api.create_view(ns, "v")  # a view where a renamed view was
    assert view.status_code == 200, view.text
    assert view.json()["metadata"]["location"].startswith(f"{area}/v-")
    for name in ("u", "t"):  # a table where a renamed view, or a renamed table, was
        table = api.create_table(ns, name)
        assert table.status_code == 200, table.text
        assert table.json()["metadata"]["location"].startswith(f"{area}/{name}-")


def test_a_table_and_a_view_racing_for_one_name_never_both_get_it(api: Api) -> None:
    """A create without a location goes beside a place another holds, so the name is checked again under the
    location lock: of a table and a view created at once under one name, exactly one is made."""
    ns = api.namespace()
    names = [f"n{i}" for i in range(12)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        tables = [pool.submit(api.create_table, ns, name) for name in names]
        views = [pool.submit(api.create_view, ns, name) for name in names]
        outcomes = [(t.result().status_code, v.result().status_code) for t, v in zip(tables, views, strict=True)]
    assert all(sorted(pair) == [200, 409] for pair in outcomes), outcomes
