"""AuthStore against a real SQLite file: tokens, scopes, principals, roles, groups and grants."""

from __future__ import annotations

import base64
import contextlib
import json
import pickle
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy

from sqe_catalog.auth import (
    AuthStore,
    Grant,
    Principal,
    Privilege,
    create_engine_for,
    implied_privileges,
)
from sqe_catalog.errors import (
    AlreadyExistsError,
    BadRequestError,
    ConfigError,
    ForbiddenError,
    NoSuchPrincipalError,
    NotAuthorizedError,
    NotFoundError,
)

P = Privilege
LIFETIME = 60


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="module")
def empty_schema_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database file with the sqe_* tables, made once: each CREATE TABLE costs an fsync."""
    path = tmp_path_factory.mktemp("template") / "catalog.db"
    eng = create_engine_for(f"sqlite:///{path}")
    AuthStore(eng, b"k" * 32, LIFETIME, scrypt_n=2**10).create_schema()
    eng.dispose()  # the last connection checkpoints the WAL into the file
    return path


@pytest.fixture
def engine(tmp_path: Path, empty_schema_db: Path) -> Iterator[sqlalchemy.Engine]:
    shutil.copyfile(empty_schema_db, tmp_path / "catalog.db")
    eng = create_engine_for(f"sqlite:///{tmp_path / 'catalog.db'}")
    # Test speed only: skip fsyncs (durability is not under test, every other pragma stays).
    sqlalchemy.event.listen(eng, "connect", lambda conn, _record: conn.execute("PRAGMA synchronous = OFF"))
    yield eng
    eng.dispose()


@pytest.fixture
def store(engine: sqlalchemy.Engine, clock: FakeClock) -> AuthStore:
    s = AuthStore(engine, b"k" * 32, LIFETIME, clock=clock, scrypt_n=2**10)
    s.create_schema()
    return s


def _principal_with_roles(store: AuthStore, name: str, *roles: str) -> tuple[str, str]:
    client_id, secret = store.create_principal(name)
    for role in roles:
        with contextlib.suppress(AlreadyExistsError):
            store.create_role(role)
        store.assign_role(name, role)
    return client_id, secret


def _login(store: AuthStore, client_id: str, secret: str, scope: str = "PRINCIPAL_ROLE:ALL") -> Principal:
    token, _ = store.issue_token(client_id, secret, scope)
    return store.principal_for_token(token)


# --- tokens ---------------------------------------------------------------------------------------------


def test_token_round_trip_carries_principal_and_roles(store: AuthStore) -> None:
    client_id, secret = _principal_with_roles(store, "analyst", "readers", "auditors")
    token, expires_in = store.issue_token(client_id, secret, "PRINCIPAL_ROLE:ALL")
    assert expires_in == LIFETIME
    p = store.principal_for_token(token)
    assert p == Principal("analyst", client_id, frozenset({"readers", "auditors"}), frozenset(), False)


def test_token_expires_after_its_lifetime(store: AuthStore, clock: FakeClock) -> None:
    client_id, secret = store.create_principal("analyst")
    token, _ = store.issue_token(client_id, secret, "PRINCIPAL_ROLE:ALL")
    clock.now += LIFETIME - 1
    assert store.principal_for_token(token).name == "analyst"
    clock.now += 1
    with pytest.raises(NotAuthorizedError, match="expired"):
        store.principal_for_token(token)


def _forge_payload(token: str, **changes: object) -> str:
    payload, signature = token.split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body.update(changes)
    forged = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    return f"{forged}.{signature}"


def test_tampered_or_foreign_tokens_are_rejected(store: AuthStore, engine: sqlalchemy.Engine) -> None:
    client_id, secret = store.create_principal("analyst")
    store.create_principal("boss", is_admin=True)
    token, _ = store.issue_token(client_id, secret, "PRINCIPAL_ROLE:ALL")
    payload, signature = token.split(".")
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    other_key = AuthStore(engine, b"x" * 32, LIFETIME, scrypt_n=2**10)
    foreign, _ = other_key.issue_token(client_id, secret, "PRINCIPAL_ROLE:ALL")
    candidates = [
        _forge_payload(token, sub="boss"),
        _forge_payload(token, exp=4_000_000_000),
        f"{payload}.{flipped}",
        f"{payload}.",
        payload,
        foreign,
        "",
        "not-a-token",
        "a.b.c",
        "é.é",
        token + "x" * 10_000,
    ]
    for bad in candidates:
        with pytest.raises(NotAuthorizedError, match="invalid bearer token"):
            store.principal_for_token(bad)


def test_wrong_secret_and_unknown_client_get_the_same_message(store: AuthStore) -> None:
    client_id, secret = store.create_principal("analyst")
    with pytest.raises(NotAuthorizedError) as wrong_secret:
        store.issue_token(client_id, secret + "x", "PRINCIPAL_ROLE:ALL")
    with pytest.raises(NotAuthorizedError) as unknown_id:
        store.issue_token("0123456789abcdef", secret, "PRINCIPAL_ROLE:ALL")
    with pytest.raises(NotAuthorizedError) as empty_id:
        store.issue_token("", "", "PRINCIPAL_ROLE:ALL")
    assert wrong_secret.value.message == unknown_id.value.message == empty_id.value.message
    assert "invalid_client" in wrong_secret.value.message
    assert secret not in wrong_secret.value.message and client_id not in wrong_secret.value.message


@pytest.mark.parametrize(
    "scope",
    [
        "",
        "   ",
        "catalog x",  # "catalog" alone is pyiceberg's default scope = PRINCIPAL_ROLE:ALL
        "PRINCIPAL_ROLE:",
        "PRINCIPAL_ROLE:ALL x",
        "principal_role:ALL",
        "PRINCIPAL_ROLE:a b",
        "PRINCIPAL_ROLE:-bad",
        "PRINCIPAL_ROLE:" + "r" * 200,
    ],
)
def test_malformed_scope_is_invalid_scope(store: AuthStore, scope: str) -> None:
    client_id, secret = store.create_principal("analyst")
    with pytest.raises(BadRequestError, match=r"^invalid_scope"):
        store.issue_token(client_id, secret, scope)


def test_malformed_scope_is_rejected_before_checking_credentials(store: AuthStore) -> None:
    with pytest.raises(BadRequestError, match=r"^invalid_scope"):
        store.issue_token("nobody", "nothing", "")


def test_scope_naming_a_role_activates_only_that_role(store: AuthStore) -> None:
    client_id, secret = _principal_with_roles(store, "analyst", "readers", "writers")
    assert _login(store, client_id, secret, "PRINCIPAL_ROLE:readers").roles == {"readers"}
    both = "PRINCIPAL_ROLE:readers PRINCIPAL_ROLE:writers"
    assert _login(store, client_id, secret, both).roles == {"readers", "writers"}
    assert _login(store, client_id, secret, "PRINCIPAL_ROLE:readers PRINCIPAL_ROLE:ALL").roles == {
        "readers",
        "writers",
    }


def test_scope_naming_a_role_not_held_is_invalid_scope(store: AuthStore) -> None:
    client_id, secret = _principal_with_roles(store, "analyst", "readers")
    store.create_role("writers")
    with pytest.raises(BadRequestError, match="invalid_scope: principal does not hold role writers"):
        store.issue_token(client_id, secret, "PRINCIPAL_ROLE:writers")


def test_rotating_the_secret_revokes_old_secret_and_tokens(store: AuthStore) -> None:
    client_id, old_secret = store.create_principal("analyst")
    old_token, _ = store.issue_token(client_id, old_secret, "PRINCIPAL_ROLE:ALL")
    same_id, new_secret = store.rotate_secret("analyst")
    assert same_id == client_id and new_secret != old_secret
    with pytest.raises(NotAuthorizedError):
        store.issue_token(client_id, old_secret, "PRINCIPAL_ROLE:ALL")
    with pytest.raises(NotAuthorizedError, match="revoked"):
        store.principal_for_token(old_token)
    assert _login(store, client_id, new_secret).name == "analyst"


def test_deleted_principal_token_stops_working_even_if_name_is_reused(store: AuthStore) -> None:
    client_id, secret = store.create_principal("analyst")
    token, _ = store.issue_token(client_id, secret, "PRINCIPAL_ROLE:ALL")
    store.delete_principal("analyst")
    with pytest.raises(NotAuthorizedError):
        store.principal_for_token(token)
    store.create_principal("analyst", is_admin=True)
    with pytest.raises(NotAuthorizedError):
        store.principal_for_token(token)


def test_secret_is_stored_only_as_a_salted_hash(store: AuthStore, engine: sqlalchemy.Engine) -> None:
    _, secret_a = store.create_principal("a")
    store.create_principal("b")
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT * FROM sqe_principals")).all()
    dumped = repr(rows)
    assert secret_a not in dumped
    hashes = [r.secret_hash for r in rows]
    assert all(h.startswith("scrypt$") for h in hashes) and hashes[0] != hashes[1]


# --- privileges -----------------------------------------------------------------------------------------


def test_privilege_implications() -> None:
    assert implied_privileges(P.TABLE_WRITE_DATA) == {
        P.TABLE_WRITE_DATA,
        P.TABLE_READ_DATA,
        P.TABLE_WRITE_PROPERTIES,
        P.TABLE_READ_PROPERTIES,
        P.TABLE_LIST,
    }
    assert implied_privileges(P.TABLE_READ_DATA) == {P.TABLE_READ_DATA, P.TABLE_READ_PROPERTIES, P.TABLE_LIST}
    full = implied_privileges(P.TABLE_FULL_METADATA)
    assert P.TABLE_CREATE in full and P.TABLE_DROP in full
    assert P.TABLE_READ_DATA not in full and P.TABLE_WRITE_DATA not in full
    namespace_all = {p for p in Privilege if p.name.startswith("NAMESPACE_")}
    assert implied_privileges(P.NAMESPACE_FULL_METADATA) == namespace_all
    # CATALOG_MANAGE_POLICIES can loosen read-restrictions: content management does not imply it.
    assert implied_privileges(P.CATALOG_MANAGE_CONTENT) == set(Privilege) - {
        P.CATALOG_MANAGE_ACCESS,
        P.CATALOG_MANAGE_POLICIES,
    }
    assert implied_privileges(P.CATALOG_MANAGE_POLICIES) == {P.CATALOG_MANAGE_POLICIES}
    assert implied_privileges(P.CATALOG_MANAGE_ACCESS) == {P.CATALOG_MANAGE_ACCESS}
    assert implied_privileges(P.TABLE_LIST) == {P.TABLE_LIST}


@pytest.fixture
def analyst(store: AuthStore) -> Principal:
    client_id, secret = _principal_with_roles(store, "analyst", "readers")
    return _login(store, client_id, secret)


def test_implied_privileges_are_honoured_by_checks(store: AuthStore, analyst: Principal) -> None:
    store.grant("readers", P.TABLE_WRITE_DATA, "demo", ("sales",), "orders")
    table = ("demo", ("sales",), "orders")
    assert store.has_privilege(analyst, P.TABLE_READ_DATA, *table)
    assert store.has_privilege(analyst, P.TABLE_READ_PROPERTIES, *table)
    assert not store.has_privilege(analyst, P.TABLE_DROP, *table)
    store.grant("readers", P.TABLE_FULL_METADATA, "demo", ("hr",), "people")
    assert store.has_privilege(analyst, P.TABLE_DROP, "demo", ("hr",), "people")
    assert not store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("hr",), "people")


def test_namespace_grant_covers_nested_namespaces_and_tables(store: AuthStore, analyst: Principal) -> None:
    store.grant("readers", P.TABLE_READ_DATA, "demo", ("sales",))
    store.grant("readers", P.NAMESPACE_LIST, "demo", ("sales",))
    assert store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("sales",), "orders")
    assert store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("sales", "eu", "2024"), "orders")
    assert store.has_privilege(analyst, P.NAMESPACE_LIST, "demo", ("sales", "eu"))
    assert not store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("salesx",), "orders")
    assert not store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("hr", "sales"), "orders")
    assert not store.has_privilege(analyst, P.NAMESPACE_LIST, "demo", None)
    assert not store.has_privilege(analyst, P.TABLE_READ_DATA, "other", ("sales",), "orders")


def test_nested_namespace_grant_does_not_cover_its_parent(store: AuthStore, analyst: Principal) -> None:
    store.grant("readers", P.TABLE_READ_DATA, "demo", ("sales", "eu"))
    assert store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("sales", "eu"), "orders")
    assert not store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("sales",), "orders")
    assert not store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("sales", "us"), "orders")


def test_table_grant_does_not_leak_to_siblings_or_namespace(store: AuthStore, analyst: Principal) -> None:
    store.grant("readers", P.TABLE_READ_DATA, "demo", ("sales",), "orders")
    assert store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("sales",), "orders")
    assert not store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("sales",), "customers")
    assert not store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("sales", "orders"), "orders")
    assert not store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", ("other",), "orders")
    assert not store.has_privilege(analyst, P.NAMESPACE_LIST, "demo", ("sales",))
    assert not store.has_privilege(analyst, P.TABLE_LIST, "demo", ("sales",))


def test_catalog_grant_covers_the_whole_warehouse_only(store: AuthStore, analyst: Principal) -> None:
    store.grant("readers", P.CATALOG_MANAGE_CONTENT, "demo")
    assert store.has_privilege(analyst, P.NAMESPACE_CREATE, "demo", None)
    assert store.has_privilege(analyst, P.TABLE_WRITE_DATA, "demo", ("a", "b"), "t")
    assert not store.has_privilege(analyst, P.CATALOG_MANAGE_ACCESS, "demo", None)
    assert not store.has_privilege(analyst, P.TABLE_READ_DATA, "prod", ("a",), "t")


def test_one_grant_set_answers_every_check_of_a_request(store: AuthStore, analyst: Principal) -> None:
    store.grant("readers", P.TABLE_WRITE_DATA, "demo", ("sales",), "orders")
    grants = store.grants(analyst, "demo")  # what one request reads, once
    assert grants.covers(P.TABLE_READ_DATA, ("sales",), "orders") and grants.covers(
        P.TABLE_WRITE_PROPERTIES, ("sales",), "orders"
    )
    assert not grants.covers(P.CATALOG_MANAGE_POLICIES, None)
    with pytest.raises(ForbiddenError, match=r"^principal analyst lacks TABLE_DROP on "):
        grants.require(P.TABLE_DROP, ("sales",), "orders")
    store.revoke(Grant("readers", P.TABLE_WRITE_DATA, "demo", ("sales",), "orders"))
    assert not store.grants(analyst, "demo").covers(P.TABLE_READ_DATA, ("sales",), "orders"), "the next request"
    assert store.grants(analyst, "prod").rows == ()


def test_admin_has_every_privilege(store: AuthStore) -> None:
    client_id, secret = store.create_principal("root", is_admin=True)
    root = _login(store, client_id, secret)
    assert root.is_admin and root.roles == frozenset()
    assert all(store.has_privilege(root, p, "anywhere", ("x",), "y") for p in Privilege)
    store.require(root, P.CATALOG_MANAGE_ACCESS, "anywhere")


def test_principal_without_roles_has_nothing(store: AuthStore) -> None:
    client_id, secret = store.create_principal("nobody")
    nobody = _login(store, client_id, secret)
    assert not any(store.has_privilege(nobody, p, "demo", ("a",), "t") for p in Privilege)


def test_require_names_privilege_and_object(store: AuthStore, analyst: Principal) -> None:
    store.grant("readers", P.TABLE_READ_DATA, "demo", ("sales",), "orders")
    store.require(analyst, P.TABLE_READ_DATA, "demo", ("sales",), "orders")
    with pytest.raises(ForbiddenError) as denied:
        store.require(analyst, P.TABLE_WRITE_DATA, "demo", ("sales",), "orders")
    assert denied.value.message == "principal analyst lacks TABLE_WRITE_DATA on demo.sales.orders"
    assert denied.value.status == 403
    with pytest.raises(ForbiddenError, match=r"lacks NAMESPACE_CREATE on demo$"):
        store.require(analyst, P.NAMESPACE_CREATE, "demo", None)


def test_table_without_namespace_is_a_bad_request(store: AuthStore, analyst: Principal) -> None:
    with pytest.raises(BadRequestError, match="needs a namespace"):
        store.has_privilege(analyst, P.TABLE_READ_DATA, "demo", None, "orders")


def test_revoke_stops_the_next_check_for_the_same_token(store: AuthStore) -> None:
    client_id, secret = _principal_with_roles(store, "analyst", "readers")
    token, _ = store.issue_token(client_id, secret, "PRINCIPAL_ROLE:ALL")
    store.grant("readers", P.TABLE_WRITE_DATA, "demo", ("sales",), "orders")
    store.require(store.principal_for_token(token), P.TABLE_WRITE_DATA, "demo", ("sales",), "orders")
    store.revoke(Grant("readers", P.TABLE_WRITE_DATA, "demo", ("sales",), "orders"))
    with pytest.raises(ForbiddenError):
        store.require(store.principal_for_token(token), P.TABLE_WRITE_DATA, "demo", ("sales",), "orders")


def test_unassigning_a_role_takes_effect_on_the_next_request(store: AuthStore) -> None:
    client_id, secret = _principal_with_roles(store, "analyst", "readers")
    token, _ = store.issue_token(client_id, secret, "PRINCIPAL_ROLE:readers")
    store.grant("readers", P.TABLE_READ_DATA, "demo")
    assert store.has_privilege(store.principal_for_token(token), P.TABLE_READ_DATA, "demo", ("a",), "t")
    store.unassign_role("analyst", "readers")
    p = store.principal_for_token(token)
    assert p.roles == frozenset()
    assert not store.has_privilege(p, P.TABLE_READ_DATA, "demo", ("a",), "t")


def test_group_roles_count_and_follow_membership(store: AuthStore) -> None:
    client_id, secret = _principal_with_roles(store, "analyst", "own")
    store.create_role("team-readers")
    store.create_group("sales-team")
    store.assign_group_role("sales-team", "team-readers")
    store.add_to_group("analyst", "sales-team")
    store.grant("team-readers", P.TABLE_READ_DATA, "demo", ("sales",))
    token, _ = store.issue_token(client_id, secret, "PRINCIPAL_ROLE:ALL")
    p = store.principal_for_token(token)
    assert p.groups == {"sales-team"} and p.roles == {"own", "team-readers"}
    assert store.has_privilege(p, P.TABLE_READ_DATA, "demo", ("sales",), "orders")
    only_own = _login(store, client_id, secret, "PRINCIPAL_ROLE:own")
    assert not store.has_privilege(only_own, P.TABLE_READ_DATA, "demo", ("sales",), "orders")
    assert _login(store, client_id, secret, "PRINCIPAL_ROLE:team-readers").roles == {"team-readers"}
    store.remove_from_group("analyst", "sales-team")
    p = store.principal_for_token(token)
    assert p.groups == frozenset() and p.roles == {"own"}
    assert not store.has_privilege(p, P.TABLE_READ_DATA, "demo", ("sales",), "orders")


def test_roles_groups_and_the_reader_mark_read_together_keep_their_kinds(store: AuthStore) -> None:
    """One statement reads all three: a name used for a role and a group, and a role held both directly and
    through a group, land once each in their own kind; a role named "reader" makes nobody a reader."""
    client_id, secret = _principal_with_roles(store, "analyst", "reader", "shared")
    store.create_group("shared")
    store.assign_group_role("shared", "shared")
    store.add_to_group("analyst", "shared")
    p = _login(store, client_id, secret)
    assert p.roles == {"reader", "shared"} and p.groups == {"shared"} and not p.is_reader
    store.set_reader("analyst", True)
    p = _login(store, client_id, secret)
    assert p.roles == {"reader", "shared"} and p.groups == {"shared"} and p.is_reader
    assert [(q.name, q.roles, q.groups, q.is_reader) for q in store.list_principals()] == [
        ("analyst", p.roles, p.groups, True)
    ]


# --- management -----------------------------------------------------------------------------------------


def test_duplicates_are_already_exists(store: AuthStore) -> None:
    store.create_principal("analyst")
    store.create_role("readers")
    store.create_group("team")
    with pytest.raises(AlreadyExistsError, match="principal analyst already exists"):
        store.create_principal("analyst")
    with pytest.raises(AlreadyExistsError, match="role readers already exists"):
        store.create_role("readers")
    with pytest.raises(AlreadyExistsError, match="group team already exists"):
        store.create_group("team")


def test_assignments_and_grants_are_idempotent(store: AuthStore) -> None:
    _principal_with_roles(store, "analyst", "readers")
    store.assign_role("analyst", "readers")
    store.grant("readers", P.TABLE_READ_DATA, "demo", ("a",))
    store.grant("readers", "TABLE_READ_DATA", "demo", ["a"])
    assert store.list_grants("readers") == [Grant("readers", P.TABLE_READ_DATA, "demo", ("a",), None)]


def test_unknown_names_are_not_found(store: AuthStore) -> None:
    store.create_principal("analyst")
    store.create_role("readers")
    store.create_group("team")
    with pytest.raises(NoSuchPrincipalError, match="principal ghost does not exist"):
        store.assign_role("ghost", "readers")
    with pytest.raises(NoSuchPrincipalError):
        store.rotate_secret("ghost")
    with pytest.raises(NoSuchPrincipalError):
        store.delete_principal("ghost")
    with pytest.raises(NoSuchPrincipalError):
        store.add_to_group("ghost", "team")
    with pytest.raises(NotFoundError, match="principal role ghost does not exist"):
        store.assign_role("analyst", "ghost")
    with pytest.raises(NotFoundError, match="group ghost does not exist"):
        store.add_to_group("analyst", "ghost")
    with pytest.raises(NotFoundError, match="principal role ghost does not exist"):
        store.grant("ghost", P.TABLE_READ_DATA, "demo")
    with pytest.raises(NotFoundError, match="principal role ghost"):
        store.list_grants("ghost")
    with pytest.raises(NotFoundError, match=re.escape("has no grant of TABLE_READ_DATA on demo.a.t")):
        store.revoke(Grant("readers", P.TABLE_READ_DATA, "demo", ("a",), "t"))
    with pytest.raises(NotFoundError, match="does not hold role readers"):
        store.unassign_role("analyst", "readers")


@pytest.mark.parametrize("name", ["", "-x", "has space", "a" * 129, "semi;colon", "ünï"])
def test_invalid_names_are_bad_requests(store: AuthStore, name: str) -> None:
    with pytest.raises(BadRequestError, match="invalid principal name"):
        store.create_principal(name)


def test_role_all_is_reserved(store: AuthStore) -> None:
    with pytest.raises(BadRequestError, match="reserved"):
        store.create_role("ALL")


def test_grant_validation(store: AuthStore) -> None:
    store.create_role("readers")
    with pytest.raises(BadRequestError, match="unknown privilege 'TABLE_READ'"):
        store.grant("readers", "TABLE_READ", "demo")
    with pytest.raises(BadRequestError, match="whole warehouse"):
        store.grant("readers", P.CATALOG_MANAGE_CONTENT, "demo", ("a",))
    with pytest.raises(BadRequestError, match="not a table"):
        store.grant("readers", P.NAMESPACE_DROP, "demo", ("a",), "t")
    with pytest.raises(BadRequestError, match="needs a namespace"):
        store.grant("readers", P.TABLE_READ_DATA, "demo", None, "t")
    with pytest.raises(BadRequestError, match="invalid namespace"):
        store.grant("readers", P.TABLE_READ_DATA, "demo", ("a", ""))
    with pytest.raises(BadRequestError, match="warehouse"):
        store.grant("readers", P.TABLE_READ_DATA, " ")
    assert store.list_grants() == []


def test_deleting_role_and_principal_cleans_up(store: AuthStore, engine: sqlalchemy.Engine) -> None:
    _principal_with_roles(store, "analyst", "readers")
    store.create_group("team")
    store.add_to_group("analyst", "team")
    store.assign_group_role("team", "readers")
    store.grant("readers", P.TABLE_READ_DATA, "demo")
    store.delete_role("readers")
    assert store.list_grants() == []
    assert store.list_principals()[0].roles == frozenset()
    store.delete_principal("analyst")
    assert store.list_principals() == []
    store.delete_group("team")
    with engine.connect() as conn:
        for table in ("sqe_principal_role_assignments", "sqe_group_members", "sqe_group_role_assignments"):
            assert conn.execute(sqlalchemy.text(f"SELECT COUNT(*) FROM {table}")).scalar_one() == 0


def test_list_principals_and_grants(store: AuthStore) -> None:
    client_id, _ = _principal_with_roles(store, "analyst", "readers")
    store.create_principal("root", is_admin=True)
    store.grant("readers", P.TABLE_READ_DATA, "demo", ("sales", "eu"), "orders")
    store.grant("readers", P.NAMESPACE_LIST, "demo")
    principals = store.list_principals()
    assert [(p.name, p.is_admin) for p in principals] == [("analyst", False), ("root", True)]
    assert principals[0].client_id == client_id and principals[0].roles == {"readers"}
    grants = store.list_grants()
    assert [g.to_json() for g in grants] == [
        {
            "role": "readers",
            "privilege": "NAMESPACE_LIST",
            "warehouse": "demo",
            "namespace": None,
            "table": None,
        },
        {
            "role": "readers",
            "privilege": "TABLE_READ_DATA",
            "warehouse": "demo",
            "namespace": ["sales", "eu"],
            "table": "orders",
        },
    ]


# --- secrets stay secret --------------------------------------------------------------------------------


def test_no_secret_in_reprs_errors_or_pickles(store: AuthStore) -> None:
    client_id, secret = _principal_with_roles(store, "analyst", "readers")
    token, _ = store.issue_token(client_id, secret, "PRINCIPAL_ROLE:ALL")
    p = store.principal_for_token(token)
    texts = [repr(p), str(p), repr(store), str(store), pickle.dumps(p).decode("latin-1")]
    for call in (
        lambda: store.issue_token(client_id, secret + "x", "PRINCIPAL_ROLE:ALL"),
        lambda: store.principal_for_token(token[:-3]),
        lambda: store.require(p, P.TABLE_READ_DATA, "demo", ("a",), "t"),
    ):
        with pytest.raises(Exception) as err:
            call()
        texts += [str(err.value), repr(err.value)]
    for text in texts:
        assert secret not in text and token not in text and token.split(".")[1] not in text
        assert "kkkkkkkk" not in text  # the signing key
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(store)


# --- schema and engine ----------------------------------------------------------------------------------


def test_schema_is_idempotent_and_coexists_with_pyiceberg(tmp_path: Path, engine: sqlalchemy.Engine) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("demo", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("sales")
    store = AuthStore(engine, b"k" * 32, LIFETIME, scrypt_n=2**10)
    store.create_schema()
    store.create_schema()
    store.create_principal("analyst")
    tables = set(sqlalchemy.inspect(engine).get_table_names())
    assert {"iceberg_tables", "iceberg_namespace_properties", "sqe_principals", "sqe_grants"} <= tables
    assert catalog.list_namespaces() == [("sales",)]
    assert [p.name for p in store.list_principals()] == ["analyst"]


def test_sqlite_engine_uses_wal_and_busy_timeout(engine: sqlalchemy.Engine) -> None:
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() >= 5000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1


def test_bad_database_url_is_a_config_error_without_the_password() -> None:
    with pytest.raises(ConfigError) as err:
        create_engine_for("postgresql://user:hunter2@:not-a-port/db")
    assert "hunter2" not in str(err.value) and "server.database" in str(err.value)
    with pytest.raises(ConfigError, match="unsupported database dialect"):
        create_engine_for("nosuchdb://user:pw@host/db")


def test_constructor_rejects_an_empty_signing_key(engine: sqlalchemy.Engine) -> None:
    with pytest.raises(ConfigError, match="signing key"):
        AuthStore(engine, b"", LIFETIME)
