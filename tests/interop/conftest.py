"""Shared by the interop tests: they need the DuckDB peer environment (``make duckdb-peer``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop.duckdb_client import PeerEnvironmentMissing, peer_dir


@pytest.fixture(autouse=True)
def peer_environment() -> Path:
    """Every test fails (never skips) when the peer environment was not built."""
    try:
        return peer_dir()
    except PeerEnvironmentMissing as missing:
        pytest.fail(str(missing), pytrace=False)
