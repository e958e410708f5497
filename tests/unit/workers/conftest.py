"""Fixtures for the worker unit tests (helpers live in worker_fixtures.py)."""

from __future__ import annotations

import pytest

from tests.unit.workers.worker_fixtures import LocalTables, build_local_tables


@pytest.fixture(scope="session")
def local_tables(tmp_path_factory: pytest.TempPathFactory) -> LocalTables:
    """ns.events (partitioned), ns.numbers and ns.deleted (positional deletes), built once."""
    return build_local_tables(tmp_path_factory.mktemp("worker-iceberg"))
