"""The coordinator's worker channel: plaintext only to loopback workers; no channel is made for the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from sqe.distributed.coordinator.client import WorkerClient
from sqe.distributed.coordinator.options import DistributedOptions
from sqe.errors import ConfigError

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
