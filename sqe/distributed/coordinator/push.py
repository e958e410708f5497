"""Pushing refreshed credential sets to the workers that read with them (``RefreshCredentials``).

One call per (worker, query) covers every fragment of that query reading the table; calls go out in parallel so
a hung worker does not hold back the healthy ones. A refusal is logged by its reason (never a value). A call lost in
transit is sent again a few times: a push is idempotent (the worker keeps, per prefix, the set valid longest), and
without it the fragment fails at its old keys' expiry although the lease holds fresh ones.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

import grpc
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from sqe._counters import Counters
from sqe.credentials import CredentialSet
from sqe.distributed.coordinator.client import WorkerClient
from sqe.distributed.coordinator.credentials import wire_table_id
from sqe.distributed.coordinator.failures import secret_values, worker_text
from sqe.distributed.coordinator.refresh import Holder
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.ticket import credentials_to_proto

if TYPE_CHECKING:
    from sqe.catalog.base import TableIdent

log = logging.getLogger(__name__)

NOTHING_RUNNING = "no running fragment"  # a RefreshResponse reason that is a race, not a refusal
PushObserver = Callable[[str, pb.RefreshRequest], None]
PUSH_ATTEMPTS = 3
PUSH_BACKOFF_SECONDS = 0.2  # then 0.4: a reset connection or a restarting listener, not a long outage
# Codes of a call that may not have reached the worker, or whose answer was lost; an answer (accepted or refused)
# and every other error would come back the same, so only these are sent again.
_TRANSIENT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)


def _code(exc: BaseException) -> Any:
    return cast(Any, exc).code() if isinstance(exc, grpc.RpcError) else None


def _transient(exc: BaseException) -> bool:
    return _code(exc) in _TRANSIENT


class CredentialPusher:
    """Sends pushes to the executor's workers and counts them in ``stats`` (``pushes_sent``/``pushes_refused``)."""

    def __init__(self, clients: Mapping[str, WorkerClient], stats: Counters, rpc_timeout_seconds: float) -> None:
        self._clients = clients
        self._stats = stats
        self._timeout = rpc_timeout_seconds
        # The keys a table's fragments may hold (their tickets', earlier pushes'): set by the executor to its
        # refresher's; a refusal is scrubbed of them as well as of the keys it refuses.
        self.held_secrets: Callable[[TableIdent], frozenset[str]] = _nothing_held
        self.observers: list[PushObserver] = []  # test hook: every RefreshRequest actually sent

    def push(self, ident: TableIdent, holders: Sequence[Holder], credentials: Sequence[CredentialSet]) -> None:
        """One RefreshCredentials per (worker, query): every fragment of that query reading ``ident``."""
        targets = sorted({(h.worker, h.query_id) for h in holders})
        sets = [credentials_to_proto(c) for c in credentials]
        table = wire_table_id(ident).to_proto()
        requests_by_worker = [
            (worker, pb.RefreshRequest(query_id=query_id, table=table, credentials=sets))
            for worker, query_id in targets
        ]
        # In parallel: a hung worker must not hold back the push to the healthy ones until its RPC times out.
        held = self.held_secrets(ident)
        with ThreadPoolExecutor(max_workers=len(requests_by_worker) or 1, thread_name_prefix="sqe-push") as pool:
            for worker, request in requests_by_worker:
                pool.submit(self.send, worker, request, held)

    def push_to_fragment(self, holder: Holder, ident: TableIdent, credentials: Sequence[CredentialSet]) -> None:
        """A catch-up push to one fragment whose ticket was built just before a refresh."""
        request = pb.RefreshRequest(
            query_id=holder.query_id,
            fragment_id=holder.fragment_id,
            table=wire_table_id(ident).to_proto(),
            credentials=[credentials_to_proto(c) for c in credentials],
        )
        self.send(holder.worker, request, self.held_secrets(ident))

    def send(self, worker: str, request: pb.RefreshRequest, held: frozenset[str] = frozenset()) -> None:
        """One push (observers see it once, however many times it is sent); errors are logged, never raised.
        ``held``: other keys the worker may hold for the table, scrubbed from a refusal too."""
        for observer in self.observers:
            observer(worker, request)
        try:
            response = self._refresh(worker, request)
        except grpc.RpcError as exc:
            code = _code(exc)
            log.warning("pushing credentials to worker %s failed: %s", worker, getattr(code, "name", code))
            return
        self._stats.add(pushes_sent=1)
        if response.accepted:
            return
        # The reason is the worker's text: it never repeats the keys just pushed, those it held before (its ticket's,
        # earlier pushes') nor the token, whatever it says.
        sent = secret_values(request.credentials) | held | self._clients[worker].secret_values()
        reason = worker_text(response.reason, sent)
        if NOTHING_RUNNING in reason:  # the fragments ended (or have not started) there: nothing to update
            log.debug("worker %s had no fragment for pushed credentials: %s", worker, reason)
            return
        self._stats.add(pushes_refused=1)
        log.warning("worker %s refused pushed credentials: %s", worker, reason)

    def _refresh(self, worker: str, request: pb.RefreshRequest) -> pb.RefreshResponse:
        """``RefreshCredentials``, sent again (up to PUSH_ATTEMPTS calls) while it fails in transit."""

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            code = getattr(_code(error) if error is not None else None, "name", None)
            log.info("pushing credentials to worker %s failed (%s); sending it again", worker, code)

        retrying = Retrying(
            stop=stop_after_attempt(PUSH_ATTEMPTS),
            wait=wait_exponential(multiplier=PUSH_BACKOFF_SECONDS),
            retry=retry_if_exception(_transient),
            before_sleep=before_sleep,
            reraise=True,
        )
        client = self._clients[worker]
        response: pb.RefreshResponse = retrying(client.refresh, request, timeout=self._timeout)
        return response


def _nothing_held(ident: TableIdent) -> frozenset[str]:
    return frozenset()
