"""``DistributedExecutor``: a scan's file tasks run as fragments on ``sqe-worker`` processes over gRPC.

The coordinator side of ``sqe.worker.v1`` (``proto/sqe/worker/v1/worker.proto``), assembled from its parts:
``fragments`` (planning), ``run`` (scheduling, streaming, resumable retries), ``client`` (gRPC), ``credentials`` (which
sets a ticket carries), ``refresh`` and ``push`` (leases, reloads, pushes) and ``failures`` (error kinds).

Tickets and pushed sets hold secrets: they are never logged, and reprs here name workers and fragments only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import pyarrow as pa

from sqe._counters import Counters
from sqe.catalog.rest import principal_key
from sqe.credentials import (
    CatalogCredentials,
    CredentialSet,
    ScopedFileIO,
    StoragePolicy,
    StorageSettings,
    is_object_store,
    parse_catalog_credentials,
)
from sqe.distributed.coordinator.client import WorkerClient
from sqe.distributed.coordinator.credentials import (
    TableCredentials,
    check_coverage,
    static_set,
    ticket_sets,
    under_settings,
)
from sqe.distributed.coordinator.external import ExternalScanPlan
from sqe.distributed.coordinator.job import ScanJob
from sqe.distributed.coordinator.options import DistributedOptions
from sqe.distributed.coordinator.push import CredentialPusher, PushObserver
from sqe.distributed.coordinator.refresh import CredentialRefresher, RefreshedSets
from sqe.distributed.coordinator.run import ScanRun
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.errors import CredentialError, WorkerError

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask

    from sqe.catalog.base import LoadedTable, TableIdent, TableProvider
    from sqe.config import SQEConfig
    from sqe.planning.planner import ScanPlan

TicketObserver = Callable[[str, pb.ScanTicket], None]
BatchObserver = Callable[[str, str, int], None]  # worker address, fragment id, rows forwarded


@dataclass
class CoordinatorStats(Counters):
    """Counters of one executor (tests and benchmarks); never a secret."""

    fragments_started: int = 0
    fragments_completed: int = 0
    fragments_retried: int = 0
    pushes_sent: int = 0  # RefreshCredentials calls a worker answered
    pushes_refused: int = 0  # ... and refused (other than for having no fragment of the scope running)
    credential_endpoint_calls: int = 0  # refreshes answered by the table's /credentials endpoint
    table_reloads: int = 0  # refreshes by a full load-table (no /credentials endpoint advertised)
    fragments_resumed: int = 0  # retries of fragments that had already forwarded rows (those rows skipped)
    batches_forwarded: int = 0  # batches handed to the consumer as they arrived
    rows_forwarded: int = 0
    rows_skipped: int = 0  # rows a retry sent again that had been forwarded already (dropped, by position)


class DistributedExecutor:
    """Runs scans on ``[coordinator] workers`` for one user's session."""

    def __init__(
        self,
        config: SQEConfig,
        provider: TableProvider,
        options: DistributedOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        coordinator = config.coordinator
        if not coordinator.workers:
            raise WorkerError("distributed execution needs [coordinator] workers")
        token = coordinator.token_value()
        if not token:
            raise WorkerError("distributed execution needs [coordinator] token")
        self.config = config
        self.policy = StoragePolicy.from_config(config)
        self.options = options or DistributedOptions()
        self._provider = provider
        self._clock = clock
        self.clients = [
            WorkerClient(
                address,
                token,
                tls_ca=coordinator.tls_ca,
                max_message_bytes=self.options.max_message_bytes,
                keepalive=(self.options.keepalive_seconds, self.options.keepalive_timeout_seconds),
                probe_timeout=self.options.rpc_timeout_seconds,
            )
            for address in coordinator.workers
        ]
        self._by_address = {client.address: client for client in self.clients}
        self.stats = CoordinatorStats()
        self.pusher = CredentialPusher(self._by_address, self.stats, self.options.rpc_timeout_seconds)
        self.refresher = CredentialRefresher(self.pusher.push, clock=clock)
        self.pusher.held_secrets = self.refresher.held_secrets  # a refusal never quotes a ticket's or older keys
        self.ticket_observers: list[TicketObserver] = []  # test hook: every ticket actually sent
        self.push_observers: list[PushObserver] = self.pusher.observers  # test hook: every push actually sent
        self.batch_observers: list[BatchObserver] = []  # test hook: every batch handed to the consumer
        self._closed = False

    def __repr__(self) -> str:
        return f"DistributedExecutor(workers={[c.address for c in self.clients]!r})"

    def client_for(self, address: str) -> WorkerClient:
        return self._by_address[address]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.refresher.close()
        for client in self.clients:
            client.close()

    # -- credentials -----------------------------------------------------------------------------------

    def table_credentials(self, plan: ScanPlan | ExternalScanPlan) -> TableCredentials:
        """The sets the tickets of ``plan`` may carry under ``distributed_credentials``; fails early and clearly.

        An external table's plan carries its own: the mount's keys or the ``[storage]`` pair (source ``static``),
        whatever ``distributed_credentials`` says (there is no catalog to vend for it)."""
        if isinstance(plan, ExternalScanPlan):
            return plan.credentials
        return self.credentials_for(plan.ident, plan.loaded, plan.tasks)

    def credentials_for(
        self, ident: TableIdent, loaded: LoadedTable, tasks: Sequence[FileScanTask]
    ) -> TableCredentials:
        """The sets tickets reading ``tasks`` of ``loaded`` may carry (scans and compaction rewrites alike)."""
        mode = self.config.coordinator.distributed_credentials
        if mode == "static":
            static = static_set(self.policy)
            if static is None and any(is_object_store(task.file.file_path) for task in tasks):
                raise CredentialError(
                    f'{ident}: coordinator.distributed_credentials is "static" but [storage] has no '
                    "access_key_id/secret_access_key pair to give the workers"
                )
            return TableCredentials(ident, None, (), static)
        location = loaded.table.metadata.location
        found, received = self._loaded_sets(loaded)
        vended = ticket_sets(found, location, self.policy, received, "load-table")
        fallback = static_set(self.policy) if mode == "auto" else None
        require = self.policy.require_vended
        check_coverage(ident, tasks, vended, fallback, mode, require)
        if not vended.credentials or not self.config.coordinator.push_credentials:
            return TableCredentials(ident, None, vended.credentials, fallback)
        user = principal_key(self.config.catalog.connection(ident.warehouse))
        reloader = self._reloader(ident, location, self._loaded_settings(loaded))
        lease = self.refresher.lease(user, ident, vended.credentials, vended.usable_until, reloader)
        return TableCredentials(ident, lease, (), fallback)

    def _loaded_sets(self, loaded: LoadedTable) -> tuple[tuple[CredentialSet, ...], float]:
        """The sets the table was loaded with (parsed once, by its FileIO) and when they arrived."""
        if isinstance(loaded.io, ScopedFileIO):
            return loaded.io.credential_sets, loaded.io.received_at
        return parse_catalog_credentials(loaded.raw).sets, self._clock()

    def _loaded_settings(self, loaded: LoadedTable) -> StorageSettings:
        """The load-table answer's response-wide settings (its ``config``: endpoint, region, path style)."""
        if isinstance(loaded.io, ScopedFileIO):
            return loaded.io.settings
        return parse_catalog_credentials(loaded.raw).settings

    def _reloader(self, ident: TableIdent, location: str, loaded: StorageSettings) -> Callable[[], RefreshedSets]:
        def reload() -> RefreshedSets:
            found = self._credentials_endpoint(ident)
            source = "credentials-endpoint"
            if found is not None:
                # Keys only, often: the load's endpoint, region and path style stay under them, as locally.
                found = under_settings(found, loaded)
            else:
                found = parse_catalog_credentials(self._provider.load_table(ident, bypass_cache=True).raw)
                source = "load-table"
                self.stats.add(table_reloads=1)
            return ticket_sets(found.sets, location, self.policy, self._clock(), source)

        return reload

    def _credentials_endpoint(self, ident: TableIdent) -> CatalogCredentials | None:
        """The table's credentials endpoint as the user, when its catalog advertises one; None: reload instead."""
        found = self._provider.load_table_credentials(ident)
        if found is not None:
            self.stats.add(credential_endpoint_calls=1)
        return found

    # -- diagnostics -----------------------------------------------------------------------------------

    def worker_stats(self) -> dict[str, pb.StatsResponse]:
        """Each reachable worker's counters."""
        found: dict[str, pb.StatsResponse] = {}
        for client in self.clients:
            try:
                found[client.address] = client.stats(timeout=self.options.rpc_timeout_seconds)
            except grpc.RpcError:
                continue
        return found

    def record_batches(self, job: ScanJob) -> Generator[pa.RecordBatch]:
        """Stream the job's restricted batches from the workers (fragment order is not preserved): the rows its
        WHERE keeps, or its partial plan's partial-aggregate rows."""
        return ScanRun(self, job).batches()
