"""Tuning of distributed scans (the worker list, token and TLS come from ``[coordinator]``)."""

from __future__ import annotations

from dataclasses import dataclass

MIN_KEEPALIVE_SECONDS = 2.0
MIN_HEARTBEAT_SECONDS = 0.05


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
    # Workers send a progress heartbeat after each such interval in which a fragment progressed but had nothing
    # to send (0: not asked); a stream of a worker that keeps them, silent for stall_heartbeats intervals, is
    # stalled: it is cancelled and its fragment retried elsewhere. Five minutes by default: progress counts per
    # read, and one large column chunk on a slow link (128 MiB at 1 MB/s) is a read of over two minutes.
    heartbeat_seconds: float = 5.0
    stall_heartbeats: int = 60
    # HTTP/2 keepalive of the worker channels: a ping this often, the connection dropped when its answer takes
    # longer than keepalive_timeout_seconds (a worker lost to a partition fails its calls instead of hanging).
    keepalive_seconds: float = 30.0
    keepalive_timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        positive = ("slots_per_worker", "max_files_per_fragment", "max_bytes_per_fragment", "max_attempts")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"DistributedOptions.{name} must be at least 1")
        if self.stall_heartbeats < 2:
            raise ValueError("DistributedOptions.stall_heartbeats must be at least 2")
        if not (self.heartbeat_seconds == 0 or MIN_HEARTBEAT_SECONDS <= self.heartbeat_seconds <= 3600):
            raise ValueError(f"DistributedOptions.heartbeat_seconds must be 0 or from {MIN_HEARTBEAT_SECONDS} to 3600")
        # Workers refuse pings more often than once a second (GOAWAY too_many_pings): stay well clear of it.
        if self.keepalive_seconds < MIN_KEEPALIVE_SECONDS:
            raise ValueError(f"DistributedOptions.keepalive_seconds must be at least {MIN_KEEPALIVE_SECONDS}")
        if self.keepalive_timeout_seconds <= 0:
            raise ValueError("DistributedOptions.keepalive_timeout_seconds must be positive")
