"""A view's ``default-catalog`` in ``sqe serve`` means what it means in the server's own engine config.

A user's config keeps only the warehouses on the primary catalog (a sibling on another catalog would receive the
user's token), so a view naming such a sibling must fail as naming one SQE cannot serve this user, never fall back
to the view's own warehouse (another engine's name for its catalog does, as no warehouse of SQE's has it).
Real sqe-catalog, real ``sqe serve`` subprocess, ADBC over Flight SQL.
"""

from __future__ import annotations

import http.server
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from pyiceberg.view.metadata import SQLViewRepresentation, ViewVersion

from sqe.server._proto import flight_sql_pb2 as sql_pb
from tests.conftest import CatalogPrincipal, CatalogServer, pyiceberg_catalog
from tests.e2e.test_server import (
    Served,
    _bearer,
    _command,
    _principal,
    _reader_settings,
    _write_configs,
    start_server,
)

pytestmark = [pytest.mark.e2e]

ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64())})


@dataclass
class RecordingCatalog:
    """An HTTP listener standing for another catalog: it answers 503 and records every request it gets, so a
    test sees whether the server (or a user's session) ever called it."""

    url: str
    requests: list[str]


@pytest.fixture(scope="module")
def sibling_catalog() -> Iterator[RecordingCatalog]:
    seen: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            seen.append(f"{self.command} {self.path}")
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_HEAD = do_DELETE = _refuse

        def log_message(self, format: str, *args: object) -> None:
            return None

    listener = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=listener.serve_forever, daemon=True)
    thread.start()
    try:
        yield RecordingCatalog(f"http://127.0.0.1:{listener.server_port}", seen)
    finally:
        listener.shutdown()
        listener.server_close()


@pytest.fixture(scope="module")
def served_with_sibling(
    sibling_catalog: RecordingCatalog,
    catalog_server: CatalogServer,
    catalog_reader: CatalogPrincipal,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    from tests.helpers.processes import stop_child

    suffix = uuid.uuid4().hex[:6]
    namespace = f"viewcat_{suffix}"
    grants = [("TABLE_READ_DATA", None), ("NAMESPACE_LIST", None), ("VIEW_LIST", None), ("VIEW_READ_PROPERTIES", None)]
    reader = _principal(catalog_server, f"vc_reader_{suffix}", grants)
    catalog = pyiceberg_catalog(catalog_server, catalog_server.admin)
    catalog.create_namespace(namespace)
    catalog.create_table((namespace, "people"), schema=ROWS.schema).append(ROWS)
    for name, default_catalog in (("v_elsewhere", "elsewhere"), ("v_spark", "spark_catalog")):
        version = ViewVersion(
            version_id=1,
            schema_id=0,
            representations=[
                SQLViewRepresentation(type="sql", sql=f"SELECT id FROM {namespace}.people", dialect="spark")
            ],
            default_namespace=(namespace,),
            default_catalog=default_catalog,
        )
        schema = Schema(NestedField(1, "id", LongType(), required=False))
        catalog.create_view((namespace, name), schema, version)
    workdir = tmp_path_factory.mktemp("viewcat")
    config = _write_configs(workdir, catalog_server, **_reader_settings(catalog_reader))
    other = sibling_catalog.url  # another catalog's address: withheld from users
    engine = workdir / "engine.toml"
    engine.write_text(
        engine.read_text() + f'\n[[catalog.warehouses]]\nname = "elsewhere"\nuri = "{other}"\n', encoding="utf-8"
    )
    proc, port = start_server(workdir, config)
    world = Served(
        catalog_server, namespace, f"grpc://127.0.0.1:{port}", proc, workdir / "server.log", workdir, {"r": reader}
    )
    try:
        yield world
    finally:
        stop_child(proc)


def _ids(conn: object, sql: str) -> list[int]:
    with conn.cursor() as cur:  # type: ignore[attr-defined]
        cur.execute(sql)
        return [row["id"] for row in cur.fetch_arrow_table().to_pylist()]


def test_a_view_naming_a_sibling_withheld_from_users_fails_rather_than_reading_its_own_warehouse(
    served_with_sibling: Served,
) -> None:
    """Found by review: the warehouses a user's config keeps were the known set, so a view whose default-catalog
    named the server's sibling on another catalog read the view's own warehouse's tables instead (the server's own
    engine config resolves it to that sibling)."""
    ns = served_with_sibling.namespace
    with served_with_sibling.adbc("r") as conn:
        assert _ids(conn, f"SELECT id FROM {ns}.v_spark ORDER BY id") == [1, 2, 3]  # another engine's catalog name
        with pytest.raises(Exception) as err:
            _ids(conn, f"SELECT id FROM {ns}.v_elsewhere ORDER BY id")
    message = str(err.value)
    assert "unknown warehouse 'elsewhere'" in message and "Traceback" not in message, message


def _listed(served: Served, command: object) -> list[dict[str, object]]:
    client = served.flight_client()
    options = _bearer(served.token("r"))
    info = client.get_flight_info(_command(command), options)
    rows = client.do_get(info.endpoints[0].ticket, options).read_all().to_pylist()
    return [{k: v for k, v in row.items() if k != "table_schema"} for row in rows]


def test_listings_show_only_the_warehouses_a_users_session_can_query(
    served_with_sibling: Served, sibling_catalog: RecordingCatalog
) -> None:
    """Found by review: GetCatalogs listed the server's sibling on another catalog, which a user's config drops
    (their session cannot query it), and GetDbSchemas / GetTables named with it asked a session that has no such
    warehouse. Each listing now holds only the warehouses on the primary catalog, and the other catalog is never
    called."""
    served, ns = served_with_sibling, served_with_sibling.namespace
    primary = served.catalog.warehouse
    assert _listed(served, sql_pb.CommandGetCatalogs()) == [{"catalog_name": primary}]
    with served.adbc("r") as conn:
        catalogs = conn.adbc_get_objects(depth="catalogs").read_all().to_pylist()
    assert [row["catalog_name"] for row in catalogs] == [primary]

    schemas = _listed(served, sql_pb.CommandGetDbSchemas())
    assert {"catalog_name": primary, "db_schema_name": ns} in schemas
    assert {row["catalog_name"] for row in schemas} == {primary}
    assert _listed(served, sql_pb.CommandGetDbSchemas(catalog="elsewhere")) == []

    for include_schema in (False, True):
        tables = _listed(served, sql_pb.CommandGetTables(db_schema_filter_pattern=ns, include_schema=include_schema))
        assert {"catalog_name": primary, "db_schema_name": ns, "table_name": "people", "table_type": "TABLE"} in tables
        assert {row["catalog_name"] for row in tables} == {primary}
        elsewhere = sql_pb.CommandGetTables(catalog="elsewhere", include_schema=include_schema)
        assert _listed(served, elsewhere) == []
    assert sibling_catalog.requests == []
