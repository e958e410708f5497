"""The stack's SQE service processes get the environment their S3 layer needs on every store."""

from __future__ import annotations

from sqe_stack.ceph import CEPH_CLIENT_ENV
from sqe_stack.service import service_env


def test_server_and_workers_get_the_rgw_write_fix() -> None:
    # Regression (soak): INSERT through `sqe serve` on Ceph RGW failed with HTTP 411 on UploadPart, because the
    # server was started with every AWS_* variable scrubbed, the checksum setting included.
    env = service_env()
    assert env["AWS_REQUEST_CHECKSUM_CALCULATION"] == "WHEN_REQUIRED"
    assert CEPH_CLIENT_ENV.items() <= env.items()
    assert not any((k.startswith("AWS_") and "KEY" in k) or k == "AWS_SESSION_TOKEN" for k in env)
