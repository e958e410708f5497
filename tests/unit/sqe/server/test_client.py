"""The CLI's remote session never sends the user's catalog credentials in plaintext to another machine."""

from __future__ import annotations

import pytest

from sqe.errors import CatalogUnavailableError, ConfigError
from sqe.server.client import RemoteSession, _refuse_plaintext_off_loopback
from tests.conftest import free_loopback_port
from tests.unit.sqe.test_config import _load

SECRET = "CLIENT-SECRET-never-on-the-wire"


@pytest.mark.parametrize("location", ["grpc://10.1.2.3:8815", "grpc+tcp://sqe.example.com:8815", "grpc://[::2]:1"])
def test_plaintext_to_another_machine_is_refused_before_any_login(location: str) -> None:
    config = _load({"catalog.client_id": "analyst", "catalog.client_secret": SECRET})
    with pytest.raises(ConfigError, match="plaintext") as refused:
        RemoteSession(location, config)
    assert SECRET not in str(refused.value) and "grpc+tls://" in str(refused.value)


@pytest.mark.parametrize(
    "location", ["grpc://127.0.0.1:8815", "grpc://localhost:8815", "grpc://[::1]:8815", "grpc+tls://10.1.2.3:8815"]
)
def test_loopback_and_tls_locations_pass(location: str) -> None:
    _refuse_plaintext_off_loopback(location)


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("notaurl", "empty scheme"),
        ("grpc://127.0.0.1:99999", "Invalid port number"),
        ("http://127.0.0.1:8815", "No client transport"),
    ],
)
def test_a_server_url_flight_cannot_use_is_a_config_error(location: str, reason: str) -> None:
    config = _load({"catalog.client_id": "analyst", "catalog.client_secret": SECRET})
    with pytest.raises(ConfigError, match=f"server URL {location!r}: .*{reason}"):
        RemoteSession(location, config)


def test_a_server_nothing_answers_at_is_one_unavailable_error() -> None:
    """A login by client id and secret (a Basic handshake) said only "Could not finish writing before closing"."""
    location = f"grpc://127.0.0.1:{free_loopback_port()}"
    config = _load({"catalog.client_id": "analyst", "catalog.client_secret": SECRET})
    with pytest.raises(CatalogUnavailableError, match=f"^cannot reach the SQE server at {location}: ") as refused:
        RemoteSession(location, config)
    assert "Connection refused" in str(refused.value) and SECRET not in str(refused.value)
