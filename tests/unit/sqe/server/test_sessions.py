"""OpenQuery's wait for its DoGet (issue 17): when a result nobody fetched counts as abandoned, and when not."""

from __future__ import annotations

import time

import pyarrow as pa

from sqe.server.sessions import OpenQuery, _user_config
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
        {"name": "inherited"},
        {"name": "elsewhere", "uri": "http://127.0.0.1:9999", "client_id": "x", "client_secret": "y"},
    ]
    identity = {"catalog.client_id": "server", "catalog.client_secret": "SERVER-SECRET"}
    reader = {"catalog.reader_client_id": "reader", "catalog.reader_client_secret": "READER-SECRET"}
    base = _load({**identity, **reader, "catalog.warehouses": siblings})
    config = _user_config(base, "USER-TOKEN", "user:alice")
    assert config.catalog.warehouse_names == ("demo", "same", "inherited")
    for name in config.catalog.warehouse_names:
        connection = config.catalog.connection(name)
        assert connection.uri.rstrip("/") == "http://127.0.0.1:8181"
        assert connection.token is not None and connection.token.get_secret_value() == "USER-TOKEN"
        assert connection.reader_client_id is None and connection.client_id is None
