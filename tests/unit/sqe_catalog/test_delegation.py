"""OAuth token exchange (RFC 8693, our extension: the actor must be a reader) in-process: the delegated token's
shape and lifetime, every refusal with its OAuth error, revocation on each call, audit lines and ETags per actor."""

from __future__ import annotations

import base64
import json
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from sqe.vocabulary import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE_GRANT
from sqe_catalog.auth import Grant, Privilege
from tests.unit.sqe_catalog.test_api import Reply, call
from tests.unit.sqe_catalog.test_restrictions import DECLARED, MASK_EMAIL, SCHEMA, TABLE, Catalog

FORM = {"content-type": "application/x-www-form-urlencoded"}


def _setup(catalog: Catalog) -> Catalog:
    catalog.principal("root", admin=True)
    catalog.principal("alice")
    catalog.store.create_role("alice_role")
    catalog.store.assign_role("alice", "alice_role")
    catalog.store.grant("alice_role", "TABLE_READ_DATA", "wh")
    catalog.principal("engine", reader=True)
    catalog.principal("plain")  # a principal that is not a reader
    assert catalog.request("root", "POST", "/v1/wh/namespaces", namespace=["db"]).status == 200
    assert catalog.request("root", "POST", "/v1/wh/namespaces/db/tables", name="t", schema=SCHEMA).status == 200
    return catalog


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return _setup(Catalog(tmp_path))


def exchange(catalog: Catalog, subject: str | None, actor: str | None, **extra: str) -> Reply:
    form: dict[str, str] = {"grant_type": TOKEN_EXCHANGE_GRANT}
    if subject is not None:
        form |= {"subject_token": catalog.tokens.get(subject, subject), "subject_token_type": ACCESS_TOKEN_TYPE}
    if actor is not None:
        form |= {"actor_token": catalog.tokens.get(actor, actor), "actor_token_type": ACCESS_TOKEN_TYPE}
    form |= extra
    return call(catalog.app, "POST", "/v1/oauth/tokens", headers=FORM, body=urlencode(form).encode())


def oauth_error(reply: Reply, status: int, error: str) -> str:
    assert reply.status == status, reply.body
    body = reply.json()
    assert set(body) == {"error", "error_description"} and body["error"] == error, body
    assert reply.headers["cache-control"] == "no-store"
    return str(body["error_description"])


def payload(token: str) -> dict[str, Any]:
    encoded = token.partition(".")[0]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    return decoded


# ---------------------------------------------------------------------------------------------------------
# The delegated token


def test_exchange_returns_a_delegated_token_with_subject_and_actor(catalog: Catalog) -> None:
    reply = exchange(catalog, "alice", "engine")
    assert reply.status == 200, reply.body
    body = reply.json()
    assert set(body) == {"access_token", "issued_token_type", "token_type", "expires_in"}
    assert body["issued_token_type"] == ACCESS_TOKEN_TYPE and body["token_type"] == "bearer"
    claims = payload(body["access_token"])
    assert claims["sub"] == "alice" and claims["act"] == {"sub": "engine"}
    subject_claims = payload(catalog.tokens["alice"])
    assert claims["exp"] <= subject_claims["exp"], "never outlives the subject token"
    assert 0 < body["expires_in"] <= subject_claims["exp"] - int(time.time()) + 1
    assert reply.headers["cache-control"] == "no-store"
    catalog.tokens["delegated"] = body["access_token"]
    # Grants are the end user's: the reader holds none, the delegated token reads what alice may read.
    assert catalog.request("engine", "GET", TABLE).status == 403
    assert catalog.request("delegated", "GET", TABLE).status == 200


def test_scope_can_only_narrow_the_subject_tokens_roles(catalog: Catalog) -> None:
    client_id, client_secret = catalog.store.create_principal("carol")
    for role in ("r1", "r2"):
        catalog.store.create_role(role)
        catalog.store.assign_role("carol", role)
    form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": client_secret}
    catalog.tokens["carol"] = catalog._token({**form, "scope": "PRINCIPAL_ROLE:ALL"})
    catalog.tokens["carol r1"] = catalog._token({**form, "scope": "PRINCIPAL_ROLE:r1"})
    narrowed = exchange(catalog, "carol", "engine", scope="PRINCIPAL_ROLE:r2")
    assert narrowed.status == 200 and payload(narrowed.json()["access_token"])["roles"] == ["r2"]
    kept = exchange(catalog, "carol r1", "engine")
    assert kept.status == 200 and payload(kept.json()["access_token"])["roles"] == ["r1"], "no scope: the subject's"
    wider = exchange(catalog, "carol r1", "engine", scope="PRINCIPAL_ROLE:r2")
    assert "role r2 is not active in the subject token" in oauth_error(wider, 400, "invalid_scope")
    oauth_error(exchange(catalog, "carol", "engine", scope="ROLE:x"), 400, "invalid_scope")


def test_a_scope_naming_a_role_the_subject_does_not_hold_is_refused_like_client_credentials(
    catalog: Catalog,
) -> None:
    """Found by review: an exchange of an all-roles subject token took ``scope=PRINCIPAL_ROLE:<a role the subject
    does not hold>`` and minted a token naming it, while ``client_credentials`` refuses that scope. Both now give
    the same ``invalid_scope`` answer; a role the subject does hold is still accepted."""
    client_id, client_secret = catalog.store.create_principal("dave")
    catalog.store.create_role("held")
    catalog.store.assign_role("dave", "held")
    catalog.store.create_role("foreign")  # exists, but dave does not hold it
    form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": client_secret}
    catalog.tokens["dave"] = catalog._token({**form, "scope": "PRINCIPAL_ROLE:ALL"})
    for scope in ("PRINCIPAL_ROLE:foreign", "PRINCIPAL_ROLE:held PRINCIPAL_ROLE:foreign", "PRINCIPAL_ROLE:nosuch"):
        login = call(
            catalog.app, "POST", "/v1/oauth/tokens", headers=FORM, body=urlencode({**form, "scope": scope}).encode()
        )
        exchanged = exchange(catalog, "dave", "engine", scope=scope)
        described = oauth_error(exchanged, 400, "invalid_scope")
        assert described == oauth_error(login, 400, "invalid_scope"), scope
        assert described.startswith("principal does not hold role "), described
    held = exchange(catalog, "dave", "engine", scope="PRINCIPAL_ROLE:held")
    assert held.status == 200 and payload(held.json()["access_token"])["roles"] == ["held"]


# ---------------------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("subject_token", "subject_token is required"),
        ("subject_token_type", "subject_token_type must be urn:ietf:params:oauth:token-type:access_token"),
        ("actor_token", "actor_token is required (sqe-catalog delegates only to a reader)"),
        ("actor_token_type", "actor_token_type must be"),
    ],
)
def test_missing_fields_are_invalid_request(catalog: Catalog, drop: str, message: str) -> None:
    form = {
        "grant_type": TOKEN_EXCHANGE_GRANT,
        "subject_token": catalog.tokens["alice"],
        "subject_token_type": ACCESS_TOKEN_TYPE,
        "actor_token": catalog.tokens["engine"],
        "actor_token_type": ACCESS_TOKEN_TYPE,
    }
    del form[drop]
    reply = call(catalog.app, "POST", "/v1/oauth/tokens", headers=FORM, body=urlencode(form).encode())
    assert message in oauth_error(reply, 400, "invalid_request")


def test_wrong_token_types_targets_and_grant_types(catalog: Catalog) -> None:
    for field in ("subject_token_type", "actor_token_type"):
        reply = exchange(catalog, "alice", "engine", **{field: "urn:ietf:params:oauth:token-type:jwt"})
        assert field in oauth_error(reply, 400, "invalid_request")
    oauth_error(exchange(catalog, "alice", "engine", resource="https://elsewhere"), 400, "invalid_target")
    oauth_error(exchange(catalog, "alice", "engine", audience="other"), 400, "invalid_target")
    other = exchange(catalog, "alice", "engine", requested_token_type="urn:ietf:params:oauth:token-type:id_token")
    oauth_error(other, 400, "invalid_request")
    body = urlencode({"grant_type": "password"}).encode()
    unsupported = call(catalog.app, "POST", "/v1/oauth/tokens", headers=FORM, body=body)
    assert TOKEN_EXCHANGE_GRANT in oauth_error(unsupported, 400, "unsupported_grant_type")


def test_the_actor_must_be_a_reader_with_its_own_token(catalog: Catalog) -> None:
    assert "plain is not a reader" in oauth_error(exchange(catalog, "alice", "plain"), 400, "unauthorized_client")
    assert "not a reader" in oauth_error(exchange(catalog, "alice", "root"), 400, "unauthorized_client"), "admins too"
    catalog.tokens["delegated"] = exchange(catalog, "alice", "engine").json()["access_token"]
    as_actor = exchange(catalog, "alice", "delegated")
    assert "delegated token cannot be an actor_token" in oauth_error(as_actor, 400, "unauthorized_client")
    oauth_error(exchange(catalog, "alice", "not-a-token"), 401, "invalid_client")
    oauth_error(exchange(catalog, "alice", catalog.tokens["engine"] + "x"), 401, "invalid_client")


def test_the_subject_must_be_an_undelegated_end_user(catalog: Catalog) -> None:
    catalog.tokens["delegated"] = exchange(catalog, "alice", "engine").json()["access_token"]
    again = exchange(catalog, "delegated", "engine")
    assert "cannot be exchanged again" in oauth_error(again, 400, "invalid_grant")
    assert "not a reader" in oauth_error(exchange(catalog, "engine", "engine"), 400, "invalid_grant")
    oauth_error(exchange(catalog, "garbage", "engine"), 400, "invalid_grant")


def test_tokens_of_another_catalog_are_refused(catalog: Catalog, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    other = _setup(Catalog(tmp_path / "other"))  # same principal names, its own signing key
    foreign_subject = exchange(catalog, other.tokens["alice"], "engine")
    assert "invalid bearer token" in oauth_error(foreign_subject, 400, "invalid_grant")
    oauth_error(exchange(catalog, "alice", other.tokens["engine"]), 401, "invalid_client")


def test_an_expired_subject_token_is_refused_and_delegated_tokens_die_with_it(tmp_path: Path) -> None:
    catalog = _setup(Catalog(tmp_path, "token_lifetime_seconds = 2"))
    # Tokens minted now: the setup's own may be near their 2 s already on a busy machine.
    catalog.principal("alice2")
    catalog.store.assign_role("alice2", "alice_role")
    catalog.principal("engine3", reader=True)
    reply = exchange(catalog, "alice2", "engine3")
    assert reply.status == 200 and reply.json()["expires_in"] <= 2
    catalog.tokens["delegated"] = reply.json()["access_token"]
    assert catalog.request("delegated", "GET", TABLE).status == 200
    time.sleep(2.2)
    assert catalog.request("delegated", "GET", TABLE).status == 401
    catalog.principal("engine2", reader=True)  # a fresh actor token: only the subject is expired
    expired = exchange(catalog, "alice2", "engine2")
    assert "expired" in oauth_error(expired, 400, "invalid_grant")


# ---------------------------------------------------------------------------------------------------------
# Checked against current state on every call


def test_delegated_tokens_follow_revocations_on_the_next_call(catalog: Catalog, tmp_path: Path) -> None:
    assert catalog.restrict(tmp_path, MASK_EMAIL, "--principal", "alice") == 0
    catalog.tokens["delegated"] = exchange(catalog, "alice", "engine").json()["access_token"]
    assert catalog.request("delegated", "GET", TABLE, headers=DECLARED).status == 200
    catalog.store.revoke(Grant("alice_role", Privilege.TABLE_READ_DATA, "wh"))
    assert catalog.request("delegated", "GET", TABLE, headers=DECLARED).status == 403, "grant revoked"
    catalog.store.grant("alice_role", "TABLE_READ_DATA", "wh")
    assert catalog.admin("set-trusted-reader", "engine", "false") == 0
    assert catalog.request("delegated", "GET", TABLE, headers=DECLARED).status == 403, "no longer a reader"
    assert catalog.admin("set-trusted-reader", "engine", "true") == 0
    assert catalog.request("delegated", "GET", TABLE, headers=DECLARED).status == 200
    catalog.store.rotate_secret("engine")
    assert catalog.request("delegated", "GET", TABLE, headers=DECLARED).status == 401, "reader rotated"


def test_rotating_or_deleting_the_subject_kills_its_delegated_tokens(catalog: Catalog) -> None:
    catalog.tokens["delegated"] = exchange(catalog, "alice", "engine").json()["access_token"]
    catalog.store.rotate_secret("alice")
    assert catalog.request("delegated", "GET", TABLE).status == 401
    catalog.principal("bob")
    catalog.tokens["bob via engine"] = exchange(catalog, "bob", "engine").json()["access_token"]
    catalog.store.delete_principal("bob")
    catalog.store.create_principal("bob")  # the same name again: a different principal
    assert catalog.request("bob via engine", "GET", TABLE).status == 401


def test_deleting_a_reader_ends_its_reader_status_for_good(catalog: Catalog) -> None:
    catalog.store.delete_principal("engine")
    catalog.principal("engine")  # re-created under the same name: not a reader
    assert "not a reader" in oauth_error(exchange(catalog, "alice", "engine"), 400, "unauthorized_client")


# ---------------------------------------------------------------------------------------------------------
# ETags and audit


def test_etags_differ_per_actor_even_for_unrestricted_tables(catalog: Catalog) -> None:
    catalog.tokens["delegated"] = exchange(catalog, "alice", "engine").json()["access_token"]
    own = catalog.request("alice", "GET", TABLE).headers["etag"]
    delegated = catalog.request("delegated", "GET", TABLE).headers["etag"]
    assert own != delegated
    assert catalog.request("alice", "GET", TABLE, headers={"If-None-Match": delegated}).status == 200
    assert catalog.request("delegated", "GET", TABLE, headers={"If-None-Match": delegated}).status == 304


def test_one_audit_line_per_governed_response_without_content_or_tokens(
    catalog: Catalog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert catalog.restrict(tmp_path, MASK_EMAIL, "--principal", "alice") == 0
    catalog.tokens["delegated"] = exchange(catalog, "alice", "engine").json()["access_token"]
    with caplog.at_level(logging.INFO, logger="sqe_catalog.audit"):
        assert catalog.request("delegated", "GET", TABLE, headers=DECLARED).status == 200
        assert catalog.request("alice", "GET", TABLE, headers=DECLARED).status == 403
        assert catalog.request("delegated", "GET", TABLE).status == 406
        assert catalog.request("root", "GET", TABLE).status == 200  # not governed: no line
    lines = [r.getMessage() for r in caplog.records if r.name == "sqe_catalog.audit"]
    events = [json.loads(line.removeprefix("audit ")) for line in lines]
    assert [(e["end_user"], e["reader"], e["outcome"], e["status"]) for e in events] == [
        ("alice", "engine", "served", 200),
        ("alice", None, "refused-untrusted", 403),
        ("alice", "engine", "refused-capability", 406),
    ]
    assert all(e["table"] == "wh.db.t" and e["operation"] == "load" for e in events)
    assert len({e["restriction_signature"] for e in events}) == 1 and len(events[0]["restriction_signature"]) == 16
    text = "\n".join(lines)
    assert "mask-alphanum" not in text and "field-id" not in text, "a digest, never the content"
    assert not any(token in text for token in catalog.tokens.values())


def test_a_rewritten_file_is_answered_422_and_never_audited_as_the_gates_refusal(
    catalog: Catalog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The load's storage fingerprint runs while restrictions resolve: its verdict must come before the gate's
    # refusal is audited, or the audit log records a 403 the client never got.
    encrypted = {"format-version": "3", "encryption.key-id": "K1"}
    created = catalog.request(
        "root", "POST", "/v1/wh/namespaces/db/tables", name="e", schema=SCHEMA, properties=encrypted
    )
    assert created.status == 200, created.body
    assert catalog.restrict(tmp_path, MASK_EMAIL, "--principal", "alice", table="e") == 0
    delegated = catalog.delegate("alice", "engine")
    table = "/v1/wh/namespaces/db/tables/e"
    assert catalog.request(delegated, "GET", table, headers=DECLARED).status == 200  # verified
    loaded = catalog.request(delegated, "GET", table, headers=DECLARED)  # the verified revision, reused
    assert loaded.status == 200
    stored = Path(str(loaded.json()["metadata-location"]).removeprefix("file://"))
    document = json.loads(stored.read_text())
    document["properties"]["owner"] = "mallory"
    stored.write_text(json.dumps(document))
    with caplog.at_level(logging.INFO, logger="sqe_catalog.audit"):
        refused = catalog.request("alice", "GET", table, headers=DECLARED)  # no reader: the gate would say 403
    assert refused.status == 422, refused.body
    assert "trusted digest" in refused.json()["error"]["message"]
    audited = [r.getMessage() for r in caplog.records if r.name == "sqe_catalog.audit"]
    assert audited == [], "no governed response and no refusal of the gate was given"
