"""Fixtures: a real local Iceberg catalog (see iceberg_local.py) and sessions that are closed after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.sqe.iceberg_local import (
    NUMBERS_SCHEMA,
    LocalProvider,
    add_positional_deletes,
    build_events,
    build_many_batches,
    build_numbers,
    local_catalog,
    numbers_batch,
)


@pytest.fixture(scope="session")
def shared_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only tables built once: ns.numbers, ns.events (partitioned), ns.many_batches, ns.deleted (positional
    deletes) and wh2.ns.numbers (a second warehouse). Tests that write use ``write_provider``."""
    root = tmp_path_factory.mktemp("iceberg")
    wh, wh2 = local_catalog(root, "wh"), local_catalog(root, "wh2")
    build_numbers(wh)
    build_events(wh)
    build_many_batches(wh)
    add_positional_deletes(build_numbers(wh, "ns.deleted"))
    wh2.create_namespace("ns")
    other = wh2.create_table("ns.numbers", schema=NUMBERS_SCHEMA)
    other.append(numbers_batch(0, 10))
    return root


@pytest.fixture()
def provider(shared_warehouse: Path) -> LocalProvider:
    return LocalProvider(shared_warehouse)


@pytest.fixture()
def write_provider(tmp_path: Path) -> LocalProvider:
    """A private, empty pair of warehouses for tests that write."""
    provider = LocalProvider(tmp_path)
    provider.catalogs["wh"].create_namespace("ns")
    return provider


@pytest.fixture()
def session_factory() -> Iterator[Any]:
    from sqe.session import Session

    sessions: list[Session] = []

    def make(provider: LocalProvider, **kwargs: Any) -> Session:
        session = Session(provider, **kwargs)
        sessions.append(session)
        return session

    yield make
    for session in sessions:
        session.close()
