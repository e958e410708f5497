"""The coordinator's worker channel: plaintext only to loopback workers; no channel is made for the others; no
keepalive pings to a worker that does not say it accepts them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from sqe.distributed.coordinator.client import WorkerClient
from sqe.distributed.coordinator.options import MIN_KEEPALIVE_SECONDS, DistributedOptions
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol._proto import worker_pb2_grpc as pb_grpc
from sqe.errors import ConfigError
from workers.server import Keepalive
from workers.service import MIN_CLIENT_PING_MS

TOKEN = "coordinator-token-" + "x" * 20


@pytest.mark.parametrize("address", ["192.0.2.10:7001", "[2001:db8::1]:7001", "worker-1:7001", "0.0.0.0:7001"])
def test_plaintext_to_a_non_loopback_worker_is_refused_before_any_channel(address: str) -> None:
    with pytest.raises(ConfigError) as caught:
        WorkerClient(address, TOKEN, tls_ca=None, max_message_bytes=1 << 20)
    message = str(caught.value)
    assert message == (
        f"refusing to reach worker {address!r} in plaintext: it is not a loopback address and the token and ticket "
        "keys would cross the network readable; set [coordinator] tls_ca"
    )
    assert TOKEN not in message


@pytest.mark.parametrize("address", ["127.0.0.1:1", "localhost:1", "[::1]:1"])
def test_plaintext_to_a_loopback_worker_is_allowed(address: str) -> None:
    client = WorkerClient(address, TOKEN, tls_ca=None, max_message_bytes=1 << 20)  # a channel connects lazily
    client.close()


def test_with_a_ca_any_address_gets_a_tls_channel(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"")  # never used: nothing is called on the channel
    client = WorkerClient("192.0.2.10:7001", TOKEN, tls_ca=str(ca), max_message_bytes=1 << 20)
    assert client.address == "192.0.2.10:7001"
    client.close()


@pytest.mark.parametrize(
    "settings",
    [
        {"keepalive_seconds": 1.0},  # workers allow one ping a second: the coordinator stays well clear of it
        {"keepalive_timeout_seconds": 0.0},
        {"heartbeat_seconds": 0.01},
        {"heartbeat_seconds": 7200.0},
        {"stall_heartbeats": 1},  # one late heartbeat must not read as a stall
    ],
)
def test_liveness_settings_out_of_range_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="DistributedOptions"):
        DistributedOptions(**settings)  # type: ignore[arg-type]
    assert DistributedOptions(heartbeat_seconds=0).heartbeat_seconds == 0  # 0: no heartbeats asked for


class _WorkerBeforeKeepalive(pb_grpc.WorkerServicer):
    """A worker before v1.3: a stock gRPC server (gRPC's ping policy), a Health without ``min_client_ping_ms``,
    and a fragment that sends nothing for a while (a partial aggregate of a large file)."""

    def __init__(self, silent_seconds: float) -> None:
        self.silent_seconds = silent_seconds

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthResponse:
        return pb.HealthResponse(status=pb.HealthResponse.SERVING, version="old")

    def Execute(self, request: pb.ScanTicket, context: grpc.ServicerContext) -> Iterator[pb.ExecuteResponse]:
        yield pb.ExecuteResponse(progress=pb.Progress(files_total=1))
        time.sleep(self.silent_seconds)
        yield pb.ExecuteResponse(complete=pb.Complete(files=1))


class _WorkerWithKeepalive(_WorkerBeforeKeepalive):
    """A v1.3 worker: says in Health how often it accepts pings (its server is set up with sqe-worker's options)."""

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthResponse:
        return pb.HealthResponse(status=pb.HealthResponse.SERVING, min_client_ping_ms=MIN_CLIENT_PING_MS)


def _serve(servicer: pb_grpc.WorkerServicer, options: list[tuple[str, int]]) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.so_reuseport", 0), *options])
    pb_grpc.add_WorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def _stream_kinds(address: str, keepalive: tuple[float, float]) -> list[str | None]:
    client = WorkerClient(address, TOKEN, tls_ca=None, max_message_bytes=1 << 20, keepalive=keepalive)
    try:
        return [message.WhichOneof("payload") for message in client.execute(pb.ScanTicket(fragment_id="f"))]
    finally:
        client.close()


def test_a_worker_before_keepalive_gets_no_pings_that_would_end_its_silent_stream() -> None:
    # Pings every second (gRPC's floor): a stock server takes the third within its 5 minutes as abuse (GOAWAY
    # too_many_pings, the call fails UNAVAILABLE), as it takes the default 30 s ones on a stream silent for 2 min.
    server, address = _serve(_WorkerBeforeKeepalive(silent_seconds=5.0), [])
    try:
        assert _stream_kinds(address, keepalive=(1, 1)) == ["progress", "complete"]
    finally:
        server.stop(grace=None)


def test_a_v1_3_worker_takes_the_pings_through_a_stream_silent_for_several_intervals() -> None:
    """The worker's server options (sqe-worker's, here with gRPC's defaults otherwise) accept the coordinator's
    fastest pings (every 2 s) on a stream that sends nothing for three and a half of them (a partial aggregate)."""
    server, address = _serve(_WorkerWithKeepalive(silent_seconds=7.0), Keepalive().channel_options())
    try:
        assert _stream_kinds(address, keepalive=(MIN_KEEPALIVE_SECONDS, 1)) == ["progress", "complete"]
    finally:
        server.stop(grace=None)


class _CountingCancels(pb_grpc.WorkerServicer):
    """A worker that only notes the fragments it is told to cancel."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def Cancel(self, request: pb.CancelRequest, context: grpc.ServicerContext) -> pb.CancelResponse:
        self.cancelled.append(request.fragment_id)
        return pb.CancelResponse(cancelled=1)


def test_a_cancel_sent_without_keeping_its_future_still_reaches_the_worker() -> None:
    """Whoever sends a Cancel need not wait for it, nor hold on to it: gRPC ends a call whose future is collected,
    so a dropped one used to be cancelled before it left (the coordinator's Cancel of a stalled fragment)."""
    worker = _CountingCancels()
    server, address = _serve(worker, [])
    client = WorkerClient(address, TOKEN, tls_ca=None, max_message_bytes=1 << 20)
    try:
        sent = [f"f{index}" for index in range(10)]
        for fragment_id in sent:
            client.cancel(pb.CancelRequest(query_id="q", fragment_id=fragment_id), timeout=30)
        deadline = time.monotonic() + 30
        while len(worker.cancelled) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(worker.cancelled) == sorted(sent)
    finally:
        client.close()
        server.stop(grace=None)
