"""Views in SQE against the real catalog on moto: CREATE [OR REPLACE] / DROP VIEW, SHOW VIEWS, views in SHOW
TABLES, invoker's restrictions (never the definer's), dialects, and pyiceberg as the other client both ways."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from pyiceberg.view.metadata import SQLViewRepresentation, ViewVersion

import sqe.api
from sqe.errors import CommitConflictError, NoSuchTableError, NoSuchViewError, UnsupportedViewDialectError
from sqe.session import Session
from tests.conftest import CatalogPrincipal, CatalogServer, pyiceberg_catalog, write_sqe_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PEOPLE = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "email": ["a@x.org", "b@y.org", "c@z.org", "d@w.org"]})
RULES = {
    "required-column-projections": [{"field-id": 2, "action": "mask-alphanum"}],
    "required-row-filter": {"type": "not-eq", "left": {"type": "reference", "id": 1}, "right": 2},
}


@dataclass
class Setup:
    server: CatalogServer
    namespace: str
    definer: Path  # SQE config of the unrestricted definer (the catalog admin)
    analyst: Path  # SQE config of the row-filtered, masked invoker, through the trusted reader
    pyiceberg: RestCatalog


@pytest.fixture(scope="module")
def views_setup(
    catalog_server: CatalogServer,
    engine_writer: CatalogPrincipal,
    catalog_reader: CatalogPrincipal,
    tmp_path_factory: pytest.TempPathFactory,
) -> Setup:
    workdir = tmp_path_factory.mktemp("engine_views")
    suffix = uuid.uuid4().hex[:6]
    namespace = f"eviews_{suffix}"
    writer = pyiceberg_catalog(catalog_server, engine_writer)
    writer.create_namespace(namespace)
    writer.create_table((namespace, "people"), schema=PEOPLE.schema).append(PEOPLE)
    analyst = catalog_server.principal_with_grants(
        f"ev_analyst_{suffix}",
        [
            ("TABLE_READ_DATA", None, None),
            ("NAMESPACE_LIST", None, None),
            ("VIEW_LIST", None, None),
            ("VIEW_READ_PROPERTIES", None, None),
        ],
    )
    rules = workdir / "rules.json"
    rules.write_text(json.dumps(RULES), encoding="utf-8")
    target = ["--warehouse", catalog_server.warehouse, "--namespace", namespace, "--table", "people"]
    catalog_server.admin_cli("set-restrictions", *target, "--principal", analyst.name, "--file", str(rules))
    moto = catalog_server.moto
    definer = write_sqe_config(workdir / "definer.toml", catalog_server.url, catalog_server.admin, moto)
    reader = {"reader_client_id": catalog_reader.client_id, "reader_client_secret": catalog_reader.client_secret}
    invoker = write_sqe_config(workdir / "analyst.toml", catalog_server.url, analyst, moto, catalog=reader)
    admin_catalog = RestCatalog(
        f"views-{suffix}",
        uri=catalog_server.url,
        warehouse=catalog_server.warehouse,
        credential=catalog_server.admin.credential,
    )
    return Setup(catalog_server, namespace, definer, invoker, admin_catalog)


def _rows(session: Session, sql: str) -> list[tuple[object, ...]]:
    return sorted(session.sql(sql).fetchall())


def _masked(email: object) -> bool:
    return isinstance(email, str) and "@" in email and not any(c.isalnum() and c != "x" for c in email)


def test_a_view_over_a_restricted_table_runs_with_the_invokers_restrictions(views_setup: Setup) -> None:
    ns = views_setup.namespace
    with sqe.api.connect(views_setup.definer) as definer:
        assert definer.sql(f"CREATE VIEW {ns}.contacts AS SELECT id, email FROM {ns}.people").fetchall()
        as_definer = _rows(definer, f"SELECT id, email FROM {ns}.contacts")
    assert as_definer == sorted(zip(PEOPLE["id"].to_pylist(), PEOPLE["email"].to_pylist(), strict=True))

    with sqe.api.connect(views_setup.analyst) as analyst:
        through_view = _rows(analyst, f"SELECT id, email FROM {ns}.contacts")
        direct = _rows(analyst, f"SELECT id, email FROM {ns}.people")
        joined = _rows(analyst, f"SELECT c.id FROM {ns}.contacts c JOIN {ns}.people p ON c.id = p.id")
    assert [r[0] for r in through_view] == [1, 3, 4]  # the invoker's row filter, not the definer's nothing
    assert all(_masked(r[1]) for r in through_view), through_view
    assert through_view == direct
    assert joined == [(1,), (3,), (4,)]


def test_create_replace_show_and_drop_views(views_setup: Setup) -> None:
    ns = views_setup.namespace
    with sqe.api.connect(views_setup.definer) as session:
        session.sql(f"CREATE VIEW {ns}.small AS SELECT id FROM {ns}.people WHERE id < 3")
        assert _rows(session, f"SELECT * FROM {ns}.small") == [(1,), (2,)]
        with pytest.raises(CommitConflictError):
            session.sql(f"CREATE VIEW {ns}.small AS SELECT 1 AS id")
        session.sql(f"CREATE VIEW IF NOT EXISTS {ns}.small AS SELECT 1 AS id")  # exists: unchanged
        session.sql(f"CREATE OR REPLACE VIEW {ns}.small AS SELECT id * 10 AS id FROM {ns}.people WHERE id < 3")
        assert _rows(session, f"SELECT * FROM {ns}.small") == [(10,), (20,)]
        session.sql(f"CREATE VIEW {ns}.smaller AS SELECT id FROM {ns}.small WHERE id > 10")  # a view of a view
        assert _rows(session, f"SELECT * FROM {ns}.smaller") == [(20,)]
        listed = session.sql(f"SHOW TABLES FROM {ns}").arrow().to_pylist()
        kinds = {r["table"]: r["kind"] for r in listed}
        assert kinds["people"] == "TABLE" and kinds["small"] == "VIEW" and kinds["smaller"] == "VIEW"
        shown = {r["view"] for r in session.sql(f"SHOW VIEWS FROM {ns}").arrow().to_pylist()}
        assert {"small", "smaller"} <= shown and "people" not in shown
        session.sql(f"DROP VIEW {ns}.smaller")
        session.sql(f"DROP VIEW IF EXISTS {ns}.smaller")
        with pytest.raises(NoSuchViewError):
            session.sql(f"DROP VIEW {ns}.smaller")
        with pytest.raises(NoSuchTableError):
            session.sql(f"SELECT * FROM {ns}.smaller")
    version = views_setup.pyiceberg.load_view((ns, "small")).metadata
    assert version.current_version_id == 2
    current = next(v for v in version.versions if v.version_id == 2)
    assert [(r.root.dialect, r.root.sql) for r in current.representations] == [
        ("duckdb", f"SELECT id * 10 AS id FROM {ns}.people WHERE id < 3")
    ]


def _third_party_view(setup: Setup, name: str, dialect: str, sql: str, default_catalog: str | None = None) -> None:
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "email", StringType()))
    version = ViewVersion(
        version_id=1,
        schema_id=0,
        representations=[SQLViewRepresentation(type="sql", sql=sql, dialect=dialect)],
        default_namespace=(setup.namespace,),
        default_catalog=default_catalog,
    )
    setup.pyiceberg.create_view((setup.namespace, name), schema, version)


def test_views_made_by_pyiceberg_run_in_sqe_by_dialect(views_setup: Setup) -> None:
    ns = views_setup.namespace
    _third_party_view(views_setup, "spark_ok", "spark", f"SELECT id, email FROM {ns}.people WHERE id > 2")
    _third_party_view(views_setup, "spark_ticks", "spark", f"SELECT id FROM {ns}.people DISTRIBUTE BY id")
    _third_party_view(views_setup, "hive_only", "hive", f"SELECT id FROM {ns}.people")
    # Spark records its session's catalog name, which names no warehouse here: the view's own warehouse is meant
    _third_party_view(views_setup, "spark_demo", "spark", f"SELECT id, email FROM {ns}.people WHERE id > 2", "demo")
    with sqe.api.connect(views_setup.analyst) as analyst:
        for view in ("spark_ok", "spark_demo"):
            rows = _rows(analyst, f"SELECT id, email FROM {ns}.{view}")
            assert [r[0] for r in rows] == [3, 4] and all(_masked(r[1]) for r in rows)
        with pytest.raises(UnsupportedViewDialectError, match="spark") as ticks:
            analyst.sql(f"SELECT * FROM {ns}.spark_ticks")
        assert "\n" not in str(ticks.value)
        with pytest.raises(UnsupportedViewDialectError, match="hive"):
            analyst.sql(f"SELECT * FROM {ns}.hive_only")
        assert "spark_ok" in {r["view"] for r in analyst.sql(f"SHOW VIEWS FROM {ns}").arrow().to_pylist()}


def test_a_cte_named_like_a_table_hides_it_only_where_duckdb_sees_the_cte(views_setup: Setup) -> None:
    """A one-part ``people`` outside the subquery whose CTE has that name, and the one in a CTE's own body, are
    the table (in the view's default namespace), read with the invoker's restrictions like any other."""
    ns = views_setup.namespace
    outer = "SELECT id, email FROM people WHERE id IN (WITH people AS (SELECT 3 AS id) SELECT id FROM people)"
    _third_party_view(views_setup, "cte_outer", "spark", outer)
    body = "WITH people AS (SELECT * FROM people WHERE id > 2) SELECT id, email FROM people"
    _third_party_view(views_setup, "cte_body", "spark", body)
    with sqe.api.connect(views_setup.analyst) as analyst:
        assert len(_rows(analyst, f"SELECT id FROM {ns}.people")) == 3  # the table's view stays in DuckDB
        outer_rows = _rows(analyst, f"SELECT id, email FROM {ns}.cte_outer")
        body_rows = _rows(analyst, f"SELECT id, email FROM {ns}.cte_body")
    assert [r[0] for r in outer_rows] == [3] and all(_masked(r[1]) for r in outer_rows), outer_rows
    assert [r[0] for r in body_rows] == [3, 4] and all(_masked(r[1]) for r in body_rows), body_rows


def test_views_made_by_sqe_are_read_by_pyiceberg(views_setup: Setup) -> None:
    ns = views_setup.namespace
    with sqe.api.connect(views_setup.definer) as session:
        session.sql(f"CREATE VIEW {ns}.for_others AS SELECT id, upper(email) AS loud FROM {ns}.people")
    assert (ns, "for_others") in views_setup.pyiceberg.list_views(ns)
    view = views_setup.pyiceberg.load_view((ns, "for_others"))
    [representation] = view.metadata.versions[-1].representations
    assert representation.root.dialect == "duckdb"
    assert representation.root.sql == f"SELECT id, upper(email) AS loud FROM {ns}.people"
    assert [f.name for f in view.metadata.schemas[-1].fields] == ["id", "loud"]


def test_a_bare_count_of_a_view_counts_the_views_rows_not_its_tables(views_setup: Setup) -> None:
    """``SELECT count(*) FROM view`` has the shape of a bare table count, but the view's table is not its rows."""
    ns = views_setup.namespace
    with sqe.api.connect(views_setup.definer) as session:
        session.sql(f"CREATE VIEW {ns}.first_two AS SELECT id FROM {ns}.people ORDER BY id LIMIT 2")
        session.sql(f"CREATE VIEW {ns}.even AS SELECT id FROM {ns}.people WHERE id % 2 = 0")
        assert session.sql(f"SELECT count(*) FROM {ns}.first_two").fetchall() == [(2,)]
        assert session.last_execution_path != "metadata"
        assert session.sql(f"SELECT count(*) FROM {ns}.even").fetchall() == [(2,)]
        assert session.sql(f"SELECT count(*) FROM {ns}.people").fetchall() == [(PEOPLE.num_rows,)]
        assert session.last_execution_path == "metadata"  # the table itself still answers from metadata
