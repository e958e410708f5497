"""``sqe.worker.v1`` as a wire protocol under attack, over loopback gRPC.

As a stranger: calls that never send their request must not tie up the worker's server threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from sqe.distributed.protocol._proto import worker_pb2 as pb
from tests.conftest import WorkerFactory

pytestmark = pytest.mark.e2e

HEALTH = "/sqe.worker.v1.Worker/Health"


# ------------------------------------------------------------------------------------ strangers


def test_calls_that_never_send_their_request_do_not_starve_the_worker(worker_process_factory: WorkerFactory) -> None:
    """A stranger opens more calls than the worker has server threads (max fragments + 4) and never sends a request
    message: the worker refuses each at once, so the coordinator's own calls are still answered."""
    worker = worker_process_factory.start("--max-fragments", "2")
    never = threading.Event()

    def no_request() -> Iterator[bytes]:
        never.wait()  # the call stays open, its request never comes
        yield b""

    held: list[Any] = []
    try:
        for _ in range(12):
            channel = grpc.insecure_channel(worker.address)
            worker._channels.append(channel)
            call = channel.stream_unary(HEALTH, request_serializer=bytes, response_deserializer=bytes)
            held.append(call.future(no_request(), metadata=worker.metadata("a-stranger-without-the-token")))
        # Each stranger's call ends (refused) without sending anything; before, each held a server thread.
        for call in held:
            with pytest.raises(grpc.RpcError) as refused:
                call.result(timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = worker.stub().Health(pb.HealthRequest(), metadata=worker.metadata(), timeout=30)
        assert health.status == pb.HealthResponse.SERVING
    finally:
        never.set()
        for call in held:
            call.cancel()
        worker.stop()
