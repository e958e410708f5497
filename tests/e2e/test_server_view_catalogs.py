"""A view's ``default-catalog`` in ``sqe serve`` means what it means in the server's own engine config.

A user's config keeps only the warehouses on the primary catalog (a sibling on another catalog would receive the
user's token), so a view naming such a sibling must fail as naming one SQE cannot serve this user, never fall back
to the view's own warehouse (another engine's name for its catalog does, as no warehouse of SQE's has it).
Real sqe-catalog, real ``sqe serve`` subprocess, ADBC over Flight SQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from pyiceberg.view.metadata import SQLViewRepresentation, ViewVersion

from tests.conftest import CatalogPrincipal, CatalogServer, pyiceberg_catalog
from tests.e2e.test_server import Served, _principal, _reader_settings, _write_configs, start_server

pytestmark = [pytest.mark.e2e]

ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64())})


@pytest.fixture(scope="module")
def served_with_sibling(
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
    other = catalog_server.url.replace("127.0.0.1", "localhost")  # another catalog's address: withheld from users
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
