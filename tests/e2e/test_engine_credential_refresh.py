"""Local scans refresh vended credentials that reach their usable point mid-scan, and never open a file with an
expired set: a refused or narrower refresh fails the read with a typed error.

A catalog vends 4-second credentials (usable for about 2 s); SQE talks to it through a counting, fault-injecting
proxy (``tests/helpers/fault_proxy.py``). Real lifetimes and real sleeps, no clock patching.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import sqe.api
from sqe.catalog.base import LoadedTable, TableIdent
from sqe.catalog.rest import RestTableProvider
from sqe.config import load_config
from sqe.errors import CredentialError, PermissionDeniedError
from sqe.vocabulary import S3_ACCESS_KEY_ID
from tests.conftest import catalog_variant, pyiceberg_catalog, restartable_catalog, write_sqe_config
from tests.helpers.fault_proxy import FaultProxy, running_proxy

if TYPE_CHECKING:
    from tests.conftest import CatalogServer, MotoServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

LIFETIME_SECONDS = 4
CREDENTIALS = r"^/v1/wh/namespaces/ns/tables/t/credentials$"


@pytest.fixture(scope="module")
def short_catalog(tmp_path_factory: pytest.TempPathFactory, moto_server: MotoServer) -> Iterator[CatalogServer]:
    workdir = tmp_path_factory.mktemp("local-refresh")
    with catalog_variant(
        workdir, moto_server, credential_lifetime_seconds=LIFETIME_SECONDS, location="s3://warehouse/localrefresh"
    ) as server:
        pyiceberg_catalog(server, server.admin).create_namespace("ns")
        path = write_sqe_config(workdir / "owner.toml", server.url, server.admin, server.moto)
        with sqe.api.connect(path) as session:
            session.sql("CREATE TABLE ns.t AS SELECT * FROM (VALUES (1, 'a'), (2, 'b')) v(id, tag)")
            session.sql("INSERT INTO ns.t VALUES (3, 'c')")
        yield server


@pytest.fixture()
def proxy(short_catalog: CatalogServer) -> Iterator[FaultProxy]:
    with running_proxy(short_catalog.url) as proxy:
        yield proxy


@pytest.fixture()
def config_path(short_catalog: CatalogServer, proxy: FaultProxy, tmp_path: Path) -> Path:
    return write_sqe_config(tmp_path / "sqe.toml", proxy.url, short_catalog.admin, short_catalog.moto)


def _loaded(provider: RestTableProvider) -> tuple[LoadedTable, list[str]]:
    loaded = provider.load_table(TableIdent("wh", ("ns",), "t"))
    files = [task.file.file_path for task in loaded.table.scan().plan_files()]
    return loaded, files


def _sleep_past_expiry(loaded: LoadedTable, path: str) -> str:
    """Waits until the set ``path`` resolves to has expired; returns its access key id."""
    before = loaded.io.resolve(path)  # type: ignore[attr-defined]
    assert before.source == "vended" and before.expires_at is not None
    time.sleep(max(0.0, before.expires_at - time.time()) + 0.3)
    return str(before.properties[S3_ACCESS_KEY_ID])


def test_a_file_opened_after_expiry_reads_with_refreshed_credentials(config_path: Path, proxy: FaultProxy) -> None:
    provider = RestTableProvider(load_config(config_path, env={}))
    try:
        loaded, files = _loaded(provider)
        old_key = _sleep_past_expiry(loaded, files[0])
        with loaded.io.new_input(files[0]).open() as stream:
            assert stream.read(4) == b"PAR1"
        after = loaded.io.resolve(files[0])  # type: ignore[attr-defined]
        assert after.properties[S3_ACCESS_KEY_ID] != old_key  # the read used a new set, not the expired one
        assert after.expires_at is not None and after.expires_at > time.time()
        assert proxy.count("GET", CREDENTIALS) >= 1  # refreshed through the credentials endpoint
    finally:
        provider.close()


def test_a_scan_that_outlives_its_credentials_refreshes_them(config_path: Path, proxy: FaultProxy) -> None:
    with sqe.api.connect(config_path) as session:
        result = session.sql("SELECT sum(id) FROM ns.t WHERE tag <> 'z'")  # planned now, files read on fetch
        [stream] = session.last_streams
        loaded = stream.plan.loaded
        _sleep_past_expiry(loaded, loaded.table.location())
        assert result.fetchall() == [(6,)]
        assert proxy.count("GET", CREDENTIALS) >= 1


def test_a_refused_refresh_fails_the_read(config_path: Path, proxy: FaultProxy) -> None:
    provider = RestTableProvider(load_config(config_path, env={}))
    try:
        loaded, files = _loaded(provider)
        _sleep_past_expiry(loaded, files[0])
        proxy.inject("GET", CREDENTIALS, 403, 1)  # e.g. the grant was revoked meanwhile
        with pytest.raises(PermissionDeniedError):
            loaded.io.new_input(files[0])
    finally:
        provider.close()


def test_a_narrower_refresh_fails_the_read(config_path: Path, proxy: FaultProxy) -> None:
    def narrower(method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path.endswith("/credentials"):
            for entry in body.get("storage-credentials", []):
                entry["prefix"] = entry["prefix"].rstrip("/") + "/metadata-only"
        return body

    provider = RestTableProvider(load_config(config_path, env={}))
    try:
        loaded, files = _loaded(provider)
        _sleep_past_expiry(loaded, files[0])
        proxy.rewrite = narrower
        with pytest.raises(CredentialError, match="refresh returned no credentials"):
            loaded.io.new_input(files[0])
    finally:
        provider.close()


def test_a_scan_whose_refresh_is_refused_fails_with_the_typed_error(config_path: Path, proxy: FaultProxy) -> None:
    with sqe.api.connect(config_path) as session:
        result = session.sql("SELECT sum(id) FROM ns.t WHERE tag <> 'z'")
        [stream] = session.last_streams
        loaded = stream.plan.loaded
        _sleep_past_expiry(loaded, loaded.table.location())
        proxy.inject("GET", CREDENTIALS, 403, 1)
        with pytest.raises(PermissionDeniedError):
            result.fetchall()


def test_the_credentials_endpoint_fetches_a_new_token_when_the_catalog_refuses_the_old_one(
    tmp_path: Path, moto_server: MotoServer
) -> None:
    """A catalog restarted with another signing key refuses every token issued before (401): a refresh through
    the credentials endpoint, and a view or scan-planning call, asks for a new token once, as a table load does,
    instead of failing."""
    warehouse = {"credential_lifetime_seconds": 3600, "location": "s3://warehouse/refreshkey"}
    with restartable_catalog(tmp_path, moto_server, warehouse) as (server, restart):
        pyiceberg_catalog(server, server.admin).create_namespace("ns")
        path = write_sqe_config(tmp_path / "sqe.toml", server.url, server.admin, server.moto)
        with sqe.api.connect(path) as session:
            session.sql("CREATE TABLE ns.t AS SELECT 1 AS id")
        provider = RestTableProvider(load_config(path, env={}))
        try:
            ident = TableIdent("wh", ("ns",), "t")
            assert provider.load_table_credentials(ident) is not None  # a token is issued and cached
            restart(new_signing_key=True)
            found = provider.load_table_credentials(ident)
            assert found is not None and found.sets
            restart(new_signing_key=True)  # the raw JSON calls (views, scan planning) do the same
            assert provider.list_views("wh", ("ns",)) == []
        finally:
            provider.close()


def test_the_files_of_a_server_side_plan_refresh_like_the_tables_own(config_path: Path, proxy: FaultProxy) -> None:
    provider = RestTableProvider(load_config(config_path, env={}))
    try:
        loaded, files = _loaded(provider)
        planning = provider.scan_planning("wh")
        assert planning is not None  # sqe-catalog plans scans
        plan_io = planning.file_io_for_plan(loaded, loaded.raw["storage-credentials"])
        old_key = _sleep_past_expiry(loaded, files[0])
        with plan_io.new_input(files[0]).open() as stream:
            assert stream.read(4) == b"PAR1"
        assert plan_io.resolve(files[0]).properties[S3_ACCESS_KEY_ID] != old_key  # type: ignore[attr-defined]
        assert proxy.count("GET", CREDENTIALS) >= 1
    finally:
        provider.close()
