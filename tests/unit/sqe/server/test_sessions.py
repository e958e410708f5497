"""OpenQuery's wait for its DoGet (issue 17): when a result nobody fetched counts as abandoned, and when not."""

from __future__ import annotations

import time

import pyarrow as pa

from sqe.server.sessions import OpenQuery


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
