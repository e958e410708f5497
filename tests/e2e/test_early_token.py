"""A session's first catalog token (``sqe.catalog._early_token``) against the real sqe-catalog, through a counting
proxy: requested while the REST client is still being imported, used by that client (never fetched twice), and a
refusal raised typed, as before.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import sqe.api
from sqe.errors import AuthenticationError
from tests.conftest import write_sqe_config
from tests.helpers.fault_proxy import FaultProxy

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

TOKENS = r"^/v1/oauth/tokens$"
MARKER = "/__test_marker__/rest-client-imported"

# A fresh interpreter (the REST client not imported yet) runs one statement naming a table; when the client's
# module has finished importing, it sends MARKER through the proxy, so the proxy's request order shows whether
# the token request came before the end of that import.
_FIRST_STATEMENT = textwrap.dedent(
    """
    import importlib.abc, importlib.machinery, sys, urllib.error, urllib.request
    proxy, config, table = sys.argv[1:4]

    class AfterImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "sqe.catalog.rest":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                try:
                    urllib.request.urlopen(proxy + "MARKER", timeout=10)
                except urllib.error.HTTPError:
                    pass  # the catalog has no such route: only the proxy's record of it counts

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, AfterImport())
    import sqe.api
    with sqe.api.connect(config) as session:
        print(session.sql(f"SELECT count(*) FROM {table}").fetchall())
    """
).replace("MARKER", MARKER)


@pytest.fixture
def proxy(catalog_server: CatalogServer) -> Iterator[FaultProxy]:
    counting = FaultProxy(catalog_server.url)
    counting.start()
    try:
        yield counting
    finally:
        counting.stop()


@pytest.fixture(scope="module")
def table(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory
) -> str:
    name = f"early_{uuid.uuid4().hex[:6]}.t"
    path = write_sqe_config(
        tmp_path_factory.mktemp("early") / "w.toml", catalog_server.url, engine_writer, catalog_server.moto
    )
    with sqe.api.connect(path) as session:
        session.sql(f"CREATE SCHEMA {name.split('.')[0]}")
        session.sql(f"CREATE TABLE {name} AS SELECT * FROM range(5) t(a)")
    return name


def test_the_token_is_requested_while_the_client_imports_and_the_client_uses_it(
    tmp_path: Path, catalog_server: CatalogServer, engine_writer: CatalogPrincipal, proxy: FaultProxy, table: str
) -> None:
    config = write_sqe_config(tmp_path / "c.toml", proxy.url, engine_writer, catalog_server.moto)
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_STATEMENT, proxy.url, str(config), table],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[(5,)]"
    paths = [path for _, path in proxy.received]
    assert paths.count("/v1/oauth/tokens") == 1  # the client's first request used the token fetched early
    assert paths.index("/v1/oauth/tokens") < paths.index(MARKER)  # asked for before the client had imported
    assert engine_writer.client_secret not in done.stdout + done.stderr


def test_a_refused_client_is_an_authentication_error_after_one_token_request(
    tmp_path: Path, catalog_server: CatalogServer, engine_writer: CatalogPrincipal, proxy: FaultProxy, table: str
) -> None:
    config = write_sqe_config(
        tmp_path / "bad.toml", proxy.url, engine_writer, catalog_server.moto, catalog={"client_secret": "not-it"}
    )
    with sqe.api.connect(config) as session, pytest.raises(AuthenticationError, match="HTTP 401") as refused:
        session.sql(f"SELECT count(*) FROM {table}").fetchall()
    assert engine_writer.client_id in str(refused.value) and "not-it" not in str(refused.value)
    assert proxy.count("POST", TOKENS) == 1  # refused once: the early request, not repeated by the client
