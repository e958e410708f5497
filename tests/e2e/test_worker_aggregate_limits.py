"""Each fragment's partial aggregation within its own DuckDB limits, on real ``sqe-worker`` processes (flow tier).

Workers started with small ``--aggregate-memory-bytes`` and no spill space: a high-cardinality GROUP BY runs past
its database's limits and fails the query with ``QueryResourceError`` (worker kind ``resource-limit``), tried on
one worker only, while another user's small aggregate running at the same time on the same workers succeeds.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from sqe.config import load_config
from sqe.errors import QueryResourceError
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.e2e.test_distributed import (
    WRITER_GRANTS,
    TicketLog,
    WorkerPool,
    WorkerPools,
    coordinator_overrides,
    distributed_session,
    worker_factory,  # noqa: F401  (the module-scoped pool fixture)
    worker_stats,
)

if TYPE_CHECKING:
    from sqe.session import Session
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

WIDE_ROWS = 300_000  # distinct (id, label) groups: far past 16 MiB of DuckDB memory
SMALL_FILES = 2
SMALL_ROWS_PER_FILE = 40
LIMIT_FLAGS = ("--max-fragments", "4", "--aggregate-memory-bytes", str(16 << 20), "--aggregate-spill-bytes", "0")


@pytest.fixture(scope="module")
def namespace(catalog_server: CatalogServer) -> str:
    """``<ns>.wide`` (one file, every row its own group) and ``<ns>.small`` (two files, four groups)."""
    writer = catalog_server.principal_with_grants(f"lim_writer_{uuid.uuid4().hex[:6]}", WRITER_GRANTS)
    catalog = pyiceberg_catalog(catalog_server, writer)
    namespace = f"lim_{uuid.uuid4().hex[:6]}"
    catalog.create_namespace(namespace)
    wide = pa.table(
        {
            "id": pa.array(range(WIDE_ROWS), pa.int64()),
            "label": pa.array([f"label-{i:034d}" for i in range(WIDE_ROWS)], pa.string()),
        }
    )
    catalog.create_table((namespace, "wide"), schema=wide.schema).append(wide)
    small_schema = pa.schema([("id", pa.int64()), ("grp", pa.string())])
    small = catalog.create_table((namespace, "small"), schema=small_schema)
    for n in range(SMALL_FILES):
        ids = range(n * SMALL_ROWS_PER_FILE, (n + 1) * SMALL_ROWS_PER_FILE)
        small.append(pa.table({"id": list(ids), "grp": [("a", "b", "c", "d")[i % 4] for i in ids]}, small_schema))
    return namespace


@pytest.fixture(scope="module")
def reader(catalog_server: CatalogServer, namespace: str) -> CatalogPrincipal:
    return catalog_server.principal_with_grants(f"lim_reader_{uuid.uuid4().hex[:6]}", [("TABLE_READ_DATA", None, None)])


@pytest.fixture(scope="module")
def limited(worker_factory: WorkerPools) -> WorkerPool:  # noqa: F811
    return worker_factory.pool(2, *LIMIT_FLAGS)


@pytest.fixture
def reader_config(catalog_server: CatalogServer, reader: CatalogPrincipal, tmp_path: Path) -> Path:
    return write_sqe_config(tmp_path / "reader.toml", catalog_server.url, reader, catalog_server.moto)


def _workers_running_a_fragment(session: Session) -> int:
    return sum(1 for stats in worker_stats(session).values() if stats.fragments_running >= 1)


def _fragments_failed(session: Session) -> int:
    return sum(int(stats.fragments_failed) for stats in worker_stats(session).values())


def test_a_fragment_past_its_limits_fails_typed_while_a_concurrent_small_one_succeeds(
    reader_config: Path, namespace: str, limited: WorkerPool
) -> None:
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(limited))
    small_sql = f"SELECT grp, count(*) AS n FROM {namespace}.small GROUP BY grp ORDER BY grp"
    wide_sql = f"SELECT id, label, count(*) AS n FROM {namespace}.wide GROUP BY id, label"
    # the small statement's workers sleep before each file, so its fragments still run while the wide one fails;
    # one file per fragment and one fragment per worker: each worker runs one of them when the wide one starts
    small_options = {"pace_ms_per_file": 1500, "max_files_per_fragment": 1, "slots_per_worker": 1}
    with (
        distributed_session(config, **small_options) as small_session,
        distributed_session(config) as wide_session,
    ):
        outcome: dict[str, object] = {}

        def run_small() -> None:
            try:
                outcome["rows"] = small_session.sql(small_sql).fetchall()
            except BaseException as exc:  # the test inspects it
                outcome["error"] = exc

        thread = threading.Thread(target=run_small, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while _workers_running_a_fragment(small_session) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _workers_running_a_fragment(small_session) == 2, "the small statement's fragments never started"
        failed_before = _fragments_failed(wide_session)
        log = TicketLog().attach(wide_session)
        with pytest.raises(QueryResourceError) as raised:
            wide_session.sql(wide_sql).fetchall()
        assert wide_session.last_execution_path == "partial-aggregate"
        failed = _fragments_failed(wide_session) - failed_before
        thread.join(60)
        assert not thread.is_alive()

    message = str(raised.value)
    assert "\n" not in message
    assert ": partial aggregation ran past its DuckDB limits (memory 16777216 bytes, spill 0 bytes" in message
    assert "--aggregate-memory-bytes" in message and "Out of Memory" in message
    # tried once: every worker lends the same limits, so another attempt would only fail again
    assert len(log.tickets) == 1 and log.tickets[0][1].HasField("partial_aggregate")
    assert failed == 1
    assert "error" not in outcome, outcome.get("error")
    per_group = SMALL_FILES * SMALL_ROWS_PER_FILE // 4
    assert outcome["rows"] == [(g, per_group) for g in ("a", "b", "c", "d")]
