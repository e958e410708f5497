"""How the coordinator reads a failed ``Execute`` call: fatal for the query, retry elsewhere, or worker busy.

Workers report a machine-readable kind in trailing metadata (``sqe.distributed.protocol.errors``); kinds that no
other worker could fix (expired or missing credentials, restriction errors, bad tickets) fail the query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import grpc

from sqe._text import first_line
from sqe.distributed.protocol.errors import (
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
from sqe.errors import CredentialError, CredentialExpiredError, RestrictionError, SQEError, WorkerError

_FATAL_KINDS: dict[str, type[SQEError]] = {
    KIND_CREDENTIAL_EXPIRED: CredentialExpiredError,
    KIND_NO_CREDENTIALS: CredentialError,
    KIND_RESTRICTION: RestrictionError,
    KIND_INVALID_TICKET: WorkerError,
    KIND_MESSAGE_TOO_LARGE: WorkerError,
}
MESSAGE_LIMIT = 300  # characters of a worker's message kept in the coordinator's errors


@dataclass(frozen=True)
class AttemptFailure:
    """One failed attempt. ``fatal``: the query fails with ``error``; else the fragment may run elsewhere."""

    message: str
    fatal: SQEError | None = None
    worker_dead: bool = False
    busy: bool = False


def classify_rpc_error(error: grpc.RpcError, worker: str, fragment_id: str, timed_out: bool) -> AttemptFailure:
    """What a failed ``Execute`` call means for its fragment and its worker."""
    call = cast(Any, error)
    code = call.code()
    kinds = {k: v for k, v in (call.trailing_metadata() or ()) if isinstance(v, str)}
    kind = kinds.get(ERROR_KIND_KEY)
    details = first_line(call.details() or "", limit=MESSAGE_LIMIT)
    where = f"worker {worker}, fragment {fragment_id}"
    if timed_out:
        return AttemptFailure(f"{where}: the worker stopped answering", worker_dead=True)
    if kind in _FATAL_KINDS:
        return AttemptFailure(details, fatal=_FATAL_KINDS[kind](f"{where}: {details}"))
    if code == grpc.StatusCode.UNAUTHENTICATED:
        message = f"worker {worker} rejected the coordinator's token (check [coordinator] token and TLS settings)"
        return AttemptFailure(message, fatal=WorkerError(message))
    if kind == KIND_BUSY:
        return AttemptFailure(f"{where}: worker busy", busy=True)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and kind != KIND_READ_FAILED:
        return AttemptFailure(f"{where}: worker unavailable ({code.name})", worker_dead=True)
    if kind == KIND_DUPLICATE_FRAGMENT:
        return AttemptFailure(f"{where}: duplicate fragment id")
    return AttemptFailure(f"{where}: {code.name}: {details}")
