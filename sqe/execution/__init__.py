"""Executing scans: the local bounded-thread-pool reader and the Arrow streams DuckDB consumes."""

from sqe.execution.local import LocalExecutor, QueryCancelledError, ScanMetrics
from sqe.execution.stream import QueryContext, ScanStream

__all__ = ["LocalExecutor", "QueryCancelledError", "QueryContext", "ScanMetrics", "ScanStream"]
