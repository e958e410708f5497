"""A location the user (or a catalog) names may carry a credential: a URL's password (``http://u:PASS@host``), a
presigned URL's signature, a SAS ``sig=``. Whatever SQE or DuckDB says about such a location, through the Python
API and the ``sqe`` CLI, names the location with the credential replaced, never the credential.

Real engine against the shared moto + sqe-catalog; the only URLs outside them are on 127.0.0.1 at a closed port.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import sqe.api
from sqe.errors import SQEError
from sqe.session import Session
from tests.conftest import BOGUS_AWS_ENV, free_loopback_port, write_sqe_config

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

SQE = Path(sys.executable).parent / "sqe"
PASSWORD = "Pw9userinfoSECRET"
SIGNATURE = "f00dSig4ture0123456789abcdef"
CREDENTIAL = "AKIAQUERYCREDENTIAL1"
SESSION_TOKEN = "FwoGZXIvYXdzSessionTokenSECRET"
SAS = "sasSIGsecretXYZ%3D"
BEARER = "tokParamSECRET42"
SECRETS = (PASSWORD, SIGNATURE, CREDENTIAL, SESSION_TOKEN, SAS, BEARER)


def locations(port: int) -> dict[str, str]:
    """One location per credential form, each at a closed loopback port."""
    host = f"127.0.0.1:{port}"
    presigned = (
        f"https://{host}/bucket/k.parquet?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={CREDENTIAL}%2F20260101"
        f"%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Security-Token={SESSION_TOKEN}&X-Amz-Signature={SIGNATURE}"
    )
    return {
        "userinfo": f"http://alice:{PASSWORD}@{host}/x.csv",
        "presigned": presigned,
        "sas": f"https://{host}/container/x.json?sv=2020-08-04&sig={SAS}",
        "token": f"http://{host}/x.parquet?token={BEARER}",
        "file": f"file://alice:{PASSWORD}@{host}/x.csv",
    }


@pytest.fixture(scope="module")
def config(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    moto = catalog_server.moto
    return write_sqe_config(
        tmp_path_factory.mktemp("secrets") / "sqe.toml",
        catalog_server.url,
        engine_writer,
        moto,
        catalog={"require_vended_credentials": False},
        storage={"access_key_id": moto.access_key_id, "secret_access_key": moto.secret_access_key},
    )


def assert_no_secret(text: str) -> None:
    leaked = [secret for secret in SECRETS if secret in text]
    assert leaked == [], text


def failure(session: Session, sql: str) -> str:
    with pytest.raises(SQEError) as caught:
        session.sql(sql).arrow()
    return f"{caught.value} {caught.value!r} {caught.value.args!r}"


STATEMENTS = {
    "read_csv": "SELECT * FROM read_csv('{url}')",
    "read_parquet": "SELECT * FROM read_parquet(['{url}'])",
    "read_json": "SELECT * FROM read_json('{url}')",
    "explain": "EXPLAIN SELECT * FROM read_parquet('{url}')",
    "iceberg_scan": "SELECT * FROM iceberg_scan('{url}')",
    "glob": "SELECT * FROM glob('{url}')",
    "attach": "ATTACH '{url}' AS remote",
    "copy": "COPY (SELECT 1) TO '{url}'",
    "from-string": "SELECT * FROM '{url}'",
    "syntax": "SELEC * FROM read_csv('{url}')",
    "external-table": "CREATE EXTERNAL TABLE ext_secret.t (id BIGINT) STORED AS PARQUET LOCATION '{url}'",
}


# The statements whose error quotes the location (SQE's own check, or DuckDB's refusal passed through).
QUOTING = ("read_csv", "read_parquet", "read_json", "explain", "glob", "from-string")


@pytest.mark.parametrize("form", ["userinfo", "presigned", "sas", "token", "file"])
@pytest.mark.parametrize("statement", list(STATEMENTS))
def test_errors_name_a_location_without_its_credential(
    config: Path, caplog: pytest.LogCaptureFixture, form: str, statement: str
) -> None:
    caplog.set_level(logging.DEBUG)
    url = locations(free_loopback_port())[form]
    with sqe.api.connect(config) as session:
        text = failure(session, STATEMENTS[statement].format(url=url))
    assert_no_secret(text)
    assert_no_secret(caplog.text)
    if statement in QUOTING:  # the location is still named, so the error says which one it means
        assert "127.0.0.1" in text and "***" in text, text
    if form == "file" and statement.startswith(("read_", "explain")):  # SQE's own check names it as written
        assert f"file://alice:***@{url.split('@')[1]}" in text, text


def test_cli_error_line_hides_the_credential(config: Path) -> None:
    url = locations(free_loopback_port())["userinfo"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SQE_", "AWS_"))}
    env.update(BOGUS_AWS_ENV)
    for debug in ((), ("--debug",)):
        done = subprocess.run(
            [str(SQE), "--config", str(config), *debug, "-e", f"SELECT * FROM read_csv('{url}')"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        assert done.returncode != 0
        assert "sqe: error: " in done.stderr and "http://alice:***@127.0.0.1" in done.stderr, done.stderr
        assert_no_secret(done.stdout + done.stderr)


def test_catalog_uri_credentials_stay_out_of_errors_reprs_and_logs(
    tmp_path: Path, engine_writer: CatalogPrincipal, catalog_server: CatalogServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A token parameter in the catalog's uri is hidden wherever the uri shows; a user and password are refused when
    the config loads (never sent as credentials, a token request through such a uri would send them as HTTP Basic)."""
    caplog.set_level(logging.DEBUG)
    uri = f"http://127.0.0.1:{free_loopback_port()}/api/catalog?token={BEARER}"
    config = write_sqe_config(tmp_path / "sqe.toml", uri, engine_writer, catalog_server.moto)
    with sqe.api.connect(config) as session:
        assert session.config is not None
        shown = f"{session.config!r} {session.config} {session.config.catalog.connection()!r}"
        error = failure(session, "SELECT * FROM ns.t")
    assert "CatalogUnavailableError" in error, error
    assert "uri='http://127.0.0.1" in shown and "?token=***" in shown, shown
    for text in (shown, error, caplog.text):
        assert_no_secret(text)
    with_password = uri.replace("://", f"://alice:{PASSWORD}@", 1)
    refused = write_sqe_config(tmp_path / "userinfo.toml", with_password, engine_writer, catalog_server.moto)
    with pytest.raises(SQEError) as caught:
        sqe.api.connect(refused)
    assert str(caught.value).startswith("catalog.uri: must not hold a user name or password"), caught.value
    assert_no_secret(f"{caught.value!r}")
    bad = write_sqe_config(tmp_path / "bad.toml", uri.replace("http", "ftp", 1), engine_writer, catalog_server.moto)
    with pytest.raises(SQEError) as caught:
        sqe.api.connect(bad)
    assert "catalog.uri" in str(caught.value)
    assert_no_secret(f"{caught.value!r}")


def test_flight_server_errors_and_log_hide_the_credential(
    catalog_server: CatalogServer, catalog_reader: CatalogPrincipal, tmp_path: Path
) -> None:
    import adbc_driver_flightsql.dbapi as dbapi

    from tests.e2e.test_server import _reader_settings, _write_configs, start_server
    from tests.helpers.processes import stop_child

    user = catalog_server.principal_with_grants(f"loc_secret_{tmp_path.name[-6:]}", [])
    config = _write_configs(tmp_path, catalog_server, coordinator=None, **_reader_settings(catalog_reader))
    proc, port = start_server(tmp_path, config)
    errors = []
    try:
        headers = {"adbc.flight.sql.authorization_header": f"Bearer {catalog_server.token(user)}"}
        with dbapi.connect(f"grpc://127.0.0.1:{port}", db_kwargs=headers, autocommit=True) as conn:
            for url in locations(free_loopback_port()).values():
                for sql in (f"SELECT * FROM read_csv('{url}')", f"SELECT * FROM glob('{url}')"):
                    with conn.cursor() as cur, pytest.raises(dbapi.Error) as caught:
                        cur.execute(sql)
                    errors.append(str(caught.value))
    finally:
        stop_child(proc)
    assert len(errors) == 10 and all("127.0.0.1" in e and "***" in e for e in errors), errors
    assert "DEBUG" in (tmp_path / "server.log").read_text()
    assert_no_secret(" ".join(errors) + (tmp_path / "server.log").read_text())


def test_duckdb_error_text_in_debug_log_hides_the_credential(config: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A binder error on a narrowed scan is logged before SQE plans again; its text quotes the statement."""
    caplog.set_level(logging.DEBUG)
    namespace = f"loc_{uuid.uuid4().hex[:6]}"
    url = locations(free_loopback_port())["userinfo"]
    with sqe.api.connect(config) as session:
        session.sql(f"CREATE SCHEMA {namespace}")
        session.sql(f"CREATE TABLE {namespace}.t AS SELECT 1 AS id, 'a' AS name")
        error = failure(session, f'SELECT "{url}" FROM {namespace}.t')
    assert "Binder Error" in error and "http://alice:***@127.0.0.1" in error, error
    assert "re-planning with every column" in caplog.text and "http://alice:***@127.0.0.1" in caplog.text
    assert_no_secret(error + caplog.text)


JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.jwtSIGsecret42"


TOKEN_STATEMENTS = [
    f"SELECT CAST('Bearer {JWT}' AS INTEGER)",  # Conversion Error
    f"SELECT 'Authorization: Bearer {JWT}'::DATE",
    "SELECT CAST('http://alice:jwtSIG''secret42@127.0.0.1/x' AS INTEGER)",  # a password with a quote, echoed
    f"SELECT CAST('{JWT}' AS INTEGER)",
    f'SELECT "Bearer {JWT}"',  # Binder Error: the identifier quoted
    f"""SELECT CAST('{{"access_token": "{JWT}", "token_type": "bearer"}}' AS INTEGER)""",
]


@pytest.mark.parametrize("sql", TOKEN_STATEMENTS)
def test_duckdb_errors_quoting_a_token_in_a_string_hide_it(config: Path, sql: str) -> None:
    """DuckDB's Conversion and Binder errors echo a string whole: a bearer token, a JWT or a URL's password in it
    is taken out."""
    with sqe.api.connect(config) as session:
        text = failure(session, sql)
    assert "Error" in text and "***" in text, text
    assert "jwtSIG" not in text and "secret42" not in text and "eyJzdWIi" not in text, text


def test_storage_endpoint_with_userinfo_is_refused_without_echo(
    tmp_path: Path, engine_writer: CatalogPrincipal, catalog_server: CatalogServer
) -> None:
    """S3 requests are signed with the key pair, so a password in the endpoint is never used: it would only be
    carried into the credential policy and every FileIO's settings (and their reprs)."""
    endpoint = f"http://bob:{PASSWORD}@127.0.0.1:{free_loopback_port()}"
    moto = catalog_server.moto
    config = write_sqe_config(
        tmp_path / "sqe.toml", catalog_server.url, engine_writer, moto, storage={"endpoint": endpoint}
    )
    with pytest.raises(SQEError) as caught:
        sqe.api.connect(config)
    assert "storage.endpoint" in str(caught.value) and "password" in str(caught.value), caught.value
    assert_no_secret(f"{caught.value!r}")
