"""The console's statement runner: a Ctrl-C cancels the query and returns only once the query has let go of the
session, so the caller may close it at once."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

import pytest

from sqe.console import run_with_progress
from sqe.session import Session
from tests.unit.sqe.iceberg_local import LocalProvider

HEAVY = "SELECT count(*) FROM ns.numbers a, ns.numbers b, ns.numbers c WHERE a.id + b.id + c.id = -1"


def test_ctrl_c_returns_after_the_query_has_stopped(
    provider: LocalProvider, session_factory: Callable[..., Session]
) -> None:
    session = session_factory(provider)
    # A real SIGINT, as a terminal sends it: Python raises KeyboardInterrupt in the main thread wherever it waits.
    # Python's own handler is put in place for the test: a run started from a background shell inherits SIGINT
    # ignored, and the signal would then be dropped while the query ran on.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_with_progress(session, HEAVY)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    # The query's thread holds the session's lock while DuckDB runs it: free now means the query has ended.
    assert session._lock.acquire(blocking=False)
    session._lock.release()
    assert session.sql("SELECT 1 AS one").arrow().to_pylist() == [{"one": 1}]
