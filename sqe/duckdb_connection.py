"""DuckDB connections locked down for SQE (see reference/libraries.md section 5), and identifier quoting.

No file system or network access, no extension installs or auto-loading, no replacement scans of Python
variables, and the configuration locked so no statement can undo any of it. Registered Arrow objects still work.
Used by SQL sessions and by the restriction kernels' private hashing connection, so it sits below both
(``sqe.restrictions`` must not import ``sqe.execution``).
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb

__all__ = ["LOCKDOWN_CONFIG", "connect_locked_down", "quote_ident", "quote_qualified"]

LOCKDOWN_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
}


def connect_locked_down(
    before_lock: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
) -> duckdb.DuckDBPyConnection:
    """An in-memory connection; ``before_lock`` may still change settings before the configuration is locked.
    Its cursors (``con.cursor()``) share the database and its locked settings, each with its own temporary
    schema, so an Arrow object registered on one connection is not visible to another."""
    con = duckdb.connect(":memory:", config=LOCKDOWN_CONFIG)
    try:
        # GLOBAL: also the value of every cursor of this database (a per-connection setting, which a cursor made
        # after the lock below could no longer change)
        con.execute("SET GLOBAL python_enable_replacements = false")
        if before_lock is not None:
            before_lock(con)
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_qualified(*parts: str) -> str:
    return ".".join(quote_ident(p) for p in parts)
