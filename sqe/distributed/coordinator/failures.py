"""How the coordinator reads a failed ``Execute`` call: fatal for the query, retry elsewhere, or worker busy.

Workers report a machine-readable kind in trailing metadata (``sqe.distributed.protocol.errors``); kinds that no
other worker could fix (expired or missing credentials, restriction errors, bad tickets, a data file that
disagrees with its footer or manifest entry, a partial aggregate past its worker's DuckDB limits) fail the query.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import grpc

from sqe._text import SCRUBBED, first_line, without_secrets
from sqe.distributed.protocol.errors import (
    ERROR_KIND_KEY,
    KIND_BUSY,
    KIND_CREDENTIAL_EXPIRED,
    KIND_DATA_FILE,
    KIND_DUPLICATE_FRAGMENT,
    KIND_INVALID_TICKET,
    KIND_MESSAGE_TOO_LARGE,
    KIND_NO_CREDENTIALS,
    KIND_READ_FAILED,
    KIND_RESOURCE_LIMIT,
    KIND_RESTRICTION,
)
from sqe.errors import (
    CredentialError,
    CredentialExpiredError,
    DataFileError,
    QueryResourceError,
    RestrictionError,
    SQEError,
    WorkerError,
)

_FATAL_KINDS: dict[str, type[SQEError]] = {
    KIND_CREDENTIAL_EXPIRED: CredentialExpiredError,
    KIND_NO_CREDENTIALS: CredentialError,
    KIND_RESTRICTION: RestrictionError,
    KIND_INVALID_TICKET: WorkerError,
    KIND_MESSAGE_TOO_LARGE: WorkerError,
    KIND_DATA_FILE: DataFileError,
    # every worker lends each fragment the same limits by default: another attempt fails again, after as long
    KIND_RESOURCE_LIMIT: QueryResourceError,
}
MESSAGE_LIMIT = 300  # characters of a worker's message kept in the coordinator's errors


@dataclass(frozen=True)
class AttemptFailure:
    """One failed attempt. ``fatal``: the query fails with ``error``; else the fragment may run elsewhere."""

    message: str
    fatal: SQEError | None = None
    worker_dead: bool = False
    busy: bool = False


class _KeySet(Protocol):
    """A credential set, as the coordinator holds it (``sqe.credentials.CredentialSet``) or sends it (protobuf)."""

    @property
    def access_key_id(self) -> str: ...

    @property
    def secret_access_key(self) -> str: ...

    @property
    def session_token(self) -> str | None: ...


def secret_values(sets: Iterable[_KeySet]) -> frozenset[str]:
    """Every key id, secret and session token of ``sets``: what a worker's text must never carry on."""
    return frozenset(v for s in sets for v in (s.access_key_id, s.secret_access_key, s.session_token) if v)


def worker_text(text: str, secrets: Iterable[str]) -> str:
    """A worker's error message or refusal reason as the coordinator repeats it (errors, logs): one line, cut to
    MESSAGE_LIMIT, with every secret the coordinator sent that worker (ticket and pushed keys, its bearer token)
    replaced, also percent-encoded or cut short (``without_secrets``). A worker's text is not trusted to be clean (a
    buggy or hostile worker may quote a ticket); the secrets go before the cut, so no head of one survives."""
    return first_line(without_secrets(text, secrets, marker=SCRUBBED), limit=MESSAGE_LIMIT)


def classify_rpc_error(
    error: grpc.RpcError, worker: str, fragment_id: str, timed_out: bool, secrets: Iterable[str] = ()
) -> AttemptFailure:
    """What a failed ``Execute`` call means for its fragment and its worker (``secrets``: see ``worker_text``)."""
    call = cast(Any, error)
    code = call.code()
    kinds = {k: v for k, v in (call.trailing_metadata() or ()) if isinstance(v, str)}
    kind = kinds.get(ERROR_KIND_KEY)
    details = worker_text(call.details() or "", secrets)
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
