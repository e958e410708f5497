"""The DuckDB databases partial aggregation runs in: one per running fragment, each within its own limits.

DuckDB's memory and spill limits are per database, and within one database its buffers go to whichever query
asks first: with one database shared by every fragment (as before), one user's high-cardinality GROUP BY took
the memory its neighbours' fragments needed, and they failed out of memory, or filled the disk with its spill.
So a worker keeps up to ``max_fragments`` databases, each with ``--aggregate-memory-bytes``, ``--aggregate-threads``
and ``--aggregate-spill-bytes`` (by default its share of half the memory, or of the control group's limit, and of
half the spill disk's free space), lends each to one fragment at a time and reuses it (opening one costs about
25 ms). A fragment past its database's limits fails alone (``resource-limit``); the others keep theirs. Each
database spills into a private directory of its own (``sqe.duckdb_connection``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from sqe._machine import memory_share, spill_share
from sqe.distributed.protocol.partial import DUCKDB_THREADS, open_database
from sqe.duckdb_connection import DatabaseLimits, close_at_exit, spill_disk_free_bytes
from sqe.execution.local import QueryCancelledError

_WAIT_SECONDS = 0.25  # how often a fragment waiting for a database looks at its cancel flag


def default_limits(
    max_fragments: int, memory_bytes: int | None = None, threads: int | None = None, spill_bytes: int | None = None
) -> DatabaseLimits:
    """Each fragment's database limits: those given, else its share (``max_fragments`` run at once) of half the
    memory (or of the control group's limit when less) and of half the spill disk's free space at start. One
    thread as measured (``DUCKDB_THREADS``): DuckDB's threads compete with the fragment's reader threads."""
    if memory_bytes is None:
        memory_bytes = memory_share(max_fragments)
    if spill_bytes is None:
        spill_bytes = spill_share(spill_disk_free_bytes(), max_fragments)
    return DatabaseLimits(memory_bytes=memory_bytes, threads=threads or DUCKDB_THREADS, spill_bytes=spill_bytes)


class AggregateDatabases:
    """Up to ``count`` databases within ``limits``, each lent to one fragment at a time (opened when first needed).

    A fragment's registry slot (``max_fragments``) is freed when its call ends, a moment before its aggregation
    thread gives its database back; a fragment that finds none free meanwhile waits, until its cancel flag."""

    def __init__(self, limits: DatabaseLimits, count: int) -> None:
        self.limits = limits
        self._count = count
        self._free: list[duckdb.DuckDBPyConnection] = []
        self._opened = 0
        self._changed = threading.Condition()

    @contextmanager
    def lent(self, cancel: threading.Event) -> Iterator[duckdb.DuckDBPyConnection]:
        database = self._take(cancel)
        try:
            yield database
        finally:
            self._give_back(database)

    def _give_back(self, database: duckdb.DuckDBPyConnection) -> None:
        """Into the pool if it still answers; else closed, and a new one opened when next needed. A database that
        DuckDB invalidated (a fatal error) or that was closed fails every later statement: lent again, it would
        fail every fragment after the one that broke it."""
        usable = _answers(database)
        with self._changed:
            if usable:
                self._free.append(database)
            else:
                self._opened -= 1
            self._changed.notify()
        if not usable:
            with contextlib.suppress(duckdb.Error):
                database.close()

    def _take(self, cancel: threading.Event) -> duckdb.DuckDBPyConnection:
        with self._changed:
            while not self._free and self._opened >= self._count:
                if cancel.is_set():
                    raise QueryCancelledError()
                self._changed.wait(_WAIT_SECONDS)
            if self._free:
                return self._free.pop()
            self._opened += 1
        try:  # opened outside the lock: another fragment need not wait for it
            database = open_database(self.limits)
        except BaseException:
            with self._changed:
                self._opened -= 1
                self._changed.notify()
            raise
        close_at_exit(database)  # DuckDB removes its spill directory when it closes
        return database

    def describe(self) -> str:
        limits = self.limits
        return f"memory {limits.memory_bytes} bytes, spill {limits.spill_bytes} bytes, {limits.threads} thread(s)"


def _answers(database: duckdb.DuckDBPyConnection) -> bool:
    try:
        database.execute("SELECT 1").fetchall()
    except duckdb.Error:
        return False
    return True
