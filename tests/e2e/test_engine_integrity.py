"""SQE against the real ``sqe-catalog``'s integrity model: a 422 is never retried, and SQE never rereads
``metadata-location`` from storage (it uses only the metadata the catalog verified and put in the response).

The metadata file is tampered with in the bucket behind the catalog's back (the catalog's own S3 key, set-up
only); SQE itself holds vended credentials only (bogus ``AWS_*`` in the environment).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests

import sqe.api
from sqe.catalog.base import LoadedTable
from sqe.errors import IntegrityError
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.e2e.test_engine_cli import assert_one_line_error, run_sqe
from tests.helpers.fault_proxy import FaultProxy, running_proxy

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]


@dataclass(frozen=True)
class Setup:
    server: CatalogServer
    principal: CatalogPrincipal
    config: Path
    namespace: str


@pytest.fixture(scope="module")
def setup(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory
) -> Setup:
    namespace = f"eint_{uuid.uuid4().hex[:6]}"
    pyiceberg_catalog(catalog_server, engine_writer).create_namespace(namespace)
    config = write_sqe_config(
        tmp_path_factory.mktemp("eint") / "sqe.toml", catalog_server.url, engine_writer, catalog_server.moto
    )
    return Setup(catalog_server, engine_writer, config, namespace)


def s3_key(location: str) -> tuple[str, str]:
    bucket, _, key = location.removeprefix("s3://").partition("/")
    return bucket, key


def read_stored(server: CatalogServer, location: str) -> dict[str, Any]:
    bucket, key = s3_key(location)
    document: dict[str, Any] = json.loads(server.moto.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
    return document


def put_stored(server: CatalogServer, location: str, document: dict[str, Any]) -> None:
    bucket, key = s3_key(location)
    server.moto.client("s3").put_object(Bucket=bucket, Key=key, Body=json.dumps(document).encode())


def catalog_location(setup: Setup, name: str) -> str:
    """The table's current metadata location, as the catalog answers it (raw REST as the SQE principal)."""
    server = setup.server
    response = requests.get(
        f"{server.url}/v1/{server.warehouse}/namespaces/{setup.namespace}/tables/{name}",
        headers={"Authorization": f"Bearer {server.token(setup.principal)}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["metadata-location"])


def create_encrypted(setup: Setup, name: str) -> str:
    """A protected encrypted table (format v3, ``encryption.key-id`` K1), created over raw REST."""
    server = setup.server
    schema = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "n", "type": "long", "required": False}]}
    body = {"name": name, "schema": schema, "properties": {"format-version": "3", "encryption.key-id": "K1"}}
    response = requests.post(
        f"{server.url}/v1/{server.warehouse}/namespaces/{setup.namespace}/tables",
        headers={"Authorization": f"Bearer {server.token(setup.principal)}"},
        json=body,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["metadata-location"])


def load_lines(
    server: CatalogServer, namespace: str, name: str, status: int | None = None, *, log: str | None = None
) -> int:
    """How many load-table requests for the table the catalog logged (its one debug line per request)."""
    code = r"\d+" if status is None else str(status)
    pattern = re.compile(rf"GET /v1/{server.warehouse}/namespaces/{namespace}/tables/{name} -> {code} ")
    return len(pattern.findall(server.log_text() if log is None else log))


def settled_load_lines(server: CatalogServer, namespace: str, name: str, status: int | None = None) -> int:
    """``load_lines`` once the catalog has written the line of the last request (it logs after answering)."""
    return load_lines(server, namespace, name, status, log=server.settled_log_text())


def assert_no_secret(server: CatalogServer, principal: CatalogPrincipal, *texts: str) -> None:
    for text in texts:
        for secret in {*server.secrets, principal.client_secret}:
            assert secret not in text


# ---------------------------------------------------------------------------------------------------------
# A 422 from the real catalog is one typed, one-line IntegrityError, and SQE sends exactly one load for it


def _add_key_id(document: dict[str, Any]) -> None:
    document["properties"]["encryption.key-id"] = "K1"


def _add_column(document: dict[str, Any]) -> None:
    fields = document["schemas"][0]["fields"]
    fields.append(dict(fields[0], id=99, name="extra"))


@pytest.mark.parametrize(
    ("kind", "change", "reason"),
    [
        pytest.param("plaintext", _add_key_id, "encryption.key-id", id="plaintext-key-id-added"),
        pytest.param("encrypted", _add_column, "trusted digest", id="encrypted-schema-changed"),
    ],
)
def test_integrity_422_from_the_real_catalog_is_typed_and_loaded_once(
    setup: Setup, kind: str, change: Callable[[dict[str, Any]], None], reason: str
) -> None:
    server, namespace, name = setup.server, setup.namespace, f"tampered_{kind}"
    with sqe.api.connect(setup.config) as session:
        if kind == "plaintext":
            session.sql(f"CREATE TABLE {namespace}.{name} AS SELECT * FROM (VALUES (1), (2)) v(n)")
            assert session.sql(f"SELECT count(*) FROM {namespace}.{name}").fetchall() == [(2,)]
            location = catalog_location(setup, name)
        else:
            location = create_encrypted(setup, name)
        document = read_stored(server, location)
        change(document)
        put_stored(server, location, document)
        before = settled_load_lines(server, namespace, name)
        # the same session (its metadata cache holds the verified revision): the catalog checks before any 304
        with pytest.raises(IntegrityError) as caught:
            session.sql(f"SELECT * FROM {namespace}.{name}")
    message = str(caught.value)
    assert caught.value.status == 422 and reason in message and "not retried" in message
    assert "\n" not in message and "Traceback" not in message
    assert settled_load_lines(server, namespace, name) == before + 1, "one load request, never retried"
    assert load_lines(server, namespace, name, 422) == 1

    run = run_sqe("--config", str(setup.config), "-e", f"SELECT * FROM {namespace}.{name}")
    line = assert_one_line_error(run)
    assert reason in line and "422" in line, line
    assert settled_load_lines(server, namespace, name, 422) == 2, "the CLI, too, sent exactly one load"
    assert_no_secret(server, setup.principal, message, run.stdout, run.stderr)
    assert server.secrets, "the secrets check above searched for something"


# ---------------------------------------------------------------------------------------------------------
# SQE never rereads metadata-location: a proxy points the load response's metadata-location elsewhere (a decoy
# revision with a renamed column and an older snapshot, or an object that does not exist) and leaves the
# catalog's verified inline metadata untouched; SQE's answers must follow that metadata.


@pytest.fixture(scope="module")
def proxy(catalog_server: CatalogServer) -> Iterator[FaultProxy]:
    with running_proxy(catalog_server.url) as proxy:
        yield proxy


def _decoy(setup: Setup, location: str) -> str:
    """A readable metadata file under the table's own prefix that disagrees with the catalog: column ``n`` is
    ``decoy`` and the current snapshot is the first one (one row fewer). The catalog never points at it."""
    document = read_stored(setup.server, location)
    for schema in document["schemas"]:
        for field in schema["fields"]:
            if field["name"] == "n":
                field["name"] = "decoy"
    first = min(document["snapshots"], key=lambda s: s["sequence-number"])["snapshot-id"]
    document["current-snapshot-id"] = first
    document["refs"] = {"main": {"snapshot-id": first, "type": "branch"}}
    decoy = f"{document['location']}/metadata/decoy-{uuid.uuid4().hex}.metadata.json"
    put_stored(setup.server, decoy, document)
    return decoy


@pytest.mark.parametrize("target", ["decoy", "missing"])
def test_sqe_uses_the_response_metadata_never_the_metadata_location(
    setup: Setup, proxy: FaultProxy, tmp_path: Path, target: str
) -> None:
    namespace, name = setup.namespace, f"pointer_{target}"
    with sqe.api.connect(setup.config) as direct:
        direct.sql(f"CREATE TABLE {namespace}.{name} AS SELECT * FROM (VALUES (1), (2)) v(n)")
        direct.sql(f"INSERT INTO {namespace}.{name} VALUES (3)")
    location = catalog_location(setup, name)
    if target == "decoy":
        elsewhere = _decoy(setup, location)
    else:
        elsewhere = f"{location.rsplit('/', 1)[0]}/missing-{uuid.uuid4().hex}.metadata.json"
    table_path = re.compile(rf"^/v1/wh/namespaces/{namespace}/tables/{name}(\?|$)")

    def repoint(method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if method == "GET" and table_path.search(path) and "metadata-location" in body:
            body["metadata-location"] = elsewhere
        return body

    proxy.rewrite = repoint
    try:
        config = write_sqe_config(tmp_path / "proxied.toml", proxy.url, setup.principal, setup.server.moto)
        with sqe.api.connect(config) as session:
            result = session.sql(f"SELECT * FROM {namespace}.{name} ORDER BY n")
            assert result.fetchall() == [(1,), (2,), (3,)], "the catalog's snapshot, not the file's"
            [stream] = session.last_streams
            loaded: LoadedTable = stream.plan.loaded
            assert loaded.raw["metadata-location"] == elsewhere, "SQE really received the other pointer"
            assert [f.name for f in loaded.table.schema().fields] == ["n"], "the catalog's schema, not the file's"
            # a write plans from the same metadata (its parent snapshot, manifests): it must not reread either
            session.sql(f"INSERT INTO {namespace}.{name} VALUES (4)")
            assert session.sql(f"SELECT sum(n) FROM {namespace}.{name}").fetchall() == [(10,)]
    finally:
        proxy.reset()
    assert catalog_location(setup, name) != location, "the insert committed through the catalog"
