"""Crash safety of ``sqe-catalog serve``: SIGKILL it in the middle of pyiceberg commits, restart, verify.

A seeded schedule kills the real server process between and within 120 appends to a protected table (one
created through the catalog, so it has an integrity pin). After every restart on the same SQLite database the
table must load through the catalog's own (verifying) load path; at the end every commit that was
acknowledged with a 200 is in the snapshot log, the pointer and the pin agree row for row, and SQLite's
``PRAGMA integrity_check`` says ``ok``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from sqe_catalog.cli import main as catalog_cli
from sqe_stack import catalog as stack_catalog
from sqe_stack.provision import Daemon
from tests.conftest import free_loopback_port, start_catalog_process, stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

SEED = 1717
COMMITS = 120
KILL_PROBABILITY = 0.12  # about a dozen kills: each restart costs a server start-up
KILL_WITHIN_MS = 60  # a kill lands up to this long after a commit starts: before, during or after the request


class Catalog:
    """One catalog's config and database; ``start``/``kill`` its server process."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_loopback_port()
        server = stack_catalog.server_settings(workdir, self.port)
        warehouse = {"name": "wh", "location": f"file://{workdir}/wh", "vend_credentials": False}
        self.config_path = stack_catalog.write_catalog_config(workdir / "catalog.toml", server, warehouse)
        self.database = workdir / stack_catalog.CATALOG_DB
        self.process: Daemon | None = None
        admin = json.loads(self._admin("create-principal", "admin", "--admin"))
        self.credential = f"{admin['client_id']}:{admin['client_secret']}"

    def _admin(self, *args: str) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert catalog_cli(["admin", "--config", str(self.config_path), *args]) == 0
        return out.getvalue()

    def start(self) -> None:
        self.process = start_catalog_process(self.config_path, self.workdir, self.port)

    def kill(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)

    def reap(self) -> None:
        if self.process is not None:
            stop_process(self.process, signal.SIGKILL)
            self.process = None

    def client(self) -> RestCatalog:
        return RestCatalog(
            "crash",
            uri=f"http://127.0.0.1:{self.port}",
            warehouse="wh",
            credential=self.credential,
            scope="PRINCIPAL_ROLE:ALL",
        )


def _pointer_and_pin(database: Path) -> tuple[str, str, int]:
    """(pyiceberg's metadata pointer, the integrity pin's pointer, recorded-locations rows) for crash.t."""
    with contextlib.closing(sqlite3.connect(database)) as conn:
        (pointer,) = conn.execute(
            "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = 'crash' AND table_name = 't'"
        ).fetchone()
        (pin,) = conn.execute(
            "SELECT metadata_location FROM sqe_table_integrity WHERE namespace = 'crash' AND table_name = 't'"
        ).fetchone()
        (locations,) = conn.execute(
            "SELECT count(*) FROM sqe_table_locations WHERE namespace = 'crash' AND table_name = 't'"
        ).fetchone()
    return pointer, pin, locations


def _integrity_check(database: Path) -> list[Any]:
    with contextlib.closing(sqlite3.connect(database)) as conn:
        return [row[0] for row in conn.execute("PRAGMA integrity_check")]


def _load_verified(catalog: Catalog) -> Any:
    """The table through the catalog's load path (it verifies pointer, pin and digest before answering)."""
    return catalog.client().load_table("crash.t")


def test_no_acknowledged_commit_is_lost_and_none_is_half_applied(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    catalog = Catalog(tmp_path)
    catalog.start()
    try:
        client = catalog.client()
        client.create_namespace("crash")
        schema = Schema(NestedField(1, "id", LongType(), required=False))
        table = client.create_table("crash.t", schema)
        acknowledged: list[int] = []
        kills = refused = 0
        for i in range(COMMITS):
            killer = None
            if rng.random() < KILL_PROBABILITY:
                killer = threading.Timer(rng.uniform(0, KILL_WITHIN_MS) / 1000, catalog.kill)
                killer.start()
            try:
                table.append(pa.table({"id": pa.array([i], pa.int64())}))
                snapshot = table.metadata.current_snapshot()
                assert snapshot is not None
                acknowledged.append(snapshot.snapshot_id)
            except Exception:  # the kill cut the request (connection error) or a stale table lost the race (409)
                refused += 1
            if killer is not None:
                killer.join()
                kills += 1
                catalog.reap()
                assert _integrity_check(catalog.database) == ["ok"]
                catalog.start()
                table = _load_verified(catalog)  # a half-applied commit would fail this load (422)
                pointer, pin, locations = _pointer_and_pin(catalog.database)
                assert pointer == pin == table.metadata_location and locations == 1
        final = _load_verified(catalog)
        logged = {entry.snapshot_id for entry in final.metadata.snapshot_log}
        lost = [snapshot_id for snapshot_id in acknowledged if snapshot_id not in logged]
        assert not lost, f"{len(lost)} acknowledged commits are missing from the snapshot log"
        assert final.scan().to_arrow().num_rows >= len(acknowledged)
    finally:
        catalog.reap()
    pointer, pin, locations = _pointer_and_pin(catalog.database)
    assert pointer == pin == final.metadata_location and locations == 1
    assert _integrity_check(catalog.database) == ["ok"]
    assert kills >= 5 and len(acknowledged) >= COMMITS // 2, (kills, len(acknowledged), refused)
