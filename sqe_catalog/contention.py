"""How a claim of places is tried again while other catalog processes' claims keep committing behind its checks.

A claim (``WarehouseTables._claimed``) checks its places, then records them in a transaction that rolls back with
``ClaimRaced`` when another process's claim committed meanwhile: nothing was recorded, and the metadata file the
attempt wrote is gone (``removed_if_raced``). So it is simply made again, checked afresh, after a short random
pause (jittered exponential backoff: processes that collided once do not collide again in step). It gives up
after a few attempts and a bounded time, whichever comes later of ``MIN_ATTEMPTS`` and ``PATIENCE_SECONDS``
(never more than ``MAX_ATTEMPTS``): the request's client waits meanwhile. What it answers then is the caller's
choice (``GaveUp``): the Iceberg REST clients read the same status differently per route.

A claim whose request's client disconnected is not made again (``CLIENT_LEFT``): no one will read its answer,
and its thread is one of the catalog's few for writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from sqe_catalog.errors import CatalogError, ClaimRaced

__all__ = ["CLIENT_LEFT", "MAX_ATTEMPTS", "MIN_ATTEMPTS", "PATIENCE_SECONDS", "GaveUp", "retried_claim"]

log = logging.getLogger("sqe_catalog.contention")

# Attempts in all: at least MIN_ATTEMPTS (a slow store must not make the first loss final), then until
# PATIENCE_SECONDS have passed since the first began, at most MAX_ATTEMPTS. Two processes of 4 busy threads each
# on 2 cores: a move (a longer claim than a create, so it loses more often) took up to 7 attempts over 3 s; 3 s
# and 8 attempts left 12 of 200 moves refused, 10 s and 16 none of 400.
MIN_ATTEMPTS = 3
MAX_ATTEMPTS = 16
PATIENCE_SECONDS = 10.0
# The pause before attempt n+1 is uniform in [0, min(BACKOFF_BASE_SECONDS * 2**(n-1), BACKOFF_CAP_SECONDS)].
BACKOFF_BASE_SECONDS = 0.05
BACKOFF_CAP_SECONDS = 0.5

_T = TypeVar("_T")
# The error a claim that gave up raises, given how many attempts it made.
GaveUp = Callable[[int], CatalogError]
# Set by the request's handler (sqe_catalog.api) when its client disconnects; None outside a request.
CLIENT_LEFT: ContextVar[threading.Event | None] = ContextVar("sqe_catalog_client_left", default=None)


class _ClientLeft(Exception):
    pass


def retried_claim(attempt: Callable[[], _T], gave_up: GaveUp, *, sleep: Callable[[float], None] = time.sleep) -> _T:
    """``attempt()`` (one claim section), made again after each ``ClaimRaced``; ``gave_up(attempts)`` raised when
    the attempts are spent, or after a lost attempt once the request's client has left (``CLIENT_LEFT``; a pause
    ends then too). Any other error ends it at once, as it is. ``sleep`` pauses between attempts outside a request
    (unit tests of the attempt count pass one that returns at once)."""
    left = CLIENT_LEFT.get()
    attempts = 0

    def attempt_while_awaited() -> _T:
        nonlocal attempts
        if attempts and left is not None and left.is_set():  # the first attempt is made whatever happens
            raise _ClientLeft
        attempts += 1
        return attempt()

    def pause(seconds: float) -> None:
        if left is None:
            sleep(seconds)
        else:
            left.wait(seconds)  # ends early when the client leaves

    def give_up(state: RetryCallState) -> _T:
        log.warning("a claim of places lost to other catalog processes' claims %d times; gave up", state.attempt_number)
        raise gave_up(state.attempt_number) from None

    retrying = Retrying(
        retry=retry_if_exception_type(ClaimRaced),
        stop=stop_after_attempt(MAX_ATTEMPTS) | (stop_after_attempt(MIN_ATTEMPTS) & stop_after_delay(PATIENCE_SECONDS)),
        wait=wait_random_exponential(multiplier=BACKOFF_BASE_SECONDS, max=BACKOFF_CAP_SECONDS),
        retry_error_callback=give_up,
        sleep=pause,
    )
    try:
        result: _T = retrying(attempt_while_awaited)
    except _ClientLeft:
        log.info("a claim of places lost to other catalog processes' claims %d times; its client left", attempts)
        raise gave_up(attempts) from None
    return result
