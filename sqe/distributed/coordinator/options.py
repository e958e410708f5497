"""Tuning of distributed scans (the worker list, token and TLS come from ``[coordinator]``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DistributedOptions:
    """Tuning of distributed scans (the worker list, token and TLS come from ``[coordinator]``)."""

    slots_per_worker: int = 2  # fragments one worker runs at a time for one scan
    max_files_per_fragment: int = 4  # small fragments: a retry re-reads little
    max_bytes_per_fragment: int = 128 * 1024 * 1024
    max_attempts: int = 3  # per fragment, across workers
    max_message_bytes: int = 64 * 1024 * 1024  # gRPC send/receive limit (at least the workers' limit)
    max_queued_batches: int = 8  # forwarded batches waiting for DuckDB
    idle_timeout_seconds: float = 30.0  # a stream silent this long gets its worker health-checked
    rpc_timeout_seconds: float = 5.0  # Cancel, RefreshCredentials, Health, Stats
    busy_retry_seconds: float = 0.2  # a worker at capacity: try again after this long
    poll_seconds: float = 0.05
    pace_ms_per_file: int = 0  # test only: ask workers to sleep before each file
    rewrite_timeout_seconds: float = 3600.0  # one compaction bin on one worker

    def __post_init__(self) -> None:
        positive = ("slots_per_worker", "max_files_per_fragment", "max_bytes_per_fragment", "max_attempts")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"DistributedOptions.{name} must be at least 1")
