"""SQE as a trusted reader, end to end: ``[catalog] reader_client_id/secret`` against the real catalog on moto.

``analyst`` has read-restrictions on ``people`` (a row filter and a mask); ``open`` has none. Through SQE with the
reader configured the analyst sees filtered, masked rows; with the same config but no reader the catalog refuses
with the typed 403 and SQE returns nothing. The engine does the RFC 8693 exchange itself: a catalog variant with a
3-second token lifetime shows a session outliving its delegated token (the exchanges counted in the catalog's
audit lines), and revoking the reader status or the grant mid-session fails the next query closed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

import sqe.api
from sqe.errors import AuthenticationError, PermissionDeniedError, SQEError
from sqe.session import Session
from tests.conftest import (
    CatalogPrincipal,
    CatalogServer,
    pyiceberg_catalog,
    restartable_catalog,
    write_sqe_config,
)

if TYPE_CHECKING:
    from tests.conftest import MotoServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REFUSED = "the catalog only serves this table through a trusted reader"
PEOPLE = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "email": ["a@x.org", "b@y.org", "c@z.org", "d@w.org"]})
RULES = {
    "required-column-projections": [{"field-id": 2, "action": "mask-alphanum"}],
    "required-row-filter": {"type": "not-eq", "left": {"type": "reference", "id": 1}, "right": 2},
}
# A catalog access token: base64url JSON claims ("eyJ" = '{"'), a dot, a base64url signature.
TOKEN_SHAPE = re.compile(r"eyJ[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}")
SHORT_LIFETIME = 3


@dataclass
class Governed:
    server: CatalogServer
    namespace: str
    analyst: CatalogPrincipal
    reader: CatalogPrincipal
    suffix: str
    workdir: Path

    def config(self, name: str, *, reader: CatalogPrincipal | None = None, **catalog: object) -> Path:
        keys = dict(catalog)
        if reader is not None:
            keys |= {"reader_client_id": reader.client_id, "reader_client_secret": reader.client_secret}
        path = self.workdir / f"{name}.toml"
        return write_sqe_config(path, self.server.url, self.analyst, self.server.moto, catalog=keys)

    def people(self, session: Session) -> list[tuple[object, ...]]:
        return sorted(session.sql(f"SELECT id, email FROM {self.namespace}.people").fetchall())


def _with_grants(server: CatalogServer, name: str, *privileges: str) -> CatalogPrincipal:
    """A principal with role ``<name>_role`` holding warehouse-wide ``privileges``."""
    return server.create_principal(name, role=f"{name}_role", grants=[(p, None, None) for p in privileges])


def _set_up(server: CatalogServer, writer: CatalogPrincipal, workdir: Path) -> Governed:
    """Tables ``people`` (restricted for the analyst) and ``open``, an analyst with a read grant, a reader."""
    suffix = uuid.uuid4().hex[:6]
    namespace = f"engine_gov_{suffix}"
    analyst = _with_grants(server, f"eg_analyst_{suffix}", "TABLE_READ_DATA", "NAMESPACE_LIST")
    reader = server.create_principal(f"eg_engine_{suffix}", reader=True)
    catalog = pyiceberg_catalog(server, writer)
    catalog.create_namespace(namespace)
    for table in ("people", "open"):
        catalog.create_table((namespace, table), schema=PEOPLE.schema).append(PEOPLE)
    rules = workdir / "rules.json"
    rules.write_text(json.dumps(RULES), encoding="utf-8")
    target = ["--warehouse", server.warehouse, "--namespace", namespace, "--table", "people"]
    server.admin_cli("set-restrictions", *target, "--principal", analyst.name, "--file", str(rules))
    return Governed(server, namespace, analyst, reader, suffix, workdir)


@pytest.fixture()
def no_ambient_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads work only with vended credentials."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def governed(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory
) -> Governed:
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        return _set_up(catalog_server, engine_writer, tmp_path_factory.mktemp("engine_governed"))


def _masked(email: object) -> bool:
    return isinstance(email, str) and "@" in email and not any(c.isalnum() and c != "x" for c in email)


# ---------------------------------------------------------------------------------------------------------
# With and without the reader


def test_analyst_through_the_reader_sees_filtered_masked_rows(governed: Governed, no_ambient_aws: None) -> None:
    with sqe.api.connect(governed.config("with_reader", reader=governed.reader)) as session:
        rows = governed.people(session)
    assert [row[0] for row in rows] == [1, 3, 4]  # id 2 filtered out
    assert all(_masked(row[1]) for row in rows), rows
    assert not {"a@x.org", "c@z.org", "d@w.org"} & {row[1] for row in rows}


def test_without_the_reader_the_analyst_gets_the_typed_403_and_no_rows(
    governed: Governed, no_ambient_aws: None
) -> None:
    with sqe.api.connect(governed.config("own_token")) as session, pytest.raises(PermissionDeniedError) as caught:
        governed.people(session)
    assert REFUSED in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.status == 403
    assert "mask" not in str(caught.value) and "filter" not in str(caught.value)


@pytest.mark.parametrize("with_reader", [True, False], ids=["reader", "own-token"])
def test_an_unrestricted_table_works_both_ways(governed: Governed, no_ambient_aws: None, with_reader: bool) -> None:
    reader = governed.reader if with_reader else None
    with sqe.api.connect(governed.config(f"open_{with_reader}", reader=reader)) as session:
        rows = sorted(session.sql(f"SELECT id, email FROM {governed.namespace}.open").fetchall())
    assert rows == sorted(zip(PEOPLE.column("id").to_pylist(), PEOPLE.column("email").to_pylist(), strict=True))


def test_a_wrong_reader_secret_is_a_typed_authentication_error_naming_the_reader(
    governed: Governed, no_ambient_aws: None
) -> None:
    wrong = CatalogPrincipal(governed.reader.name, governed.reader.client_id, "not-the-reader-secret")
    with (
        sqe.api.connect(governed.config("wrong_reader", reader=wrong)) as session,
        pytest.raises(AuthenticationError) as caught,
    ):
        governed.people(session)
    assert governed.reader.client_id in str(caught.value) and "not-the-reader-secret" not in str(caught.value)


def test_a_non_reader_actor_is_refused_by_the_exchange_naming_user_and_reader(
    governed: Governed, no_ambient_aws: None
) -> None:
    impostor = governed.server.create_principal(f"eg_impostor_{governed.suffix}")
    with (
        sqe.api.connect(governed.config("impostor", reader=impostor)) as session,
        pytest.raises(AuthenticationError) as caught,
    ):
        governed.people(session)
    message = str(caught.value)
    assert "unauthorized_client" in message and "is not a reader" in message and "\n" not in message
    assert governed.analyst.client_id in message and impostor.client_id in message
    assert impostor.client_secret not in message and not TOKEN_SHAPE.search(message)


# ---------------------------------------------------------------------------------------------------------
# Revocation mid-session: the next query fails closed, never stale data


def test_reader_status_or_grant_revoked_mid_session_fails_the_next_query(
    governed: Governed, no_ambient_aws: None
) -> None:
    server = governed.server
    reader = server.create_principal(f"eg_engine2_{governed.suffix}", reader=True)
    role = f"{governed.analyst.name}_role"
    with sqe.api.connect(governed.config("revoked", reader=reader, metadata_cache=True)) as session:
        assert [row[0] for row in governed.people(session)] == [1, 3, 4]
        server.admin_cli("set-trusted-reader", reader.name, "false")
        try:
            with pytest.raises(PermissionDeniedError) as caught:
                governed.people(session)
            assert REFUSED in str(caught.value)
        finally:
            server.admin_cli("set-trusted-reader", reader.name, "true")
        assert [row[0] for row in governed.people(session)] == [1, 3, 4]  # trust restored: served again
        server.admin_cli("revoke", role, "TABLE_READ_DATA", "--warehouse", server.warehouse)
        try:
            with pytest.raises(PermissionDeniedError) as denied:
                governed.people(session)
            assert denied.value.status == 403 and "\n" not in str(denied.value)
        finally:
            server.admin_cli("grant", role, "TABLE_READ_DATA", "--warehouse", server.warehouse)


# ---------------------------------------------------------------------------------------------------------
# A session outliving its delegated token (real 3-second tokens), and secrets nowhere


@contextlib.contextmanager
def _short_token_catalog(workdir: Path, moto: MotoServer) -> Iterator[CatalogServer]:
    """Another ``sqe-catalog serve`` on ``moto`` whose access tokens live SHORT_LIFETIME seconds."""
    with restartable_catalog(workdir, moto, {}, token_lifetime_seconds=SHORT_LIFETIME) as (server, _restart):
        yield server


def _exchanges_for(server: CatalogServer, end_user: str) -> int:
    count = 0
    for line in server.log_text().splitlines():
        _, found, payload = line.partition("audit ")
        if found and payload.startswith("{"):
            event = json.loads(payload)
            count += event.get("event") == "token-exchange" and event.get("end_user") == end_user
    return count


def test_a_session_outlives_its_delegated_token_and_no_secret_or_token_leaks(
    catalog_server: CatalogServer,
    tmp_path: Path,
    no_ambient_aws: None,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _short_token_catalog(tmp_path / "short", catalog_server.moto) as short:
        writer = _with_grants(short, "eg_writer", "NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA")
        governed = _set_up(short, writer, tmp_path)
        path = governed.config("short", reader=governed.reader)
        caplog.set_level(logging.DEBUG)
        seen: list[str] = []
        with sqe.api.connect(path) as session:
            started = time.monotonic()
            for _ in range(3):
                assert [row[0] for row in governed.people(session)] == [1, 3, 4]
                time.sleep(SHORT_LIFETIME + 0.5)  # every delegated token of the last query has expired
            assert [row[0] for row in governed.people(session)] == [1, 3, 4]
            assert time.monotonic() - started > 3 * SHORT_LIFETIME
            seen.append(str(session.explain(f"SELECT email FROM {governed.namespace}.people").to_pylist()))
            seen.append(repr(session) + str(session.progress()))
        with (
            sqe.api.connect(governed.config("short_own")) as own,
            pytest.raises(SQEError) as refused,
        ):
            governed.people(own)
        seen.append(str(refused.value))
        exchanges = _exchanges_for(short, governed.analyst.name)
        assert exchanges >= 4, f"expected a re-exchange per expired token, the catalog logged {exchanges}"
        catalog_log = short.log_text()
        assert TOKEN_SHAPE.fullmatch(short.token(governed.analyst)), "the token pattern below must match tokens"
    captured = capsys.readouterr()
    seen += [caplog.text, captured.out, captured.err, catalog_log]
    everything = "\n".join(seen)
    secrets = (short.secrets | catalog_server.secrets) - {""}
    secrets |= {governed.analyst.client_secret, governed.reader.client_secret}
    assert not [s for s in secrets if s in everything], "a secret appears in logs, errors, EXPLAIN or reprs"
    assert not TOKEN_SHAPE.search(everything), "an access token appears in logs, errors, EXPLAIN or reprs"
