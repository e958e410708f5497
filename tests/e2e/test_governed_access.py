"""Governed access end to end: a restricted user cannot bypass SQE with pyiceberg; a trusted reader can act for it.

Real ``sqe-catalog serve`` on real moto (STS + S3, IAM auth on), pyiceberg's own ``RestCatalog`` as the bypassing
client. ``analyst`` has read-restrictions on ``people``; ``engine`` is a reader principal (no grants of its own);
``plain`` reads without restrictions. Delegated tokens come from the catalog's RFC 8693 token exchange.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
import pyarrow as pa
import pytest
import requests
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import ForbiddenError

from sqe.vocabulary import (
    ACCESS_DELEGATION_HEADER,
    ACCESS_TOKEN_TYPE,
    CAPABILITIES_HEADER,
    READ_RESTRICTIONS_V1,
    TOKEN_EXCHANGE_GRANT,
    VENDED_CREDENTIALS,
)
from sqe_catalog.auth import AuthStore, create_engine_for
from sqe_catalog.config import load_config
from tests.conftest import CatalogPrincipal, pyiceberg_catalog

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e

GOVERNED = {CAPABILITIES_HEADER: READ_RESTRICTIONS_V1, ACCESS_DELEGATION_HEADER: VENDED_CREDENTIALS}
REFUSED = "the catalog only serves this table through a trusted reader"
PEOPLE = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "email": ["a@x.org", "b@y.org", "c@z.org"]})
MASK_EMAIL = {"required-column-projections": [{"field-id": 2, "action": "mask-alphanum"}]}
SECRET_KEYS = ("s3.secret-access-key", "s3.session-token", "s3.access-key-id")


@dataclass
class Governed:
    server: CatalogServer
    namespace: str
    analyst: CatalogPrincipal
    plain: CatalogPrincipal
    engine: CatalogPrincipal
    suffix: str

    def url(self, table: str = "people", tail: str = "") -> str:
        return f"{self.server.url}/v1/{self.server.warehouse}/namespaces/{self.namespace}/tables/{table}{tail}"

    def get(self, token: str, tail: str = "", headers: dict[str, str] | None = None, table: str = "people") -> Any:
        auth = {"Authorization": f"Bearer {token}", **(headers or {})}
        reply = requests.get(self.url(table, tail), headers=auth, timeout=30)
        for credential in reply.json().get("storage-credentials", []) if reply.content else []:
            for key in SECRET_KEYS[:2]:
                self.server.secrets.add(credential["config"].get(key, ""))
        return reply

    def exchange(self, subject: str | None, actor: str | None, **extra: str) -> requests.Response:
        form: dict[str, str] = {"grant_type": TOKEN_EXCHANGE_GRANT}
        if subject is not None:
            form |= {"subject_token": subject, "subject_token_type": ACCESS_TOKEN_TYPE}
        if actor is not None:
            form |= {"actor_token": actor, "actor_token_type": ACCESS_TOKEN_TYPE}
        form |= extra  # last: a test may replace any field
        reply = requests.post(f"{self.server.url}/v1/oauth/tokens", data=form, timeout=30)
        if reply.status_code == 200:
            self.server.secrets.add(reply.json()["access_token"])
        return reply

    def delegated(self, user: CatalogPrincipal) -> str:
        reply = self.exchange(self.server.token(user), self.server.token(self.engine))
        assert reply.status_code == 200, reply.text
        return str(reply.json()["access_token"])


def _user(server: CatalogServer, name: str, *privileges: str) -> CatalogPrincipal:
    """A principal with role ``<name>_role`` holding warehouse-wide ``privileges``."""
    return server.create_principal(name, role=f"{name}_role", grants=[(p, None, None) for p in privileges])


@pytest.fixture(scope="module")
def governed(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Governed]:
    suffix = uuid.uuid4().hex[:6]
    namespace = f"governed_{suffix}"
    analyst = _user(catalog_server, f"analyst_{suffix}", "TABLE_READ_DATA", "NAMESPACE_LIST")
    plain = _user(catalog_server, f"plain_{suffix}", "TABLE_READ_DATA", "NAMESPACE_LIST")
    engine = catalog_server.create_principal(f"engine_{suffix}", reader=True)
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        writer = pyiceberg_catalog(catalog_server, engine_writer)
        writer.create_namespace(namespace)
        writer.create_table((namespace, "people"), schema=PEOPLE.schema).append(PEOPLE)
        writer.create_table((namespace, "open"), schema=PEOPLE.schema).append(PEOPLE)
    rules = tmp_path_factory.mktemp("governed") / "mask.json"
    rules.write_text(json.dumps(MASK_EMAIL), encoding="utf-8")
    target = ["--warehouse", catalog_server.warehouse, "--namespace", namespace, "--table", "people"]
    catalog_server.admin_cli("set-restrictions", *target, "--principal", analyst.name, "--file", str(rules))
    yield Governed(catalog_server, namespace, analyst, plain, engine, suffix)


def _carries_no_credential(reply: requests.Response) -> None:
    assert not any(key in reply.text for key in SECRET_KEYS), "no credential in a refused response"
    assert "metadata" not in reply.text and "mask" not in reply.text and "field-id" not in reply.text


# ---------------------------------------------------------------------------------------------------------
# The bypass, exactly as a new user would try it


def test_pyiceberg_with_the_analysts_own_token_and_copied_header_gets_403_and_no_credential(
    governed: Governed,
) -> None:
    bypass = RestCatalog(
        f"bypass-{governed.suffix}",
        uri=governed.server.url,
        warehouse=governed.server.warehouse,
        credential=governed.analyst.credential,
        scope="PRINCIPAL_ROLE:ALL",
        **{f"header.{name}": value for name, value in GOVERNED.items()},
    )
    with pytest.raises(ForbiddenError, match=REFUSED):
        bypass.load_table((governed.namespace, "people"))
    own = governed.server.token(governed.analyst)
    for tail in ("", "/credentials"):
        refused = governed.get(own, tail, GOVERNED)
        assert refused.status_code == 403 and refused.json()["error"]["message"] == REFUSED
        _carries_no_credential(refused)
    undeclared = governed.get(own, "", {ACCESS_DELEGATION_HEADER: VENDED_CREDENTIALS})
    assert undeclared.status_code == 406
    _carries_no_credential(undeclared)


def test_the_same_table_through_a_delegated_token_of_the_reader_is_served(governed: Governed) -> None:
    token = governed.delegated(governed.analyst)
    loaded = governed.get(token, "", GOVERNED)
    assert loaded.status_code == 200, loaded.text
    body = loaded.json()
    assert body["read-restrictions"] == MASK_EMAIL
    [credential] = body["storage-credentials"]
    assert all(credential["config"].get(key) for key in SECRET_KEYS)
    refreshed = governed.get(token, "/credentials", GOVERNED)
    assert refreshed.status_code == 200 and refreshed.json()["storage-credentials"][0]["config"]["s3.access-key-id"]
    # pyiceberg itself works with the delegated token (it is the reader's job to apply the restrictions).
    as_reader = RestCatalog(
        f"reader-{governed.suffix}",
        uri=governed.server.url,
        warehouse=governed.server.warehouse,
        token=token,
        **{f"header.{name}": value for name, value in GOVERNED.items()},
    )
    assert as_reader.load_table((governed.namespace, "people")).scan().to_arrow().num_rows == 3
    # The reader's own token reads nothing: it holds no grants, and the capability header grants nothing.
    assert governed.get(governed.server.token(governed.engine), "", GOVERNED).status_code == 403


def test_unrestricted_users_keep_plain_pyiceberg(governed: Governed) -> None:
    catalog = pyiceberg_catalog(governed.server, governed.plain)
    assert catalog.load_table((governed.namespace, "people")).scan().to_arrow().num_rows == 3
    analyst = pyiceberg_catalog(governed.server, governed.analyst)
    assert analyst.load_table((governed.namespace, "open")).scan().to_arrow().num_rows == 3, "not restricted there"


def test_the_role_session_name_names_the_end_user_and_the_reader(governed: Governed) -> None:
    loaded = governed.get(governed.delegated(governed.analyst), "", GOVERNED).json()
    config = loaded["storage-credentials"][0]["config"]
    moto = governed.server.moto
    sts = boto3.client(
        "sts",
        endpoint_url=moto.url,
        region_name=moto.region,
        aws_access_key_id=config["s3.access-key-id"],
        aws_secret_access_key=config["s3.secret-access-key"],
        aws_session_token=config["s3.session-token"],
    )
    arn = sts.get_caller_identity()["Arn"]
    assert arn.endswith(f"/sqe-{governed.analyst.name}={governed.engine.name}"), arn
    own = pyiceberg_catalog(governed.server, governed.plain).load_table((governed.namespace, "open"))
    own_sts = boto3.client(
        "sts",
        endpoint_url=moto.url,
        region_name=moto.region,
        aws_access_key_id=own.io.properties["s3.access-key-id"],
        aws_secret_access_key=own.io.properties["s3.secret-access-key"],
        aws_session_token=own.io.properties["s3.session-token"],
    )
    assert own_sts.get_caller_identity()["Arn"].endswith(f"/sqe-{governed.plain.name}")


# ---------------------------------------------------------------------------------------------------------
# Token exchange refusals


def _oauth_error(reply: requests.Response, status: int, error: str) -> str:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"error", "error_description"} and body["error"] == error, body
    return str(body["error_description"])


def test_exchange_refuses_wrong_and_untrusted_actors_and_delegated_actors(governed: Governed) -> None:
    subject = governed.server.token(governed.analyst)
    untrusted = governed.exchange(subject, governed.server.token(governed.plain))
    assert "is not a reader" in _oauth_error(untrusted, 400, "unauthorized_client")
    admin_actor = governed.exchange(subject, governed.server.token(governed.server.admin))
    _oauth_error(admin_actor, 400, "unauthorized_client")
    own_as_actor = governed.exchange(subject, subject)
    _oauth_error(own_as_actor, 400, "unauthorized_client")
    delegated = governed.delegated(governed.analyst)
    as_actor = governed.exchange(subject, delegated)
    assert "delegated token" in _oauth_error(as_actor, 400, "unauthorized_client")
    again = governed.exchange(delegated, governed.server.token(governed.engine))
    assert "exchanged again" in _oauth_error(again, 400, "invalid_grant")


def test_exchange_refuses_missing_fields_and_wrong_token_types(governed: Governed) -> None:
    subject, actor = governed.server.token(governed.analyst), governed.server.token(governed.engine)
    assert "actor_token is required" in _oauth_error(governed.exchange(subject, None), 400, "invalid_request")
    assert "subject_token is required" in _oauth_error(governed.exchange(None, actor), 400, "invalid_request")
    wrong_type = governed.exchange(subject, actor, subject_token_type="urn:ietf:params:oauth:token-type:id_token")
    _oauth_error(wrong_type, 400, "invalid_request")


def test_exchange_refuses_a_foreign_token(governed: Governed) -> None:
    """A well-formed token for the same principal, signed with another catalog's key."""
    config = load_config(str(governed.server.config_path))
    foreign = AuthStore(create_engine_for(config.server.database), b"another catalog's key", 60)
    token, _ = foreign.issue_token(governed.analyst.client_id, governed.analyst.client_secret, "PRINCIPAL_ROLE:ALL")
    governed.server.secrets.add(token)
    rejected = governed.exchange(token, governed.server.token(governed.engine))
    assert "invalid bearer token" in _oauth_error(rejected, 400, "invalid_grant")
    actor, _ = foreign.issue_token(governed.engine.client_id, governed.engine.client_secret, "PRINCIPAL_ROLE:ALL")
    governed.server.secrets.add(actor)
    _oauth_error(governed.exchange(governed.server.token(governed.analyst), actor), 401, "invalid_client")


def test_an_expired_subject_is_refused_and_delegated_tokens_expire_with_it(governed: Governed) -> None:
    """A real 6-second subject token of this catalog (its own signing key, a short lifetime: whole seconds, so 5 to
    6 s are left when it is issued; the exchange and one load must fit in that on a busy machine)."""
    config = load_config(str(governed.server.config_path))
    key = config.server.signing_key_bytes()
    assert key is not None
    actor = governed.server.token(governed.engine)  # minted first: it costs a password hash
    short = AuthStore(create_engine_for(config.server.database), key, 6)
    subject, _ = short.issue_token(governed.analyst.client_id, governed.analyst.client_secret, "PRINCIPAL_ROLE:ALL")
    governed.server.secrets.add(subject)
    reply = governed.exchange(subject, actor)
    assert reply.status_code == 200 and reply.json()["expires_in"] <= 6
    delegated = reply.json()["access_token"]
    assert governed.get(delegated, "", GOVERNED).status_code == 200
    time.sleep(reply.json()["expires_in"] + 1)  # counted at the exchange, before the load: ends past its expiry
    expired = governed.get(delegated, "", GOVERNED)
    assert expired.status_code == 401
    _carries_no_credential(expired)
    late = governed.exchange(subject, governed.server.token(governed.engine))
    assert "expired" in _oauth_error(late, 400, "invalid_grant")


def test_replay_after_the_grant_is_revoked_or_the_subject_deleted(governed: Governed) -> None:
    user = _user(governed.server, f"leaver_{governed.suffix}", "TABLE_READ_DATA")
    delegated = governed.delegated(user)
    assert governed.get(delegated, "", GOVERNED, table="open").status_code == 200
    role = f"{user.name}_role"
    governed.server.admin_cli("revoke", role, "TABLE_READ_DATA", "--warehouse", governed.server.warehouse)
    revoked = governed.get(delegated, "", GOVERNED, table="open")
    assert revoked.status_code == 403
    _carries_no_credential(revoked)
    governed.server.admin_cli("grant", role, "TABLE_READ_DATA", "--warehouse", governed.server.warehouse)
    assert governed.get(delegated, "", GOVERNED, table="open").status_code == 200
    governed.server.admin_cli("delete-principal", user.name)
    assert governed.get(delegated, "", GOVERNED, table="open").status_code == 401


# ---------------------------------------------------------------------------------------------------------
# ETags, audit, secrets


def test_etags_differ_per_actor(governed: Governed) -> None:
    own_token, delegated = governed.server.token(governed.plain), governed.delegated(governed.plain)
    own = governed.get(own_token, "", GOVERNED, table="open")
    through_reader = governed.get(delegated, "", GOVERNED, table="open")
    assert own.headers["ETag"] != through_reader.headers["ETag"]
    revalidated = {**GOVERNED, "If-None-Match": through_reader.headers["ETag"]}
    assert governed.get(delegated, "", revalidated, table="open").status_code == 304
    assert governed.get(own_token, "", revalidated, table="open").status_code == 200, "never a 304 across actors"
    analyst = governed.get(governed.delegated(governed.analyst), "", GOVERNED)
    stolen = {**GOVERNED, "If-None-Match": analyst.headers["ETag"]}
    assert governed.get(governed.server.token(governed.analyst), "", stolen).status_code == 403


def test_audit_lines_name_user_reader_table_and_outcome_and_the_log_holds_no_secret(governed: Governed) -> None:
    governed.get(governed.delegated(governed.analyst), "", GOVERNED)
    governed.get(governed.server.token(governed.analyst), "", GOVERNED)
    time.sleep(0.2)  # the log is written by another process
    log = governed.server.log_text()
    events = [json.loads(m) for m in re.findall(r"audit (\{.*\})", log)]
    mine = [e for e in events if e.get("end_user") == governed.analyst.name and e["event"] == "governed-response"]
    table = f"{governed.server.warehouse}.{governed.namespace}.people"
    assert {(e["reader"], e["outcome"]) for e in mine} >= {
        (governed.engine.name, "served"),
        (None, "refused-untrusted"),
    }
    assert all(e["table"] == table and re.fullmatch(r"[0-9a-f]{16}", e["restriction_signature"]) for e in mine)
    exchanges = [e for e in events if e["event"] == "token-exchange" and e["end_user"] == governed.analyst.name]
    assert exchanges and all(e["reader"] == governed.engine.name for e in exchanges)
    assert "mask-alphanum" not in log
    leaked = [s for s in governed.server.secrets if s and s in log]
    assert not leaked, f"{len(leaked)} secret(s) in the catalog log"
