"""The gRPC client of one scan worker: its channel and stub; every call carries the coordinator's bearer token."""

from __future__ import annotations

from typing import Any, NoReturn, cast

import grpc

from sqe._net import address_host, is_loopback
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol._proto import worker_pb2_grpc as pb_grpc
from sqe.distributed.protocol.ipc import parse_execute_response
from sqe.errors import ConfigError

# Execute is called with the coordinator's own deserializer: batch messages keep their IPC body as a view of the
# received bytes instead of protobuf's copy.
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
    ) -> None:
        """``keepalive``: (seconds between pings, seconds a ping may go unanswered before the connection drops)."""
        refuse_plaintext_off_loopback(address, tls_ca)
        self.address = address
        self._token = token
        self._metadata = (("authorization", f"Bearer {token}"),)
        every, timeout = keepalive
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # A worker behind a dead connection fails the calls on it (UNAVAILABLE) within about every + timeout,
            # instead of after the operating system's TCP timeouts. Workers accept these pings (sqe-worker allows
            # one a second, with or without calls and data), so they never answer GOAWAY too_many_pings.
            ("grpc.keepalive_time_ms", int(every * 1000)),
            ("grpc.keepalive_timeout_ms", int(timeout * 1000)),
            ("grpc.http2.ping_timeout_ms", int(timeout * 1000)),  # what gRPC actually waits (default: a minute)
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        if tls_ca:
            with open(tls_ca, "rb") as fh:
                credentials = grpc.ssl_channel_credentials(root_certificates=fh.read())
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub: Any = pb_grpc.WorkerStub(self._channel)
        self._execute: Any = self._channel.unary_stream(
            _EXECUTE,
            request_serializer=pb.ScanTicket.SerializeToString,
            response_deserializer=parse_execute_response,
            _registered_method=True,
        )

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
        return self._execute(ticket, metadata=self._metadata)

    def rewrite(self, ticket: pb.RewriteTicket, timeout: float) -> Any:
        """A compaction rewrite as a future (``result()`` blocks; ``cancel()`` ends it from another thread)."""
        return self._stub.Rewrite.future(ticket, metadata=self._metadata, timeout=timeout)

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
