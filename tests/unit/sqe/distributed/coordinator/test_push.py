"""Which failed pushes are sent again (a real worker receiving a resent push: tests/e2e/test_worker.py)."""

from __future__ import annotations

from typing import cast

import grpc
import pytest

from sqe.catalog.base import TableIdent
from sqe.credentials import CredentialSet
from sqe.distributed.coordinator.client import WorkerClient
from sqe.distributed.coordinator.executor import CoordinatorStats
from sqe.distributed.coordinator.push import PUSH_ATTEMPTS, CredentialPusher
from sqe.distributed.coordinator.refresh import Holder
from sqe.distributed.protocol._proto import worker_pb2 as pb

SET = CredentialSet("s3://b/wh/ns/t", "AKIA0001", "secret", "token", 4_102_444_800_000)


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


class _Failing:
    def __init__(self, code: grpc.StatusCode) -> None:
        self.code, self.calls = code, 0

    def refresh(self, request: pb.RefreshRequest, timeout: float) -> pb.RefreshResponse:
        self.calls += 1
        raise _Failed(self.code)


@pytest.mark.parametrize(
    ("code", "calls"),
    [
        (grpc.StatusCode.UNAVAILABLE, PUSH_ATTEMPTS),
        (grpc.StatusCode.DEADLINE_EXCEEDED, PUSH_ATTEMPTS),
        (grpc.StatusCode.UNAUTHENTICATED, 1),  # an answer: it would come back the same
        (grpc.StatusCode.INVALID_ARGUMENT, 1),
    ],
)
def test_only_a_push_lost_in_transit_is_sent_again_and_a_failure_is_never_raised(
    code: grpc.StatusCode, calls: int, caplog: pytest.LogCaptureFixture
) -> None:
    client = _Failing(code)
    stats = CoordinatorStats()
    pusher = CredentialPusher({"127.0.0.1:1": cast(WorkerClient, client)}, stats, rpc_timeout_seconds=1.0)
    pusher.push(TableIdent("wh", ("ns",), "t"), [Holder("127.0.0.1:1", "q", "q.f0")], [SET])
    assert client.calls == calls
    assert stats.pushes_sent == 0
    assert f"pushing credentials to worker 127.0.0.1:1 failed: {code.name}" in caplog.text
    assert "secret" not in caplog.text and "AKIA0001" not in caplog.text
