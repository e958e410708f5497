"""Executing scans: the local bounded-thread-pool reader and the Arrow streams DuckDB consumes.

The names below are loaded on first access, so importing one submodule (e.g. ``external`` for a file table
function) does not import the pyiceberg-based reader (start-up cost).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqe.execution.local import LocalExecutor, QueryCancelledError, ScanMetrics
    from sqe.execution.stream import QueryContext, ScanStream

__all__ = ["LocalExecutor", "QueryCancelledError", "QueryContext", "ScanMetrics", "ScanStream"]
_HOME = {
    "LocalExecutor": "sqe.execution.local",
    "QueryCancelledError": "sqe.execution.local",
    "ScanMetrics": "sqe.execution.local",
    "QueryContext": "sqe.execution.stream",
    "ScanStream": "sqe.execution.stream",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
