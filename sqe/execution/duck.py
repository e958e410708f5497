"""DuckDB helpers for sessions: the locked-down connection (``sqe._duckdb``) and identifier quoting."""

from __future__ import annotations

from sqe._duckdb import LOCKDOWN_CONFIG, connect_locked_down

__all__ = ["LOCKDOWN_CONFIG", "connect_locked_down", "quote_ident", "quote_qualified"]


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_qualified(*parts: str) -> str:
    return ".".join(quote_ident(p) for p in parts)
