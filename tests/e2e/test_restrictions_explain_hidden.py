"""EXPLAIN ANALYZE says nothing that depends on rows the row filter hides.

A row filter on a uuid column cannot be handed to pyiceberg's pruning (it keeps every file and row group), so the
reader reads the hidden tenant's rows too, keeps those the user's own WHERE keeps, and the exact row filter then
empties the batch. Such an emptied batch used to be handed on and counted as a scan batch: with no row shown
either way, ``scan_batches`` still told whether a hidden row matched ``amount > X``, and a binary search recovered
the hidden amount.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, UUIDType

from sqe.session import explain_sections
from tests.conftest import CatalogServer
from tests.e2e.test_restrictions_e2e import World, _principal, _pyiceberg

pytestmark = [pytest.mark.e2e]

MINE, HIDDEN = uuid.UUID(int=1), uuid.UUID(int=2)
HIDDEN_AMOUNT = 1_234_567


@pytest.fixture(scope="module")
def world(catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    suffix = uuid.uuid4().hex[:6]
    principals = {
        "writer": _principal(
            catalog_server, f"hid_w_{suffix}", ["NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA"]
        ),
        "tenant": _principal(catalog_server, f"hid_t_{suffix}", ["TABLE_READ_DATA"]),
    }
    namespace = f"hidden_{suffix}"
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        writer = _pyiceberg(catalog_server, principals["writer"])
        writer.create_namespace(namespace)
        schema = Schema(
            NestedField(1, "id", LongType(), required=False),
            NestedField(2, "tenant", UUIDType(), required=False),
            NestedField(3, "amount", LongType(), required=False),
        )
        rows = pa.table(
            {
                "id": pa.array([1, 2, 3], pa.int64()),
                "tenant": pa.array([MINE.bytes, MINE.bytes, HIDDEN.bytes], pa.uuid()),
                "amount": pa.array([10, 20, HIDDEN_AMOUNT], pa.int64()),
            }
        )
        writer.create_table((namespace, "people"), schema=schema).append(rows)
        reader = catalog_server.create_principal(f"hid_engine_{suffix}", reader=True)
        world = World(catalog_server, namespace, tmp_path_factory.mktemp("hidden"), principals, reader)
        only_mine = {"type": "eq", "left": {"type": "reference", "id": 2}, "right": str(MINE)}
        world.restrict("tenant", {"required-row-filter": only_mine})
        yield world


def test_the_tenant_sees_only_its_rows(world: World) -> None:
    assert sorted(row["id"] for row in world.rows("tenant", "SELECT id, amount FROM {t}")) == [1, 2]


def test_scan_figures_are_the_same_whether_or_not_a_hidden_row_matches(world: World) -> None:
    figures = {}
    with world.session("tenant") as session:
        session.pass_through = False  # through DuckDB, whose scan EXPLAIN ANALYZE measures
        for bound in (HIDDEN_AMOUNT - 1, HIDDEN_AMOUNT):  # the hidden row matches the first only
            sql = f"EXPLAIN ANALYZE SELECT id FROM {world.namespace}.people WHERE amount > {bound}"
            [scan] = [v for k, v in explain_sections(session.sql(sql).arrow()).items() if k != "query"]
            figures[bound] = {key: scan[key] for key in ("scan_rows", "scan_batches", "scan_arrow_bytes")}
    assert figures[HIDDEN_AMOUNT - 1] == figures[HIDDEN_AMOUNT]
    assert figures[HIDDEN_AMOUNT]["scan_rows"] == "0"
