"""OpenQuery's wait for its DoGet (issue 17): when a result nobody fetched counts as abandoned, and when not."""

from __future__ import annotations

import copy
import hashlib
import os
import pickle
import sqlite3
import time
from pathlib import Path

import pyarrow as pa
import pytest

from sqe.errors import QueryError
from sqe.server.identity import User
from sqe.server.mount_stores import prune_stores, store_path
from sqe.server.sessions import (
    MAX_CLIENT_SESSIONS_PER_USER,
    MAX_OFFERED_COOKIES,
    MAX_PREPARED_STATEMENTS,
    ClientSession,
    Limits,
    OpenQuery,
    ParameterBudget,
    Prepared,
    ServerBusyError,
    SessionKey,
    SessionRegistry,
    UnknownHandleError,
    _user_config,
)
from tests.unit.sqe.test_config import _load


def _planning(fetch_seconds: float, released: list[str]) -> OpenQuery:
    return OpenQuery.for_planning(
        handle=b"h",
        schema=pa.schema([]),
        batches=iter(()),
        deadline=time.monotonic() + 3600,
        cancel_engine=lambda: None,
        release=lambda: released.append("released"),
        fetch_seconds=fetch_seconds,
    )


def test_a_result_still_planning_is_never_unfetched() -> None:
    query = _planning(0.0, [])
    assert not query.unfetched(time.monotonic() + 10, connection_gone_at=time.monotonic() + 10)


def test_a_planned_result_is_unfetched_past_its_fetch_time_or_once_its_connection_closed() -> None:
    released: list[str] = []
    query = _planning(5.0, released)
    query.planned()
    now = time.monotonic()
    assert not query.unfetched(now, connection_gone_at=None)
    assert query.unfetched(now + 5.0, connection_gone_at=None)
    assert query.unfetched(now, connection_gone_at=now + 0.001)
    assert not query.unfetched(now, connection_gone_at=query.waiting_since - 1)  # gone before: another connection
    assert query.finish_if_waiting() and released == ["released"]
    assert not query.unfetched(now + 5.0, connection_gone_at=None)  # finished: nothing left to drop


def test_a_result_its_doget_claimed_is_not_unfetched() -> None:
    query = _planning(0.0, [])
    query.planned()
    assert query.claim()
    assert not query.unfetched(time.monotonic() + 10, connection_gone_at=time.monotonic() + 10)


def test_a_metadata_table_waits_from_when_it_was_built() -> None:
    before = time.monotonic()
    query = OpenQuery(
        handle=b"m",
        schema=pa.schema([]),
        batches=iter(()),
        deadline=before + 3600,
        cancel_engine=lambda: None,
        release=lambda: None,
        fetch_seconds=2.0,
    )
    assert before <= query.waiting_since <= time.monotonic()
    assert query.unfetched(query.waiting_since + 2.0, connection_gone_at=None)


def test_a_users_config_carries_their_token_only_and_no_sibling_on_another_catalog() -> None:
    """The user's (delegated) token is for the primary catalog: a sibling warehouse on another catalog would
    receive it, and could replay it at the primary as that user, so it is left out of the user's config."""
    siblings = [
        {"name": "same", "uri": "http://127.0.0.1:8181/"},
        {"name": "same spelt otherwise", "uri": "HTTP://127.0.0.1:8181"},
        {"name": "inherited"},
        {"name": "elsewhere", "uri": "http://127.0.0.1:9999", "client_id": "x", "client_secret": "y"},
    ]
    identity = {"catalog.client_id": "server", "catalog.client_secret": "SERVER-SECRET"}
    reader = {"catalog.reader_client_id": "reader", "catalog.reader_client_secret": "READER-SECRET"}
    base = _load({**identity, **reader, "catalog.warehouses": siblings})
    config = _user_config(base, "USER-TOKEN", SessionKey("user:alice", "roles", "s"))
    assert config.catalog.warehouse_names == ("demo", "same", "same spelt otherwise", "inherited")
    for name in config.catalog.warehouse_names:
        connection = config.catalog.connection(name)
        assert connection.uri.rstrip("/").lower() == "http://127.0.0.1:8181"
        assert connection.token is not None and connection.token.get_secret_value() == "USER-TOKEN"
        assert connection.reader_client_id is None and connection.client_id is None


def test_external_tables_are_stored_per_user_and_authority() -> None:
    """Found by review: one store per principal, whatever roles its token named. Not per session id: mounts
    persist across a user's client sessions."""
    base = _load({"external_tables.path": "/srv/sqe/external.db"})

    def store(user: str, authority: str, tag: str = "s") -> str | None:
        section = _user_config(base, "USER-TOKEN", SessionKey(user, authority, tag)).external_tables
        assert not section.storage_keys and not section.environment_keys
        return section.path

    wide = store("user:alice", "all roles")
    assert wide is not None and wide.startswith("/srv/sqe/external.") and wide.endswith(".db")
    # found by review: named by 16 hex digits (64 bits), which two owners' stores could share; now the whole SHA-256
    assert wide == "/srv/sqe/external." + hashlib.sha256(b"user:alice\0all roles").hexdigest() + ".db"
    assert store("user:alice", "all roles", "another session") == wide
    assert len({wide, store("user:alice", "one role"), store("user:bob", "all roles")}) == 3


# ------------------------------------------------------------------------------- growth (found by review)


def test_a_discarded_engine_leaves_no_plan_behind_in_any_prepared_statement() -> None:
    """A failed query discards its engine and the next one is new: each prepared statement kept the old
    engine's plan (its session, tables and vended credentials) for as long as the statement stayed open."""
    session = ClientSession(SessionKey("user:alice", "", "s"), _load({}), 1024)
    prepared = Prepared("SELECT 1")
    session.add_prepared(b"h", prepared)
    for _ in range(3):
        engine = session.acquire_engine("TOKEN")
        prepared.plans[engine.serial] = object()  # type: ignore[assignment]  # any plan: only its removal counts
        session.release_engine(engine, discard=True)
    assert prepared.plans == {}
    kept = session.acquire_engine("TOKEN")
    prepared.plans[kept.serial] = object()  # type: ignore[assignment]
    session.release_engine(kept)  # back to the pool: its plan stays useful
    assert list(prepared.plans) == [kept.serial]
    session.close()
    assert prepared.plans == {}


def test_open_prepared_statements_per_client_session_are_bounded() -> None:
    session = ClientSession(SessionKey("user:alice", "", "s"), _load({}), 1024)
    for index in range(MAX_PREPARED_STATEMENTS):
        session.add_prepared(index.to_bytes(4, "big"), Prepared("SELECT 1"))
    with pytest.raises(QueryError, match="open prepared statements: close some first"):
        session.add_prepared(b"one more", Prepared("SELECT 1"))


def test_a_client_without_cookies_does_not_add_an_alias_per_call() -> None:
    registry = SessionRegistry(_load({}), None, Limits(4, 2), 1024)  # type: ignore[arg-type]
    alice = User("user:alice", "TOKEN", authority="roles")
    cookies = [f"cookie-{i}" for i in range(200)]
    sessions = {registry.resolve(alice, None, "ipv4:127.0.0.1:5000", cookie).key for cookie in cookies}
    assert len(sessions) == 1 and len(registry._aliases) == MAX_OFFERED_COOKIES
    (key,) = sessions
    assert registry.resolve(alice, cookies[-1], "ipv4:127.0.0.1:5000", None).key == key  # the last offered
    registry.close()
    assert registry._aliases == {}


def test_one_cookie_under_two_authorities_of_one_user_is_two_client_sessions() -> None:
    """Two tokens of one principal with other roles never share prepared statements or results, whatever cookie
    they send; the user's limits still count both."""
    registry = SessionRegistry(_load({}), None, Limits(4, 2), 1024)  # type: ignore[arg-type]
    wide, narrow = User("user:alice", "A", authority="all roles"), User("user:alice", "B", authority="one role")
    first = registry.resolve(wide, None, "ipv4:127.0.0.1:5000", "cookie")
    assert registry.resolve(wide, "cookie", "ipv4:127.0.0.1:5000", None) is first
    other = registry.resolve(narrow, "cookie", "ipv4:127.0.0.1:5000", None)
    assert other is not first and other.user_key == first.user_key == "user:alice"
    assert registry.resolve(narrow, None, "ipv4:127.0.0.1:5000", None) is not first
    registry.close()


def test_a_session_keys_repr_shows_its_user_and_a_short_tag_and_it_is_never_pickled() -> None:
    """Found by review: as a NamedTuple its repr (and str, and pickle) carried the authority digest (for an opaque
    token, the SHA-256 of the token) and the client's whole session id."""
    authority, cookie, peer = "9f" * 32, "c00kie-" + "x" * 25, "peer:ipv4:1.2.3.4:5"
    for key in (SessionKey("user:alice", authority, cookie), SessionKey("user:alice", authority, peer)):
        for shown in (repr(key), str(key), f"{key}", repr({key: 1})):
            assert "user:alice" in shown and authority[:12] not in shown and cookie[:8] not in shown, shown
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(key)
        with pytest.raises(TypeError, match="cannot be pickled"):
            copy.deepcopy(key)
    assert peer in repr(SessionKey("user:alice", authority, peer))
    assert SessionKey("u", "a", "t") == SessionKey("u", "a", "t") != SessionKey("u", "b", "t")
    assert len({SessionKey("u", "a", "t"), SessionKey("u", "a", "t")}) == 1


def test_an_engine_that_sat_out_another_engines_statements_forgets_its_cached_tables() -> None:
    """Found by review: with metadata_revalidate_seconds > 0 each engine trusts its own load cache for a while,
    and a write through another engine of the same client invalidated only that engine's: the client could miss
    its own write. An engine chosen again after others ran starts with an empty load cache."""
    session = ClientSession(SessionKey("user:alice", "", "s"), _load({}), 1024)
    reader = session.acquire_engine("TOKEN")
    reader.provider._cache[("alice", "demo", "ns.t")] = object()  # type: ignore[assignment]  # a cached load
    writer = session.acquire_engine("TOKEN")  # the first is busy: a second engine
    session.release_engine(writer)  # it wrote
    session.release_engine(session.acquire_engine("TOKEN"), discard=True)  # the same engine, a failed query
    session.release_engine(reader)  # the only engine left
    again = session.acquire_engine("TOKEN")
    assert again is reader and reader.provider._cache == {}
    reader.provider._cache[("alice", "demo", "ns.t")] = object()  # type: ignore[assignment]
    session.release_engine(again)
    last = session.acquire_engine("TOKEN")
    assert last is reader and reader.provider._cache != {}, "nobody else ran: kept"
    session.release_engine(last)
    session.close()


def test_parameter_rows_count_against_one_budget_per_user() -> None:
    """Found by review: the limit was per call and per session, computed before reading, so concurrent DoPuts
    and a user's many session ids each had a whole limit of their own."""
    registry = SessionRegistry(_load({}), None, Limits(4, 2), 1024)  # type: ignore[arg-type]
    budget = ParameterBudget(registry, limit=1000)
    alice, bob = User("user:alice", "A", authority="a"), User("user:bob", "B", authority="b")
    first = registry.resolve(alice, "one", "ipv4:127.0.0.1:1", None)
    second = registry.resolve(alice, "two", "ipv4:127.0.0.1:2", None)
    budget.reserve(first, b"p1", 600, replacing=True)  # a call still receiving its rows
    with pytest.raises(QueryError, match=r"max_parameter_bytes \(1000 bytes, counting 600 bytes you already hold\)"):
        budget.reserve(second, b"p2", 600, replacing=True)  # another call, another session id: the same user
    bob_session = registry.resolve(bob, "one", "ipv4:127.0.0.1:3", None)
    budget.reserve(bob_session, b"p1", 600, replacing=True)  # another user: their own
    rows = pa.table({"v": pa.array(range(50), pa.int64())})  # 400 bytes
    prepared = Prepared("SELECT $1")
    first.add_prepared(b"p1", prepared)
    budget.bind(first, b"p1", prepared, rows, 600)  # the reservation becomes the rows bound
    budget.reserve(second, b"p2", 600, replacing=True)  # 400 bound + 600
    with pytest.raises(QueryError, match="max_parameter_bytes"):
        budget.reserve(second, b"p2", 1, replacing=True)
    budget.reserve(first, b"p1", 400, replacing=True)  # rebinding p1: the 400 bytes it replaces are not counted twice
    budget.release(first, 400)
    with pytest.raises(QueryError, match="max_parameter_bytes"):  # an update's rows are held beside p1's
        budget.reserve(first, b"p1", 400, replacing=False)
    budget.release(second, 600)
    first.close_prepared(b"p1")  # a closed statement's rows no longer count
    budget.reserve(second, b"p2", 1000, replacing=True)
    registry.close()


def test_a_users_client_sessions_are_bounded_and_the_least_recently_used_idle_one_goes() -> None:
    """Found by review: every session id a user sent (``x-sqe-session``) made a client session of its own, each
    keeping an idle engine (a DuckDB database with its threads, ~4 MB) for ``idle_session_seconds``: 200 cheap
    metadata calls of one user held 1,800 threads. A user holds at most MAX_CLIENT_SESSIONS_PER_USER."""
    registry = SessionRegistry(_load({}), None, Limits(4, 2), 1024)  # type: ignore[arg-type]
    alice, bob = User("user:alice", "A", authority="a"), User("user:bob", "B", authority="b")
    bobs = registry.resolve(bob, "s", "ipv4:127.0.0.1:1", None)
    first = registry.resolve(alice, "s-0", "ipv4:127.0.0.1:2", None)
    first.open[b"q"] = _planning(60.0, [])  # a query in progress: never evicted
    for index in range(1, MAX_CLIENT_SESSIONS_PER_USER + 20):
        session = registry.resolve(alice, f"s-{index}", "ipv4:127.0.0.1:2", None)
        session.release_engine(session.acquire_engine("A"))
        session.last_used -= 1000 - index  # idle for a while, the first ones longest
    alices = [s for s in registry.sessions() if s.user_key == alice.key]
    assert len(alices) == MAX_CLIENT_SESSIONS_PER_USER
    assert first in alices and bobs in registry.sessions()  # busy, and another user's: kept
    assert registry.resolve(alice, "s-1", "ipv4:127.0.0.1:2", None) not in alices  # the oldest idle one went
    for session in registry.sessions():
        session.open[b"q"] = _planning(60.0, [])
    with pytest.raises(ServerBusyError, match="client sessions"):
        registry.resolve(alice, "one more", "ipv4:127.0.0.1:2", None)
    for session in registry.sessions():
        session.open.clear()
    registry.close()


def test_an_engine_is_reused_by_its_tokens_whole_digest_which_its_repr_never_shows() -> None:
    """Found by review: engines were matched to the catalog token by 16 hex digits (64 bits): a token sharing them
    with another would have been served an engine built over the other token."""
    session = ClientSession(SessionKey("user:alice", "", "s"), _load({}), 1024)
    engine = session.acquire_engine("TOKEN")
    try:
        assert engine.token_key == hashlib.sha256(b"TOKEN").hexdigest()
        assert engine.token_key not in repr(engine)
    finally:
        session.release_engine(engine, discard=True)


def test_a_session_keys_repr_shows_a_token_users_key_shortened() -> None:
    digest = hashlib.sha256(b"opaque").hexdigest()
    key = SessionKey(f"token:{digest}", "AUTHORITY-DIGEST", "cookie-value")
    assert repr(key) == f"SessionKey(user='token:{digest[:16]}', tag='{key.short_tag}')"
    assert "AUTHORITY-DIGEST" not in repr(key) and "cookie-value" not in repr(key)


def test_a_client_session_holds_its_mount_store_until_closed_and_its_last_engine_gone(tmp_path: Path) -> None:
    """Found by review: a prune run beside the server could delete a store a session was using (its age was read
    before the session marked it). The session holds its store from its first call on one with a store, and lets
    go only once closed and its last engine (which may still read or write the store) is closed."""
    base = tmp_path / "external.db"
    key = SessionKey("user:alice", "roles", "s")
    store = store_path(base, key.user, key.authority)
    session = ClientSession(key, _load({"external_tables.path": str(base)}), 1024)
    first = session.acquire_engine("TOKEN")  # no store yet: nothing to hold
    session.release_engine(first)
    sqlite3.connect(store).close()  # what her CREATE EXTERNAL TABLE makes
    busy = session.acquire_engine("TOKEN")  # the next call takes hold of it
    _age(store)
    assert prune_stores(base, 30).in_use == 1
    session.close()  # closed while a query of hers still runs on ``busy``
    assert prune_stores(base, 30).in_use == 1 and store.exists()
    session.release_engine(busy)
    assert [info.path for info in prune_stores(base, 30).removed] == [store]


def _age(path: Path) -> None:
    then = time.time() - 40 * 86400
    os.utime(path, (then, then))


def test_rows_bound_to_a_statement_closed_meanwhile_are_refused_and_hold_nothing() -> None:
    """Found by review: a DoPut's rows bound to a statement ClosePreparedStatement closed while they arrived
    counted as held for the session's life, shrinking the user's max_parameter_bytes for good."""
    registry = SessionRegistry(_load({}), None, Limits(4, 2), 1024)  # type: ignore[arg-type]
    budget = ParameterBudget(registry, limit=1000)
    session = registry.resolve(User("user:alice", "A", authority="a"), "one", "ipv4:127.0.0.1:1", None)
    prepared = Prepared("SELECT $1")
    session.add_prepared(b"p1", prepared)
    budget.reserve(session, b"p1", 600, replacing=True)  # the DoPut receives its rows ...
    session.close_prepared(b"p1")  # ... while another call closes the statement
    rows = pa.table({"v": pa.array(range(50), pa.int64())})
    with pytest.raises(UnknownHandleError, match="closed while its parameter rows arrived"):
        budget.bind(session, b"p1", prepared, rows, 600)
    assert session.bound_parameter_bytes() == 0 and prepared.parameters is None
    budget.reserve(session, b"p2", 1000, replacing=True)  # the whole limit is the user's again
    registry.close()
