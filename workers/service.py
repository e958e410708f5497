"""The ``sqe.worker.v1.Worker`` service: Execute, RefreshCredentials, Cancel, Health, Stats.

Logs name fragment ids, counts and error kinds only: never ticket contents, paths, keys or tokens. Error messages
sent back to the coordinator are one line, with every credential value of the fragment scrubbed out.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import NoReturn, TypedDict, TypeVar

import grpc

from sqe._text import SCRUBBED, first_line, without_secrets
from sqe.credentials import CredentialSet
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.credential_sets import credential_sets_problem
from sqe.distributed.protocol.errors import (
    ERROR_KIND_KEY,
    KIND_BUSY,
    KIND_CANCELLED,
    KIND_CREDENTIAL_EXPIRED,
    KIND_DATA_FILE,
    KIND_DUPLICATE_FRAGMENT,
    KIND_INTERNAL,
    KIND_INVALID_TICKET,
    KIND_MESSAGE_TOO_LARGE,
    KIND_NO_CREDENTIALS,
    KIND_OUTPUT_NOT_ALLOWED,
    KIND_READ_FAILED,
    KIND_RESOURCE_LIMIT,
    KIND_RESTRICTION,
    DuplicateFragmentError,
    InvalidTicketError,
    MessageTooLargeError,
    WorkerBusyError,
)
from sqe.distributed.protocol.ipc import BatchFrame
from sqe.distributed.protocol.rewrite import decode_rewrite_ticket
from sqe.distributed.protocol.ticket import WireTableId, credentials_from_proto, decode_ticket
from sqe.duckdb_connection import DatabaseLimits
from sqe.errors import CredentialError, CredentialExpiredError, DataFileError, QueryResourceError, RestrictionError
from sqe.execution.local import LocalExecutor, QueryCancelledError
from workers.databases import AggregateDatabases, default_limits
from workers.environment import ambient_credentials_disabled
from workers.fileio import FragmentFileIO, OpenCallback
from workers.fragment import FragmentRegistry, Registered, RunningFragment, WorkerStats
from workers.heartbeat import heartbeat_interval_ms, with_heartbeats
from workers.rewrite import OutputNotAllowedError, RewriteFileIO, RunningRewrite

log = logging.getLogger("sqe.worker")

# The most often a worker lets a client ping it on a connection that sent it nothing (gRPC answers pings more
# frequent than this with GOAWAY "too_many_pings"); the coordinator never pings more often (its minimum is 2 s).
# Health announces it: a coordinator pings only workers that say so (a stock gRPC server allows one per 5 min).
MIN_CLIENT_PING_MS = 1000

CallT = TypeVar("CallT", bound=Registered)


class _IOOptions(TypedDict):
    cancel: threading.Event
    pace_seconds: float
    on_open: OpenCallback


DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def _package_version() -> str:
    try:
        return version("sqe")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class ServiceSettings:
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_fragments: int = 8
    max_files_in_flight: int = 2
    max_queued_batches: int = 4
    prefetch: bool = False  # the engine's [cache] prefetch (sqe-worker --prefetch)
    pace_seconds: float = 0.0  # test only: the worker-wide default for tickets that set none
    allow_local_files: bool = False  # unit tests only: file:// paths need no credential set
    aggregate_limits: DatabaseLimits | None = None  # each fragment's partial aggregation; None: default_limits


@dataclass(frozen=True)
class FragmentFailure:
    """How a fragment that could not run or finish is reported: gRPC status, error kind, one-line message."""

    code: grpc.StatusCode
    kind: str
    message: str


class WorkerService:
    """Plain methods with gRPC's servicer signatures; registered by ``workers.server``."""

    def __init__(self, settings: ServiceSettings | None = None) -> None:
        self.settings = settings or ServiceSettings()
        self.stats = WorkerStats()
        self.registry = FragmentRegistry(self.settings.max_fragments)
        limits = self.settings.aggregate_limits or default_limits(self.settings.max_fragments)
        self.databases = AggregateDatabases(limits, self.settings.max_fragments)
        self._executor = LocalExecutor(
            max_files_in_flight=self.settings.max_files_in_flight,
            max_queued_batches=self.settings.max_queued_batches,
            prefetch=self.settings.prefetch,
        )

    # ------------------------------------------------------------------------------------------- Execute

    def Execute(
        self, request: pb.ScanTicket, context: grpc.ServicerContext
    ) -> Iterator[pb.ExecuteResponse | BatchFrame]:
        fragment = self._start(request, context)
        outcome = "failed"
        try:
            yield from self._responses(fragment, heartbeat_interval_ms(request.heartbeat_ms))
            outcome = "completed"
        except GeneratorExit:  # the client went away: the stream is closed under us
            fragment.cancel.set()
            outcome = "cancelled"
            raise
        except Exception as exc:
            failure = fragment_failure(exc, fragment)
            outcome = "cancelled" if failure.kind == KIND_CANCELLED else "failed"
            self._fail(context, failure, fragment)
        finally:
            fragment.cancel.set()  # stops reader threads whatever happened
            self.registry.unregister(fragment)
            self._record_end(fragment, outcome)

    def _responses(self, fragment: RunningFragment, heartbeat_ms: int) -> Iterator[pb.ExecuteResponse | BatchFrame]:
        """The fragment's stream; with heartbeats asked for, with a progress message after each quiet interval."""
        stream = fragment.stream(
            self._executor, self.settings.max_message_bytes, self.stats, heartbeat_ms, self.databases
        )
        if not heartbeat_ms:
            return stream
        return with_heartbeats(
            stream,
            interval_seconds=heartbeat_ms / 1000.0,
            progress=fragment.made_progress,
            beat=fragment.heartbeat,
            cancel=fragment.cancel,
        )

    def _start(self, request: pb.ScanTicket, context: grpc.ServicerContext) -> RunningFragment:
        fragment = self._admit(context, "fragment", lambda cancel: self._new_fragment(request, cancel))
        ticket = fragment.ticket
        self.stats.add(fragments_started=1)
        sources = ",".join(sorted({c.source for c in ticket.credentials})) or "none"
        log.info("fragment %s started: %d files (credentials: %s)", fragment.fragment_id, ticket.files_total, sources)
        return fragment

    def _new_fragment(self, request: pb.ScanTicket, cancel: threading.Event) -> RunningFragment:
        ticket = decode_ticket(request)
        options = self._io_options(ticket.pace_seconds, cancel)
        io = FragmentFileIO(ticket.credentials, ticket.storage, allow_local=self.settings.allow_local_files, **options)
        return RunningFragment(ticket, io, cancel)

    def _io_options(self, ticket_pace: float, cancel: threading.Event) -> _IOOptions:
        """What every call's FileIO shares: its cancel flag, the pace (the ticket's, else the worker's), the counter."""
        return {
            "cancel": cancel,
            "pace_seconds": ticket_pace or self.settings.pace_seconds,
            "on_open": self.stats.credential_used,
        }

    def _admit(self, context: grpc.ServicerContext, what: str, build: Callable[[threading.Event], CallT]) -> CallT:
        """Build and register one call, or abort the RPC with its typed failure; the call stops when the RPC ends."""
        cancel = threading.Event()
        try:
            call = build(cancel)
            self.registry.register(call)
        except Exception as exc:
            failure = fragment_failure(exc, None)
            log.warning("%s rejected: %s", what, failure.kind)
            self._abort(context, failure)
        context.add_callback(cancel.set)  # RPC over for any reason (client cancel, deadline): stop reading
        return call

    def _fail(self, context: grpc.ServicerContext, failure: FragmentFailure, fragment: RunningFragment) -> NoReturn:
        if failure.kind == KIND_CREDENTIAL_EXPIRED:
            self.stats.add(credential_expired_failures=1)
        log.warning("fragment %s failed: %s", fragment.fragment_id, failure.kind)
        self._abort(context, failure)

    @staticmethod
    def _abort(context: grpc.ServicerContext, failure: FragmentFailure) -> NoReturn:
        context.set_trailing_metadata(((ERROR_KIND_KEY, failure.kind),))
        context.abort(failure.code, failure.message)
        raise AssertionError("grpc context.abort returned")  # abort always raises

    def _record_end(self, fragment: RunningFragment, outcome: str) -> None:
        done = fragment.metrics.snapshot()
        counter = {"completed": "fragments_completed", "cancelled": "fragments_cancelled"}.get(
            outcome, "fragments_failed"
        )
        self.stats.add(**{counter: 1}, files_read=done["files_done"], file_bytes_read=done["bytes_done"])
        log.info(
            "fragment %s %s: %d/%d files, %d batches",
            fragment.fragment_id,
            outcome,
            done["files_done"],
            fragment.ticket.files_total,
            done["batches_produced"],
        )

    # ------------------------------------------------------------------------------------------- Rewrite

    def Rewrite(self, request: pb.RewriteTicket, context: grpc.ServicerContext) -> pb.RewriteResponse:
        """Compaction of one bin: read it, write the ticket's output paths, report what was written."""
        rewrite = self._start_rewrite(request, context)
        try:
            response = rewrite.run(self.stats)
        except Exception as exc:
            failure = fragment_failure(exc, rewrite)
            log.warning("rewrite %s failed: %s", rewrite.fragment_id, failure.kind)
            self._abort(context, failure)
        finally:
            rewrite.cancel.set()
            self.registry.unregister(rewrite)
        self.stats.add(rewrites_completed=1)
        log.info(
            "rewrite %s completed: %d files read, %d written",
            rewrite.fragment_id,
            response.files_read,
            len(response.files),
        )
        return response

    def _start_rewrite(self, request: pb.RewriteTicket, context: grpc.ServicerContext) -> RunningRewrite:
        rewrite = self._admit(context, "rewrite", lambda cancel: self._new_rewrite(request, cancel))
        self.stats.add(rewrites_started=1)
        log.info("rewrite %s started: %d files", rewrite.fragment_id, rewrite.ticket.files_total)
        return rewrite

    def _new_rewrite(self, request: pb.RewriteTicket, cancel: threading.Event) -> RunningRewrite:
        ticket = decode_rewrite_ticket(request)
        io = RewriteFileIO(
            ticket.credentials, ticket.storage, ticket.output_paths, **self._io_options(ticket.pace_seconds, cancel)
        )
        return RunningRewrite(ticket, io, cancel)

    # -------------------------------------------------------------------------------- RefreshCredentials

    def RefreshCredentials(self, request: pb.RefreshRequest, context: grpc.ServicerContext) -> pb.RefreshResponse:
        try:
            return self._refresh(request)
        except Exception as exc:  # a push the checks did not foresee is refused, never a traceback
            self.stats.add(refreshes_refused=1)
            log.warning("credential push refused: internal error (%s)", type(exc).__name__)
            return pb.RefreshResponse(accepted=False, reason=f"internal error ({type(exc).__name__})")

    def _refresh(self, request: pb.RefreshRequest) -> pb.RefreshResponse:
        pushed = [credentials_from_proto(c) for c in request.credentials]
        table = WireTableId.from_proto(request.table) if request.HasField("table") else None
        reason = _refusal(pushed, request.query_id, request.fragment_id, table)
        fragments = [] if reason else self.registry.select(request.query_id, request.fragment_id, table)
        if not reason and not fragments:
            reason = "no running fragment in this scope"
        if reason:
            self.stats.add(refreshes_refused=1)
            log.info("credential push refused: %s", reason)
            return pb.RefreshResponse(accepted=False, reason=reason)
        for fragment in fragments:
            fragment.io.refresh(pushed)
        self.stats.add(refreshes_accepted=1)
        log.info(
            "credential push applied to %d fragment(s): %s (%d sets)",
            len(fragments),
            ", ".join(f.fragment_id for f in fragments),
            len(pushed),
        )
        return pb.RefreshResponse(accepted=True, fragments_updated=len(fragments))

    # ------------------------------------------------------------------------------ Cancel, Health, Stats

    def Cancel(self, request: pb.CancelRequest, context: grpc.ServicerContext) -> pb.CancelResponse:
        if not (request.query_id or request.fragment_id):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Cancel needs a query_id or a fragment_id")
        fragments = self.registry.select(request.query_id, request.fragment_id)
        for fragment in fragments:
            fragment.cancel.set()
        log.info("cancel: %d fragment(s) told to stop", len(fragments))
        return pb.CancelResponse(cancelled=len(fragments))

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthResponse:
        return pb.HealthResponse(
            status=pb.HealthResponse.SERVING,
            version=_package_version(),
            max_message_bytes=self.settings.max_message_bytes,
            running_fragments=len(self.registry),
            ambient_credentials_disabled=ambient_credentials_disabled(os.environ),
            min_client_ping_ms=MIN_CLIENT_PING_MS,
        )

    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsResponse:
        return self.stats.to_proto(running=len(self.registry))


# ---------------------------------------------------------------------------------------------- helpers


def _refusal(pushed: list[CredentialSet], query_id: str, fragment_id: str, table: WireTableId | None) -> str:
    """Why a push is refused ("" when it is acceptable): its scope, then the protocol's check of its sets."""
    if not fragment_id and not (query_id and table is not None):
        return "scope needs a fragment_id, or a query_id and a table"
    if not pushed:
        return "no credential sets"
    return credential_sets_problem(pushed, push=True)


_SIMPLE_FAILURES: tuple[tuple[type[BaseException], grpc.StatusCode, str], ...] = (
    (InvalidTicketError, grpc.StatusCode.INVALID_ARGUMENT, KIND_INVALID_TICKET),
    (OutputNotAllowedError, grpc.StatusCode.PERMISSION_DENIED, KIND_OUTPUT_NOT_ALLOWED),
    (DuplicateFragmentError, grpc.StatusCode.ALREADY_EXISTS, KIND_DUPLICATE_FRAGMENT),
    (WorkerBusyError, grpc.StatusCode.RESOURCE_EXHAUSTED, KIND_BUSY),
    (MessageTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED, KIND_MESSAGE_TOO_LARGE),
    (QueryCancelledError, grpc.StatusCode.CANCELLED, KIND_CANCELLED),
    (CredentialExpiredError, grpc.StatusCode.FAILED_PRECONDITION, KIND_CREDENTIAL_EXPIRED),
    (CredentialError, grpc.StatusCode.FAILED_PRECONDITION, KIND_NO_CREDENTIALS),
    (RestrictionError, grpc.StatusCode.FAILED_PRECONDITION, KIND_RESTRICTION),
    (DataFileError, grpc.StatusCode.FAILED_PRECONDITION, KIND_DATA_FILE),  # its message: counts, no values
    (QueryResourceError, grpc.StatusCode.RESOURCE_EXHAUSTED, KIND_RESOURCE_LIMIT),  # DuckDB's sizes, no values
)


def fragment_failure(exc: BaseException, fragment: RunningFragment | RunningRewrite | None) -> FragmentFailure:
    """Status code, kind and a one-line, secret-free message for a fragment that could not run or finish."""
    secrets: Iterable[str] = fragment.io.secret_values() if fragment is not None else ()
    for error_type, code, kind in _SIMPLE_FAILURES:
        if isinstance(exc, error_type):
            return FragmentFailure(code, kind, _scrubbed(exc, secrets))
    where = f"fragment {fragment.fragment_id}" if fragment is not None else "ticket"
    if isinstance(exc, OSError) and fragment is not None:
        expired = fragment.io.expired_set()
        if expired is not None:  # the store refused a read because the keys died meanwhile
            message = _message(fragment.io.expired_error(expired))
            return FragmentFailure(grpc.StatusCode.FAILED_PRECONDITION, KIND_CREDENTIAL_EXPIRED, message)
        message = f"{where}: reading failed: {_scrubbed(exc, secrets)}"
        return FragmentFailure(grpc.StatusCode.UNAVAILABLE, KIND_READ_FAILED, message)
    # Anything else: the type only (an arbitrary message could quote data values).
    return FragmentFailure(grpc.StatusCode.INTERNAL, KIND_INTERNAL, f"{where}: internal error ({type(exc).__name__})")


def _message(exc: BaseException) -> str:
    return first_line(exc, limit=1000)


def _scrubbed(exc: BaseException, secrets: Iterable[str]) -> str:
    """The exception's one-line message with every secret replaced, also percent-encoded (a store quoting a
    request's URL) or cut short. Replaced before the line is cut to its limit (cut first, a secret straddling the
    limit would keep its head)."""
    return first_line(without_secrets(str(exc), secrets, marker=SCRUBBED), limit=1000) or type(exc).__name__
