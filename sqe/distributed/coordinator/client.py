"""The gRPC client of one scan worker: its channel and stub; every call carries the coordinator's bearer token."""

from __future__ import annotations

import threading
from typing import Any, NoReturn, cast

import grpc

from sqe._net import address_host, is_loopback
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol._proto import worker_pb2_grpc as pb_grpc
from sqe.distributed.protocol.ipc import parse_execute_response
from sqe.errors import ConfigError

# Execute is called with the coordinator's own deserializer: batch messages keep their IPC body as a view of the
# received bytes instead of protobuf's copy.
# Health probe outcomes that say nothing about the worker (it was not reached): the next call asks again.
_UNREACHED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

_EXECUTE = f"/{pb.DESCRIPTOR.services_by_name['Worker'].full_name}/Execute"


def refuse_plaintext_off_loopback(address: str, tls_ca: str | None) -> None:
    """Every call carries the token and a ticket carries keys: never in plaintext to another machine (load_config
    refuses such a config too; this covers configs built in code, before any channel exists)."""
    if not tls_ca and not is_loopback(address_host(address)):
        raise ConfigError(
            f"refusing to reach worker {address!r} in plaintext: it is not a loopback address and the token and "
            "ticket keys would cross the network readable; set [coordinator] tls_ca"
        )


class WorkerClient:
    """One worker's channel and stub; every call carries the coordinator's bearer token."""

    def __init__(
        self,
        address: str,
        token: str,
        *,
        tls_ca: str | None,
        max_message_bytes: int,
        keepalive: tuple[float, float] = (30.0, 10.0),
        probe_timeout: float = 5.0,
    ) -> None:
        """``keepalive``: (seconds between pings, seconds a ping may go unanswered before the connection drops),
        used once the worker's Health says it accepts such pings (``probe_timeout``: that Health call's)."""
        refuse_plaintext_off_loopback(address, tls_ca)
        self.address = address
        self._token = token
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._every_ms, self._timeout_ms = (int(seconds * 1000) for seconds in keepalive)
        self._probe_timeout = probe_timeout
        self._options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        self._credentials: grpc.ChannelCredentials | None = None
        if tls_ca:
            with open(tls_ca, "rb") as fh:
                self._credentials = grpc.ssl_channel_credentials(root_certificates=fh.read())
        self._lock = threading.Lock()
        self._keepalive_decided = False
        self._retired: list[grpc.Channel] = []  # replaced channels: closed last, calls may still run on them
        self._cancels: set[Any] = set()  # Cancel calls under way (see cancel), under their own lock: the other
        self._cancels_lock = threading.Lock()  # is held through a Health probe
        self._connect(keepalive=False)

    def _connect(self, *, keepalive: bool) -> None:
        options = self._options + (self._keepalive_options() if keepalive else [])
        if self._credentials is not None:
            channel = grpc.secure_channel(self.address, self._credentials, options=options)
        else:
            channel = grpc.insecure_channel(self.address, options=options)
        self._stub: Any = pb_grpc.WorkerStub(channel)
        self._execute: Any = channel.unary_stream(
            _EXECUTE,
            request_serializer=pb.ScanTicket.SerializeToString,
            response_deserializer=parse_execute_response,
            _registered_method=True,
        )
        self._channel = channel

    def _keepalive_options(self) -> list[tuple[str, int]]:
        # A worker behind a dead connection fails the calls on it (UNAVAILABLE) within about every + timeout,
        # instead of after the operating system's TCP timeouts.
        return [
            ("grpc.keepalive_time_ms", self._every_ms),
            ("grpc.keepalive_timeout_ms", self._timeout_ms),
            ("grpc.http2.ping_timeout_ms", self._timeout_ms),  # what gRPC actually waits (default: a minute)
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]

    def _keepalive_if_welcome(self) -> None:
        """Before the first long call: switch to a keepalive channel if the worker's Health accepts its pings.

        A worker before v1.3 runs a stock gRPC server, which answers pings more often than every 5 minutes with
        GOAWAY too_many_pings and fails every call on the connection (a silent stream dies after about three
        pings): it gets none, and keeps only the coordinator's idle health checks. An unanswered Health decides
        nothing (the call itself then fails as it would have); the next call asks again."""
        if self._keepalive_decided:
            return
        with self._lock:
            if self._keepalive_decided:
                return
            try:
                accepted_ms = self.health(timeout=self._probe_timeout).min_client_ping_ms
            except grpc.RpcError as exc:
                if exc.code() in _UNREACHED:  # asked again before the next call
                    return
                accepted_ms = 0  # it answered, but not with a Health that accepts pings
            self._keepalive_decided = True
            if 0 < accepted_ms <= self._every_ms:
                self._retired.append(self._channel)
                self._connect(keepalive=True)

    def __repr__(self) -> str:
        return f"WorkerClient({self.address!r})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("worker clients hold the coordinator's token and cannot be pickled")

    def secret_values(self) -> frozenset[str]:
        """The bearer token, to scrub from what this worker says (never to log)."""
        return frozenset({self._token})

    def execute(self, ticket: pb.ScanTicket) -> Any:
        """The streaming call (iterable of ``ExecuteResponse`` or, for batches, ``ReceivedBatch``; ``cancel()``
        ends it from another thread)."""
        self._keepalive_if_welcome()
        return self._execute(ticket, metadata=self._metadata)

    def rewrite(self, ticket: pb.RewriteTicket, timeout: float) -> Any:
        """A compaction rewrite as a future (``result()`` blocks; ``cancel()`` ends it from another thread)."""
        self._keepalive_if_welcome()
        return self._stub.Rewrite.future(ticket, metadata=self._metadata, timeout=timeout)

    def refresh(self, request: pb.RefreshRequest, timeout: float) -> pb.RefreshResponse:
        return cast(
            pb.RefreshResponse, self._stub.RefreshCredentials(request, metadata=self._metadata, timeout=timeout)
        )

    def cancel(self, request: pb.CancelRequest, timeout: float) -> Any:
        """The Cancel call as a future: whoever sends it need not wait on a worker that may not answer, nor keep
        the future. gRPC cancels a call whose future is garbage-collected before it ends, so a Cancel sent and
        dropped would never reach the worker: the client holds each one until it ends (answered, refused, past
        ``timeout``, or its channel closed)."""
        call = self._stub.Cancel.future(request, metadata=self._metadata, timeout=timeout)
        with self._cancels_lock:
            self._cancels.add(call)
        call.add_done_callback(self._cancel_ended)
        return call

    def _cancel_ended(self, call: Any) -> None:
        with self._cancels_lock:
            self._cancels.discard(call)

    def health(self, timeout: float) -> pb.HealthResponse:
        return cast(pb.HealthResponse, self._stub.Health(pb.HealthRequest(), metadata=self._metadata, timeout=timeout))

    def health_future(self, timeout: float) -> Any:
        """Health as a future (``add_done_callback``), for checks made from a thread that must not block."""
        return self._stub.Health.future(pb.HealthRequest(), metadata=self._metadata, timeout=timeout)

    def stats(self, timeout: float) -> pb.StatsResponse:
        return cast(pb.StatsResponse, self._stub.Stats(pb.StatsRequest(), metadata=self._metadata, timeout=timeout))

    def close(self) -> None:
        for channel in (*self._retired, self._channel):
            channel.close()
