"""``retried_claim``: a claim section made again after each lost race, and what it raises once it gives up.

The claim sections here are plain functions that lose (``ClaimRaced``) a given number of times; the end-to-end
behaviour against the real catalog is in ``tests/e2e/test_catalog_claim_contention.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from sqe_catalog.contention import CLIENT_LEFT, MAX_ATTEMPTS, MIN_ATTEMPTS, retried_claim
from sqe_catalog.errors import (
    CatalogError,
    ClaimContendedError,
    ClaimRaced,
    CommitFailedError,
    ForbiddenError,
    NotAuthorizedError,
)


def losing(times: int, calls: list[int]) -> Callable[[], str]:
    """A claim section that loses its race ``times`` times, then claims; ``calls`` counts its runs."""

    def attempt() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise ClaimRaced("claimed concurrently; retry")
        return "claimed"

    return attempt


def no_pause(_seconds: float) -> None:
    """The pause between attempts, skipped: these tests count attempts, the backoff is tenacity's."""


def never_called(attempts: int) -> CatalogError:
    raise AssertionError(f"gave up after {attempts} attempts")


def test_a_claim_that_lost_a_few_races_is_made_again_until_it_holds() -> None:
    calls: list[int] = []
    assert retried_claim(losing(MIN_ATTEMPTS, calls), never_called, sleep=no_pause) == "claimed"
    assert len(calls) == MIN_ATTEMPTS + 1


def test_a_claim_that_keeps_losing_raises_what_the_caller_chose_with_the_attempts_made() -> None:
    calls: list[int] = []
    given_up: list[int] = []

    def gave_up(attempts: int) -> CatalogError:
        given_up.append(attempts)
        return CommitFailedError(f"gave up after {attempts} attempts")

    with pytest.raises(CommitFailedError) as raised:
        retried_claim(losing(10 * MAX_ATTEMPTS, calls), gave_up, sleep=no_pause)
    assert type(raised.value) is CommitFailedError  # not the ClaimRaced it lost with
    assert given_up == [len(calls)]
    assert MIN_ATTEMPTS <= len(calls) <= MAX_ATTEMPTS


def test_any_other_failure_ends_the_claim_at_once() -> None:
    calls: list[int] = []

    def refused() -> str:
        calls.append(1)
        raise ForbiddenError("overlaps a dropped table")

    with pytest.raises(ForbiddenError):
        retried_claim(refused, never_called, sleep=no_pause)
    assert calls == [1]


def test_a_contended_create_asks_the_client_to_retry_later_and_a_401_carries_its_challenge() -> None:
    contended = ClaimContendedError("create of table ns.t not applied")
    assert contended.status == 503 and contended.to_json()["error"]["type"] == "ServiceUnavailableException"
    assert int(contended.headers()["Retry-After"]) > 0
    assert NotAuthorizedError("expired").headers() == {"WWW-Authenticate": "Bearer"}
    assert CommitFailedError("lost").headers() == {}


def test_a_claim_whose_client_left_is_not_made_again_after_it_lost() -> None:
    left = threading.Event()
    calls: list[int] = []
    given_up: list[int] = []

    def losing_while_the_client_leaves() -> str:
        calls.append(1)
        if len(calls) == 2:
            left.set()  # the request's handler saw the client disconnect
        raise ClaimRaced("claimed concurrently; retry")

    def gave_up(attempts: int) -> CatalogError:
        given_up.append(attempts)
        return ClaimContendedError(f"gave up after {attempts} attempts")

    token = CLIENT_LEFT.set(left)
    try:
        with pytest.raises(ClaimContendedError):
            retried_claim(losing_while_the_client_leaves, gave_up)
    finally:
        CLIENT_LEFT.reset(token)
    assert calls == [1, 1] and given_up == [2]


def test_a_claim_whose_client_left_before_it_began_is_still_made_once() -> None:
    left = threading.Event()
    left.set()
    calls: list[int] = []
    token = CLIENT_LEFT.set(left)
    try:
        assert retried_claim(losing(0, calls), never_called) == "claimed"
    finally:
        CLIENT_LEFT.reset(token)
    assert calls == [1]
