"""A prepared statement asks the catalog at every execution, as a plain statement does.

Its plan from prepare time holds the table as the catalog answered then (metadata, read-restrictions, vended
credentials). Executing that plan again would apply the old answer: restrictions set since would not apply, a
revoked grant would still read (from the process caches, with no storage request at all), and a bare count(*) or
a metadata table would come from raw statistics of a table that is now restricted. Each case below changes the
catalog's answer between two executions of one prepared statement and expects what a plain statement gets.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import sqe.api
from sqe.errors import PermissionDeniedError, RestrictedTableError
from tests.conftest import CatalogPrincipal, CatalogServer, pyiceberg_catalog, write_sqe_config
from tests.e2e.test_engine_governed import PEOPLE, RULES

pytestmark = [pytest.mark.e2e]

RAW = [(1, "a@x.org"), (2, "b@y.org"), (3, "c@z.org"), (4, "d@w.org")]
RESTRICTED = [(1, "x@x.xxx"), (3, "x@x.xxx"), (4, "x@x.xxx")]  # RULES: id 2 filtered out, emails masked


@dataclass
class World:
    server: CatalogServer
    namespace: str
    analyst: CatalogPrincipal
    config: Path
    rules: Path

    def table_args(self) -> list[str]:
        return ["--warehouse", self.server.warehouse, "--namespace", self.namespace, "--table", "people"]

    def restrict(self) -> None:
        self.server.admin_cli(
            "set-restrictions", *self.table_args(), "--principal", self.analyst.name, "--file", str(self.rules)
        )


@pytest.fixture()
def world(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    """A fresh table the analyst reads unrestricted, through SQE as a trusted reader (so restrictions can be set)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    suffix = uuid.uuid4().hex[:8]
    namespace = f"prep_{suffix}"
    analyst = catalog_server.create_principal(
        f"prep_analyst_{suffix}",
        role=f"prep_analyst_{suffix}_role",
        grants=[("TABLE_READ_DATA", None, None), ("NAMESPACE_LIST", None, None)],
    )
    reader = catalog_server.create_principal(f"prep_reader_{suffix}", reader=True)
    catalog = pyiceberg_catalog(catalog_server, engine_writer)
    catalog.create_namespace(namespace)
    catalog.create_table((namespace, "people"), schema=PEOPLE.schema).append(PEOPLE)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES), encoding="utf-8")
    config = write_sqe_config(
        tmp_path / "analyst.toml",
        catalog_server.url,
        analyst,
        catalog_server.moto,
        catalog={"reader_client_id": reader.client_id, "reader_client_secret": reader.client_secret},
    )
    yield World(catalog_server, namespace, analyst, config, rules)


def test_restrictions_set_after_prepare_apply_to_the_next_execution(world: World) -> None:
    with sqe.api.connect(world.config) as session:
        prepared = session.prepare(f"SELECT id, email FROM {world.namespace}.people ORDER BY id")
        assert prepared.execute().fetchall() == RAW
        world.restrict()
        assert prepared.execute().fetchall() == RESTRICTED
        assert session.sql(f"SELECT id, email FROM {world.namespace}.people ORDER BY id").fetchall() == RESTRICTED


def test_a_prepared_count_is_not_answered_from_manifests_once_a_row_filter_applies(world: World) -> None:
    with sqe.api.connect(world.config) as session:
        prepared = session.prepare(f"SELECT count(*) FROM {world.namespace}.people")
        assert prepared.execute().fetchall() == [(4,)]
        assert session.last_execution_path == "metadata"  # the case that must change: raw record counts
        world.restrict()
        assert prepared.execute().fetchall() == [(3,)]
        assert session.last_execution_path != "metadata"


def test_a_prepared_metadata_table_is_refused_once_the_table_is_restricted(world: World) -> None:
    with sqe.api.connect(world.config) as session:
        prepared = session.prepare(f'SELECT record_count, lower_bounds FROM {world.namespace}."people$files"')
        assert prepared.execute().fetchall()[0][0] == 4
        world.restrict()
        with pytest.raises(RestrictedTableError):
            prepared.execute().fetchall()


def test_a_grant_revoked_after_prepare_refuses_the_next_execution(world: World) -> None:
    role = f"{world.analyst.name}_role"
    with sqe.api.connect(world.config) as session:
        prepared = session.prepare(f"SELECT id, email FROM {world.namespace}.people ORDER BY id")
        assert prepared.execute().fetchall() == RAW  # the process caches now hold these rows
        world.server.admin_cli("revoke", role, "TABLE_READ_DATA", "--warehouse", world.server.warehouse)
        try:
            with pytest.raises(PermissionDeniedError):
                prepared.execute().fetchall()
        finally:
            world.server.admin_cli("grant", role, "TABLE_READ_DATA", "--warehouse", world.server.warehouse)
        assert prepared.execute().fetchall() == RAW
