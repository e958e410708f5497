"""The coordinator side of distributed scans: fragments, scheduling, gRPC client, credential push, errors."""

from sqe.distributed.coordinator.client import WorkerClient
from sqe.distributed.coordinator.credentials import TableCredentials, static_set, ticket_sets
from sqe.distributed.coordinator.executor import CoordinatorStats, DistributedExecutor
from sqe.distributed.coordinator.fragments import Fragment, plan_fragments
from sqe.distributed.coordinator.options import DistributedOptions
from sqe.distributed.coordinator.refresh import key_fingerprint
from sqe.distributed.coordinator.stream import DistributedScanStream

__all__ = [
    "CoordinatorStats",
    "DistributedExecutor",
    "DistributedOptions",
    "DistributedScanStream",
    "Fragment",
    "TableCredentials",
    "WorkerClient",
    "key_fingerprint",
    "plan_fragments",
    "static_set",
    "ticket_sets",
]
