"""Distributed execution: a scan's file tasks run as fragments on ``sqe-worker`` processes over gRPC.

The coordinator side of ``sqe.worker.v1`` (``proto/sqe/worker/v1/worker.proto``):

- **Fragments.** A plan's file tasks are split into small fragments (a few files, bounded bytes), balanced by
  bytes: tasks go largest first into the lightest fragment. Each worker runs a few fragments at a time and takes
  the largest waiting one when a slot frees up (longest-processing-time-first list scheduling).
- **Tickets.** A fragment's ticket carries the trimmed table metadata, its file tasks, the read schema, output
  field ids, the pushed row filter, the validated restriction plan, the query's salt and the credential sets
  ``[coordinator] distributed_credentials`` allows: ``vended`` (only catalog-vended sets; a table without them
  fails), ``static`` (the ``[storage]`` pair) or ``auto`` (vended when present, else static).
- **No duplicate rows.** A fragment's batches are held on the coordinator until its stream ends with
  ``complete``; only then are they handed to DuckDB. A fragment that fails (worker killed, unreachable, silent)
  is retried from scratch on another worker, so nothing it sent before is ever forwarded. The price is memory:
  up to one fragment's output per running fragment, which is why fragments stay small (``max_files_per_fragment``,
  ``max_bytes_per_fragment``).
- **Credentials.** Each running fragment is registered with the table's lease (``sqe.execution.refresh``), which
  reloads the table as the querying user before the usable point and pushes the new set to the workers.
- **Cancel and progress.** Cancelling the query cancels its calls and sends ``Cancel``; per-fragment ``progress``
  messages feed the query's ``ScanMetrics`` (the CLI progress bar).

Tickets and pushed sets hold secrets: they are never logged, and reprs here name workers and fragments only.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, cast

import grpc
import pyarrow as pa
import requests
from pyiceberg.catalog.rest import Capability

from sqe.catalog.rest import error_for_status, principal_key
from sqe.credentials import is_object_store, prefix_matches, usable_until
from sqe.errors import (
    CatalogUnavailableError,
    CredentialError,
    CredentialExpiredError,
    NoVendedCredentialsError,
    QueryError,
    RestrictionError,
    SQEError,
    WorkerError,
)
from sqe.execution.local import QueryCancelledError, ScanMetrics
from sqe.execution.refresh import CredentialRefresher, Holder, RefreshedSets, TableLease, key_fingerprint
from sqe.execution.stream import QueryContext, conform_batch
from workers._proto import worker_pb2 as pb
from workers._proto import worker_pb2_grpc as pb_grpc
from workers.errors import (
    ERROR_KIND_KEY,
    KIND_BUSY,
    KIND_CREDENTIAL_EXPIRED,
    KIND_DUPLICATE_FRAGMENT,
    KIND_INVALID_TICKET,
    KIND_MESSAGE_TOO_LARGE,
    KIND_NO_CREDENTIALS,
    KIND_READ_FAILED,
    KIND_RESTRICTION,
)
from workers.ipc import decode_batch, decode_schema
from workers.ticket import (
    StorageOptions,
    TableRef,
    TicketCredentials,
    build_ticket,
    credential_sets_from_load_table,
    trim_metadata,
)

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask

    from sqe.catalog.base import TableIdent, TableProvider
    from sqe.config import SQEConfig
    from sqe.planning.planner import ScanPlan

log = logging.getLogger(__name__)

_CREDENTIALS_CAPABILITY = str(Capability.V1_LOAD_CREDENTIALS)  # advertised in /v1/config "endpoints"
_NOTHING_RUNNING = "no running fragment"  # a RefreshResponse reason that is a race, not a refusal
_FATAL_KINDS = {
    KIND_CREDENTIAL_EXPIRED: CredentialExpiredError,
    KIND_NO_CREDENTIALS: CredentialError,
    KIND_RESTRICTION: RestrictionError,
    KIND_INVALID_TICKET: WorkerError,
    KIND_MESSAGE_TOO_LARGE: WorkerError,
}


# ------------------------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class DistributedOptions:
    """Tuning of distributed scans (the worker list, token and TLS come from ``[coordinator]``)."""

    slots_per_worker: int = 2  # fragments one worker runs at a time for one scan
    max_files_per_fragment: int = 4  # small fragments: a retry re-reads little, the hold-back buffer stays small
    max_bytes_per_fragment: int = 128 * 1024 * 1024
    max_attempts: int = 3  # per fragment, across workers
    max_message_bytes: int = 64 * 1024 * 1024  # gRPC send/receive limit (at least the workers' limit)
    max_queued_batches: int = 8  # committed batches waiting for DuckDB
    idle_timeout_seconds: float = 30.0  # a stream silent this long gets its worker health-checked
    rpc_timeout_seconds: float = 5.0  # Cancel, RefreshCredentials, Health, Stats
    busy_retry_seconds: float = 0.2  # a worker at capacity: try again after this long
    poll_seconds: float = 0.05
    pace_ms_per_file: int = 0  # test only: ask workers to sleep before each file

    def __post_init__(self) -> None:
        positive = ("slots_per_worker", "max_files_per_fragment", "max_bytes_per_fragment", "max_attempts")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"DistributedOptions.{name} must be at least 1")


# ----------------------------------------------------------------------------------------------- fragments


@dataclass(frozen=True)
class Fragment:
    index: int
    tasks: tuple[FileScanTask, ...] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return sum(task.file.file_size_in_bytes for task in self.tasks)

    @property
    def files(self) -> int:
        return len(self.tasks)


def plan_fragments(tasks: Sequence[FileScanTask], *, workers: int, max_files: int, max_bytes: int) -> list[Fragment]:
    """Split tasks into fragments balanced by bytes (largest task first into the lightest fragment).

    There are enough fragments that none needs more than ``max_files`` files or ``max_bytes`` bytes on average,
    and at least one per worker when there are enough files. Returned largest first.
    """
    if not tasks:
        return []
    total = sum(task.file.file_size_in_bytes for task in tasks)
    count = max(math.ceil(len(tasks) / max_files), math.ceil(total / max_bytes), min(workers, len(tasks)))
    count = min(count, len(tasks))
    bins: list[list[FileScanTask]] = [[] for _ in range(count)]
    loads = [0] * count
    for task in sorted(tasks, key=lambda t: (-t.file.file_size_in_bytes, t.file.file_path)):
        lightest = min(range(count), key=lambda i: (loads[i], len(bins[i]), i))
        bins[lightest].append(task)
        loads[lightest] += task.file.file_size_in_bytes
    ordered = sorted(range(count), key=lambda i: -loads[i])
    return [Fragment(n, tuple(bins[i])) for n, i in enumerate(ordered)]


# ------------------------------------------------------------------------------------------------- workers


class WorkerClient:
    """One worker's channel and stub; every call carries the coordinator's bearer token."""

    def __init__(self, address: str, token: str, *, tls_ca: str | None, max_message_bytes: int) -> None:
        self.address = address
        self._metadata = (("authorization", f"Bearer {token}"),)
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        if tls_ca:
            with open(tls_ca, "rb") as fh:
                credentials = grpc.ssl_channel_credentials(root_certificates=fh.read())
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub: Any = pb_grpc.WorkerStub(self._channel)

    def __repr__(self) -> str:
        return f"WorkerClient({self.address!r})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("worker clients hold the coordinator's token and cannot be pickled")

    def execute(self, ticket: pb.ScanTicket) -> Any:
        """The streaming call (iterable of ``ExecuteResponse``; ``cancel()`` ends it from another thread)."""
        return self._stub.Execute(ticket, metadata=self._metadata)

    def refresh(self, request: pb.RefreshRequest, timeout: float) -> pb.RefreshResponse:
        return cast(
            pb.RefreshResponse, self._stub.RefreshCredentials(request, metadata=self._metadata, timeout=timeout)
        )

    def cancel(self, request: pb.CancelRequest, timeout: float) -> pb.CancelResponse:
        return cast(pb.CancelResponse, self._stub.Cancel(request, metadata=self._metadata, timeout=timeout))

    def health(self, timeout: float) -> pb.HealthResponse:
        return cast(pb.HealthResponse, self._stub.Health(pb.HealthRequest(), metadata=self._metadata, timeout=timeout))

    def stats(self, timeout: float) -> pb.StatsResponse:
        return cast(pb.StatsResponse, self._stub.Stats(pb.StatsRequest(), metadata=self._metadata, timeout=timeout))

    def close(self) -> None:
        self._channel.close()


# ------------------------------------------------------------------------------------------- credentials


def coordinator_storage(catalog: StorageOptions, config: SQEConfig) -> StorageOptions:
    """The settings a set is used with: SQE's own ``[storage]`` settings win over the catalog's (as locally)."""
    storage = config.storage
    return StorageOptions(
        endpoint=storage.endpoint or catalog.endpoint,
        region=storage.region or catalog.region or storage.DEFAULT_REGION,
        path_style=storage.path_style if storage.path_style is not None else catalog.path_style,
    )


def vended_sets_from_response(
    raw: Mapping[str, Any], location: str, config: SQEConfig, received_at: float, source: str
) -> RefreshedSets:
    """The complete vended sets of a load-table (or credentials endpoint) answer, ready for tickets and pushes.

    A set equal to SQE's static pair is never treated as vended. A set without expiry gets one from
    ``catalog.credential_max_age_seconds`` (unknown is not forever). A set without session token is incomplete.
    """
    static = config.static_key_pair()
    max_age = float(config.catalog.credential_max_age_seconds)
    complete: list[TicketCredentials] = []
    incomplete = 0
    for found in credential_sets_from_load_table(raw, default_prefix=location):
        if static is not None and (found.access_key_id, found.secret_access_key) == static:
            continue
        expires_at_ms = found.expires_at_ms
        if expires_at_ms is None:
            expires_at_ms = int((received_at + max_age) * 1000)
        candidate = TicketCredentials(
            prefix=found.prefix,
            access_key_id=found.access_key_id,
            secret_access_key=found.secret_access_key,
            session_token=found.session_token,
            expires_at_ms=expires_at_ms,
            kind="vended",
            storage=coordinator_storage(found.storage, config),
        )
        if candidate.missing_parts():
            incomplete += 1
        else:
            complete.append(candidate)
    limits = [usable_until(c.expires_at_ms, received_at, max_age_seconds=max_age) for c in complete]
    until = min((limit for limit in limits if limit is not None), default=None)
    return RefreshedSets(tuple(complete), until, source, incomplete)


def static_set(config: SQEConfig) -> TicketCredentials | None:
    """The ``[storage]`` pair as a set covering every S3 path, or None without one."""
    pair = config.static_key_pair()
    if pair is None:
        return None
    storage = config.storage
    return TicketCredentials(
        prefix="s3://",
        access_key_id=pair[0],
        secret_access_key=pair[1],
        session_token=storage.session_token_value(),
        kind="static",
        storage=StorageOptions(storage.endpoint, storage.effective_region, storage.path_style),
    )


@dataclass
class _TableCredentials:
    """What the tickets of one table scan may carry: vended sets (the lease's, when refreshed) and the static set.

    A ticket gets the static set only when one of its files has no vended set covering it (``static`` mode:
    always; ``auto``: files the catalog vended nothing for; ``vended``: never, there is no static set).
    """

    ident: TableIdent
    lease: TableLease | None  # None: nothing to refresh (no vended sets, or pushing disabled)
    vended: tuple[TicketCredentials, ...] = field(repr=False)  # the vended sets when there is no lease
    static: TicketCredentials | None = field(repr=False)

    def for_fragment(self, fragment: Fragment, vended: Sequence[TicketCredentials]) -> list[TicketCredentials]:
        needs_static = self.static is not None and any(
            is_object_store(task.file.file_path)
            and not any(prefix_matches(task.file.file_path, cred.prefix) for cred in vended)
            for task in fragment.tasks
        )
        return [*vended, *([self.static] if needs_static and self.static is not None else [])]


# -------------------------------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class _Failure:
    """One failed attempt. ``fatal``: the query fails with ``error``; else the fragment may run elsewhere."""

    message: str
    fatal: SQEError | None = None
    worker_dead: bool = False
    busy: bool = False


def _classify(error: grpc.RpcError, worker: str, fragment_id: str, timed_out: bool) -> _Failure:
    call = cast(Any, error)
    code = call.code()
    kinds = {k: v for k, v in (call.trailing_metadata() or ()) if isinstance(v, str)}
    kind = kinds.get(ERROR_KIND_KEY)
    details = _one_line(call.details() or "")
    where = f"worker {worker}, fragment {fragment_id}"
    if timed_out:
        return _Failure(f"{where}: the worker stopped answering", worker_dead=True)
    if kind in _FATAL_KINDS:
        return _Failure(details, fatal=_FATAL_KINDS[kind](f"{where}: {details}"))
    if code == grpc.StatusCode.UNAUTHENTICATED:
        message = f"worker {worker} rejected the coordinator's token (check [coordinator] token and TLS settings)"
        return _Failure(message, fatal=WorkerError(message))
    if kind == KIND_BUSY:
        return _Failure(f"{where}: worker busy", busy=True)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and kind != KIND_READ_FAILED:
        return _Failure(f"{where}: worker unavailable ({code.name})", worker_dead=True)
    if kind == KIND_DUPLICATE_FRAGMENT:
        return _Failure(f"{where}: duplicate fragment id")
    return _Failure(f"{where}: {code.name}: {details}")


def _one_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:300]


# ----------------------------------------------------------------------------------------------- executor


TicketObserver = Callable[[str, pb.ScanTicket], None]
PushObserver = Callable[[str, pb.RefreshRequest], None]


@dataclass
class CoordinatorStats:
    """Counters of one executor (tests and benchmarks); never a secret."""

    fragments_started: int = 0
    fragments_completed: int = 0
    fragments_retried: int = 0
    pushes_sent: int = 0
    pushes_refused: int = 0
    credential_endpoint_calls: int = 0
    table_reloads: int = 0
    max_held_bytes: int = 0  # the largest fragment output held back before it completed
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def held(self, nbytes: int) -> None:
        with self._lock:
            self.max_held_bytes = max(self.max_held_bytes, nbytes)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in vars(self).items() if not k.startswith("_")}


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
        self.options = options or DistributedOptions()
        self._provider = provider
        self._clock = clock
        self.clients = [
            WorkerClient(
                address,
                token,
                tls_ca=coordinator.tls_ca,
                max_message_bytes=self.options.max_message_bytes,
            )
            for address in coordinator.workers
        ]
        self._by_address = {client.address: client for client in self.clients}
        self.refresher = CredentialRefresher(self._push, clock=clock)
        self.stats = CoordinatorStats()
        self.ticket_observers: list[TicketObserver] = []  # test hook: every ticket actually sent
        self.push_observers: list[PushObserver] = []  # test hook: every RefreshRequest actually sent
        self._closed = False

    def __repr__(self) -> str:
        return f"DistributedExecutor(workers={[c.address for c in self.clients]!r})"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.refresher.close()
        for client in self.clients:
            client.close()

    # -- credentials -----------------------------------------------------------------------------------

    def table_credentials(self, plan: ScanPlan) -> _TableCredentials:
        """The sets the tickets of ``plan`` may carry under ``distributed_credentials``; fails early and clearly."""
        mode = self.config.coordinator.distributed_credentials
        ident, loaded = plan.ident, plan.loaded
        if mode == "static":
            static = static_set(self.config)
            if static is None and _reads_object_store(plan):
                raise CredentialError(
                    f'{ident}: coordinator.distributed_credentials = "static" but [storage] has no '
                    "access_key_id/secret_access_key pair to give the workers"
                )
            return _TableCredentials(ident, None, (), static)
        location = loaded.table.metadata.location
        received = getattr(loaded.io, "received_at", None) or self._clock()
        vended = vended_sets_from_response(loaded.raw, location, self.config, received, "load-table")
        allow_static = mode == "auto" and not self.config.catalog.require_vended_credentials
        fallback = static_set(self.config) if allow_static else None
        self._check_coverage(plan, vended.credentials, fallback, mode)
        if not vended.credentials or not self.config.coordinator.push_credentials:
            return _TableCredentials(ident, None, vended.credentials, fallback)
        user = principal_key(self.config.catalog.connection(ident.warehouse))
        lease = self.refresher.lease(
            user, ident, vended.credentials, vended.usable_until, self._reloader(ident, location)
        )
        return _TableCredentials(ident, lease, (), fallback)

    def _check_coverage(
        self,
        plan: ScanPlan,
        vended: Sequence[TicketCredentials],
        fallback: TicketCredentials | None,
        mode: str,
    ) -> None:
        for task in plan.tasks:
            path = task.file.file_path
            if not is_object_store(path) or fallback is not None:
                continue
            if not any(prefix_matches(path, cred.prefix) for cred in vended):
                if mode == "vended":
                    raise NoVendedCredentialsError(
                        f'{plan.ident}: coordinator.distributed_credentials = "vended" but the catalog vended no '
                        f"complete credential set (key, secret, session token) covering {path}"
                    )
                why = (
                    "catalog.require_vended_credentials forbids the [storage] pair"
                    if self.config.catalog.require_vended_credentials
                    else "[storage] has no key pair"
                )
                raise CredentialError(
                    f"{plan.ident}: no credentials a worker may use for {path}: the catalog vended none and "
                    f"{why} (workers never fall back to ambient credentials)"
                )

    def _reloader(self, ident: TableIdent, location: str) -> Callable[[], RefreshedSets]:
        def reload() -> RefreshedSets:
            raw = self._credentials_endpoint(ident)
            source = "credentials-endpoint"
            if raw is None:
                raw = self._provider.load_table(ident, bypass_cache=True).raw
                source = "load-table"
                self.stats.add(table_reloads=1)
            return vended_sets_from_response(raw, location, self.config, self._clock(), source)

        return reload

    def _credentials_endpoint(self, ident: TableIdent) -> Mapping[str, Any] | None:
        """GET .../credentials as the user, when the catalog advertises it; None to fall back to a reload."""
        catalog_for = getattr(self._provider, "catalog", None)
        if not callable(catalog_for):
            return None
        catalog = catalog_for(ident.warehouse)
        endpoints = {str(e) for e in getattr(catalog, "_supported_endpoints", ())}
        if _CREDENTIALS_CAPABILITY not in endpoints:
            return None
        url = catalog.table_url(ident.namespace, ident.name) + "/credentials"
        self.stats.add(credential_endpoint_calls=1)
        try:
            response = catalog._session.get(url)
        except requests.RequestException as exc:
            raise CatalogUnavailableError(f"cannot load credentials of {ident}: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise error_for_status(response, f"credentials of {ident}")
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise CatalogUnavailableError(f"the catalog's credentials answer for {ident} is not a JSON object")
        return cast(dict[str, Any], body)

    def _push(self, ident: TableIdent, holders: Sequence[Holder], credentials: Sequence[TicketCredentials]) -> None:
        """One RefreshCredentials per (worker, query): every fragment of that query reading ``ident``."""
        targets = sorted({(h.worker, h.query_id) for h in holders})
        sets = [c.to_proto() for c in credentials]
        requests_by_worker = [
            (worker, pb.RefreshRequest(query_id=query_id, table=_table_ref(ident).to_proto(), credentials=sets))
            for worker, query_id in targets
        ]
        # In parallel: a hung worker must not hold back the push to the healthy ones until its RPC times out.
        with ThreadPoolExecutor(max_workers=len(requests_by_worker) or 1, thread_name_prefix="sqe-push") as pool:
            for worker, request in requests_by_worker:
                pool.submit(self._send_push, worker, request)

    def push_to_fragment(self, holder: Holder, ident: TableIdent, credentials: Sequence[TicketCredentials]) -> None:
        """A catch-up push to one fragment whose ticket was built just before a refresh."""
        request = pb.RefreshRequest(
            query_id=holder.query_id,
            fragment_id=holder.fragment_id,
            table=_table_ref(ident).to_proto(),
            credentials=[c.to_proto() for c in credentials],
        )
        self._send_push(holder.worker, request)

    def _send_push(self, worker: str, request: pb.RefreshRequest) -> None:
        client = self._by_address[worker]
        for observer in self.push_observers:
            observer(worker, request)
        try:
            response = client.refresh(request, timeout=self.options.rpc_timeout_seconds)
        except grpc.RpcError as exc:
            code = cast(Any, exc).code()
            log.warning("pushing credentials to worker %s failed: %s", worker, getattr(code, "name", code))
            return
        self.stats.add(pushes_sent=1)
        if response.accepted:
            return
        reason = _one_line(response.reason)
        if _NOTHING_RUNNING in reason:  # the fragments ended (or have not started) there: nothing to update
            log.debug("worker %s had no fragment for pushed credentials: %s", worker, reason)
            return
        self.stats.add(pushes_refused=1)
        log.warning("worker %s refused pushed credentials: %s", worker, reason)

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

    def record_batches(
        self, plan: ScanPlan, *, context: QueryContext, query_id: str, run: int
    ) -> Iterator[pa.RecordBatch]:
        """Stream the plan's restricted batches from the workers (fragment order is not preserved)."""
        return _DistributedRun(self, plan, context, query_id, run).batches()


def _reads_object_store(plan: ScanPlan) -> bool:
    return any(is_object_store(task.file.file_path) for task in plan.tasks)


def _table_ref(ident: TableIdent) -> TableRef:
    return TableRef(ident.warehouse, tuple(ident.namespace), ident.name)


# ----------------------------------------------------------------------------------------------- one scan


@dataclass
class _FragmentState:
    fragment: Fragment
    attempts: int = 0
    failed_on: set[str] = field(default_factory=set)
    last_failure: str = ""


@dataclass
class _Attempt:
    """One run of a fragment on a worker; owned by the slot thread that started it."""

    fragment_id: str
    worker: str
    call: Any = None
    waiting_since: float | None = None  # set while the slot thread waits for the next message
    timed_out: bool = False
    files_done: int = 0
    bytes_done: int = 0


class _DistributedRun:
    """One pass over a plan: slot threads run fragments on workers, the caller's thread yields committed batches."""

    def __init__(
        self, executor: DistributedExecutor, plan: ScanPlan, context: QueryContext, query_id: str, run: int
    ) -> None:
        self._executor = executor
        self._options = executor.options
        self._plan = plan
        self._context = context
        self._metrics: ScanMetrics = context.metrics
        self._query_id = query_id
        self._run = run
        self._fragments = plan_fragments(
            plan.tasks,
            workers=len(executor.clients),
            max_files=self._options.max_files_per_fragment,
            max_bytes=self._options.max_bytes_per_fragment,
        )
        self._pending: list[_FragmentState] = [_FragmentState(f) for f in self._fragments]
        self._committed = 0
        self._live_workers = {c.address for c in executor.clients}
        self._running: dict[str, _Attempt] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._error: SQEError | None = None
        self._output: queue.Queue[pa.RecordBatch] = queue.Queue(self._options.max_queued_batches)
        self._credentials: _TableCredentials | None = None
        self._metadata_json = b""

    # -- consumer ----------------------------------------------------------------------------------------

    def batches(self) -> Iterator[pa.RecordBatch]:
        if self._context.cancel.is_set():
            raise QueryCancelledError()
        self._metrics.add(scans_opened=1, files_total=len(self._plan.tasks))
        if not self._fragments:
            return
        self._credentials = self._executor.table_credentials(self._plan)
        self._metadata_json = trim_metadata(self._plan.loaded.table.metadata)
        threads = [
            threading.Thread(target=self._slot, args=(client,), name=f"sqe-fragment-{client.address}", daemon=True)
            for client in self._executor.clients
            for _ in range(self._options.slots_per_worker)
        ]
        for thread in threads:
            thread.start()
        try:
            yield from self._consume()
        finally:
            self._shutdown(threads)

    def _consume(self) -> Iterator[pa.RecordBatch]:
        while True:
            if self._context.cancel.is_set():
                raise QueryCancelledError()
            with self._cond:
                if self._error is not None:
                    raise self._error
                finished = self._committed == len(self._fragments)
            try:
                batch = self._output.get(timeout=self._options.poll_seconds)
            except queue.Empty:
                if finished:
                    return
                self._watch_idle()
                continue
            self._metrics.add(batches_in_flight=-1)
            yield batch

    def _shutdown(self, threads: Sequence[threading.Thread]) -> None:
        self._stop.set()
        with self._cond:
            running = list(self._running.values())
            self._cond.notify_all()
        for attempt in running:
            if attempt.call is not None:
                attempt.call.cancel()
        for attempt in running:  # the worker may not notice a cancelled call at once: say so explicitly
            self._send_cancel(attempt)
        while True:
            try:
                self._output.get_nowait()
                self._metrics.add(batches_in_flight=-1)
            except queue.Empty:
                break
        for thread in threads:
            thread.join(timeout=self._options.poll_seconds)

    def _send_cancel(self, attempt: _Attempt) -> None:
        client = self._executor._by_address[attempt.worker]
        request = pb.CancelRequest(query_id=self._query_id, fragment_id=attempt.fragment_id)
        with contextlib.suppress(grpc.RpcError):  # a dead worker has nothing left to cancel
            client.cancel(request, timeout=self._options.rpc_timeout_seconds)

    def _watch_idle(self) -> None:
        """A stream silent for idle_timeout_seconds: health-check its worker; an unanswered check ends the call."""
        now = time.monotonic()
        with self._cond:
            silent = [
                a
                for a in self._running.values()
                if a.waiting_since is not None and now - a.waiting_since > self._options.idle_timeout_seconds
            ]
        for attempt in silent:
            client = self._executor._by_address[attempt.worker]
            try:
                client.health(timeout=self._options.rpc_timeout_seconds)
            except grpc.RpcError:
                attempt.timed_out = True
                if attempt.call is not None:
                    attempt.call.cancel()
                continue
            attempt.waiting_since = time.monotonic()  # alive, just slow (a slow store, a paced worker)

    # -- slot threads -------------------------------------------------------------------------------------

    def _slot(self, client: WorkerClient) -> None:
        try:
            while not self._stop.is_set():
                state = self._take(client.address)
                if state is None:
                    return
                if not self._run_fragment(client, state):
                    return
        except BaseException as exc:  # a bug here must fail the query, not hang it
            self._fail(exc if isinstance(exc, SQEError) else WorkerError(f"coordinator error: {_one_line(str(exc))}"))

    def _take(self, worker: str) -> _FragmentState | None:
        """The largest waiting fragment this worker has not failed, or None when the scan is over."""
        with self._cond:
            while not self._stop.is_set() and self._error is None:
                if worker not in self._live_workers:
                    return None
                state = self._pick(worker)
                if state is not None:
                    self._pending.remove(state)
                    return state
                if self._committed == len(self._fragments):
                    return None
                self._cond.wait(timeout=self._options.poll_seconds * 4)
            return None

    def _pick(self, worker: str) -> _FragmentState | None:
        for state in self._pending:
            others = self._live_workers - state.failed_on - {worker}
            if worker not in state.failed_on or not others:
                return state
        return None

    def _run_fragment(self, client: WorkerClient, state: _FragmentState) -> bool:
        """Run one attempt; False when this worker is gone and its slot should stop."""
        state.attempts += 1
        attempt = _Attempt(f"{self._query_id}.{self._run}.f{state.fragment.index}.a{state.attempts}", client.address)
        holder = Holder(client.address, self._query_id, attempt.fragment_id)
        self._executor.stats.add(fragments_started=1, fragments_retried=1 if state.attempts > 1 else 0)
        with self._cond:
            self._running[attempt.fragment_id] = attempt
        try:
            batches, failure = self._execute(client, state, attempt, holder)
        finally:
            with self._cond:
                self._running.pop(attempt.fragment_id, None)
            if self._credentials is not None and self._credentials.lease is not None:
                self._executor.refresher.unregister(self._credentials.lease, holder)
        if failure is None:
            self._commit(state, attempt, batches)
            return True
        self._uncount(attempt)
        return self._handle_failure(client.address, state, failure)

    def _execute(
        self, client: WorkerClient, state: _FragmentState, attempt: _Attempt, holder: Holder
    ) -> tuple[list[pa.RecordBatch], _Failure | None]:
        ticket, generation = self._ticket(state.fragment, attempt, holder)
        for observer in self._executor.ticket_observers:
            observer(client.address, ticket)
        held: list[pa.RecordBatch] = []
        try:
            attempt.call = client.execute(ticket)
            if self._stop.is_set():
                attempt.call.cancel()
            complete = self._receive(attempt, held, generation, holder)
        except grpc.RpcError as exc:
            if self._stop.is_set():
                return [], _Failure("cancelled")
            return [], _classify(exc, client.address, attempt.fragment_id, attempt.timed_out)
        if complete is None:
            return [], _Failure(f"worker {client.address}, fragment {attempt.fragment_id}: stream ended early")
        rows = sum(batch.num_rows for batch in held)
        if complete.rows != rows:
            return [], _Failure(f"fragment {attempt.fragment_id}: worker reported {complete.rows} rows, sent {rows}")
        return held, None

    def _receive(
        self, attempt: _Attempt, held: list[pa.RecordBatch], generation: int, holder: Holder
    ) -> pb.Complete | None:
        schema: pa.Schema | None = None
        held_bytes = 0
        stream = iter(attempt.call)
        while True:
            attempt.waiting_since = time.monotonic()
            try:
                message = next(stream)
            except StopIteration:
                return None
            finally:
                attempt.waiting_since = None
            kind = message.WhichOneof("payload")
            if kind == "schema":
                schema = decode_schema(message.schema.ipc)
                self._catch_up(holder, generation)
            elif kind == "batch":
                if schema is None:
                    raise WorkerError(f"fragment {attempt.fragment_id}: a batch arrived before the schema")
                batch = decode_batch(message.batch.ipc, schema)
                held.append(batch)
                held_bytes += batch.nbytes
                self._executor.stats.held(held_bytes)
            elif kind == "progress":
                self._count(attempt, message.progress.files_done, message.progress.bytes_done)
            elif kind == "complete":
                complete: pb.Complete = message.complete
                self._count(attempt, complete.files, complete.bytes)
                return complete

    def _catch_up(self, holder: Holder, generation: int) -> None:
        """The worker knows the fragment now: if a refresh happened since its ticket was built, push it again."""
        table = self._credentials
        if table is None or table.lease is None:
            return
        credentials, current = self._executor.refresher.current(table.lease)
        if current != generation:
            self._executor.push_to_fragment(holder, table.ident, credentials)

    def _ticket(self, fragment: Fragment, attempt: _Attempt, holder: Holder) -> tuple[pb.ScanTicket, int]:
        table = self._credentials
        assert table is not None
        generation = 0
        vended = table.vended
        if table.lease is not None:
            vended, generation = self._executor.refresher.register(table.lease, holder)
        credentials = table.for_fragment(fragment, vended)
        plan = self._plan
        storage = self._executor.config.storage
        ticket = build_ticket(
            query_id=self._query_id,
            fragment_id=attempt.fragment_id,
            table=_table_ref(plan.ident),
            metadata=plan.loaded.table.metadata,
            metadata_json=self._metadata_json,
            read_schema=plan.read.projected_schema,
            output_field_ids=plan.output_field_ids,
            tasks=fragment.tasks,
            credentials=credentials,
            restrictions=plan.restrictions,
            salt=self._context.salt,
            row_filter=plan.row_filter,
            storage=StorageOptions(storage.endpoint, storage.region, storage.path_style),
            pace_ms_per_file=self._options.pace_ms_per_file,
        )
        return ticket, generation

    # -- outcomes -------------------------------------------------------------------------------------------

    def _commit(self, state: _FragmentState, attempt: _Attempt, batches: list[pa.RecordBatch]) -> None:
        """The fragment completed: only now do its batches reach DuckDB (a retry never duplicates rows)."""
        schema = self._plan.arrow_schema
        for batch in batches:
            out = _conform(batch, schema)
            self._metrics.add(batches_in_flight=1, batches_produced=1, rows_produced=out.num_rows)
            while not self._stop.is_set():
                try:
                    self._output.put(out, timeout=self._options.poll_seconds)
                    break
                except queue.Full:
                    continue
            else:
                self._metrics.add(batches_in_flight=-1)
                return
        self._count(attempt, state.fragment.files, state.fragment.nbytes)
        self._executor.stats.add(fragments_completed=1)
        with self._cond:
            self._committed += 1
            self._cond.notify_all()

    def _count(self, attempt: _Attempt, files_done: int, bytes_done: int) -> None:
        """Progress of one attempt, as deltas on the query's metrics (files and bytes done, per fragment)."""
        files_delta = max(0, files_done - attempt.files_done)
        bytes_delta = max(0, bytes_done - attempt.bytes_done)
        if files_delta or bytes_delta:
            attempt.files_done += files_delta
            attempt.bytes_done += bytes_delta
            self._metrics.add(files_done=files_delta, bytes_done=bytes_delta)

    def _uncount(self, attempt: _Attempt) -> None:
        """A failed attempt's progress is taken back: its fragment starts over."""
        if attempt.files_done or attempt.bytes_done:
            self._metrics.add(files_done=-attempt.files_done, bytes_done=-attempt.bytes_done)

    def _handle_failure(self, worker: str, state: _FragmentState, failure: _Failure) -> bool:
        if self._stop.is_set():
            return False
        if failure.fatal is not None:
            self._fail(failure.fatal)
            return False
        if failure.busy:
            state.attempts -= 1  # not the fragment's fault
            self._requeue(state)
            time.sleep(self._options.busy_retry_seconds)
            return True
        log.warning("fragment of %s will be retried: %s", self._plan.ident, failure.message)
        state.failed_on.add(worker)
        state.last_failure = failure.message
        with self._cond:
            if failure.worker_dead:
                self._live_workers.discard(worker)
            if state.attempts >= self._options.max_attempts:
                self._fail_locked(
                    WorkerError(
                        f"a fragment of {self._plan.ident} failed {state.attempts} times, giving up "
                        f"(last: {failure.message})"
                    )
                )
                return False
            if not self._live_workers:
                self._fail_locked(WorkerError(f"no worker left to scan {self._plan.ident} (last: {failure.message})"))
                return False
        self._requeue(state)
        return not failure.worker_dead

    def _requeue(self, state: _FragmentState) -> None:
        with self._cond:
            self._pending.append(state)
            self._pending.sort(key=lambda s: -s.fragment.nbytes)
            self._cond.notify_all()

    def _fail(self, error: SQEError) -> None:
        with self._cond:
            self._fail_locked(error)

    def _fail_locked(self, error: SQEError) -> None:
        if self._error is None:
            self._error = error
        self._cond.notify_all()


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Worker batches in the scan's Arrow schema (the same shape the local path hands DuckDB)."""
    if batch.schema.names != schema.names:
        missing = [name for name in schema.names if name not in batch.schema.names]
        if missing:
            raise QueryError(f"a worker returned batches without the column(s) {', '.join(missing)}")
        batch = batch.select(schema.names)
    return conform_batch(batch, schema)


# ------------------------------------------------------------------------------------------------- stream


class DistributedScanStream:
    """The distributed twin of ``ScanStream``: each ``__arrow_c_stream__`` call runs a fresh distributed scan.

    Workers apply the read-restrictions (with the query's salt); the coordinator only conforms the schema.
    """

    def __init__(self, plan: ScanPlan, executor: DistributedExecutor, context: QueryContext) -> None:
        self.plan = plan
        self.schema: pa.Schema = plan.arrow_schema
        self._executor = executor
        self._context = context
        self.query_id = f"q-{uuid.uuid4().hex[:16]}"
        self.opened = 0

    def __repr__(self) -> str:
        return f"DistributedScanStream({self.plan.ident}, query_id={self.query_id!r})"

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        self.opened += 1
        return self.reader().__arrow_c_stream__(requested_schema)

    def reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.schema, self._batches(self.opened))

    def _batches(self, run: int) -> Iterator[pa.RecordBatch]:
        try:
            yield from self._executor.record_batches(self.plan, context=self._context, query_id=self.query_id, run=run)
        except SQEError as exc:  # including QueryCancelledError
            self._context.record_error(exc)
            raise
        except Exception as exc:
            error = QueryError(f"distributed scan of {self.plan.ident} failed: {_one_line(str(exc))}")
            self._context.record_error(error)
            raise error from None


__all__ = [
    "CoordinatorStats",
    "DistributedExecutor",
    "DistributedOptions",
    "DistributedScanStream",
    "Fragment",
    "WorkerClient",
    "coordinator_storage",
    "key_fingerprint",
    "plan_fragments",
    "static_set",
    "vended_sets_from_response",
]
