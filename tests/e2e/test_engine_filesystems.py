"""Short-lived vended credentials do not leak filesystems, sockets or eventfds (issue 17's soak defect).

A catalog vends 2-second credentials (usable for about 1 s), so every query below runs with a new set, as in
the soak with 5-second ones. Each set needs a pyarrow filesystem of its own (an AWS SDK client with eventfds and
kept-alive sockets); before the fix the footer cache pinned every one of them (about four eventfds per query,
never released). Real credential lifetimes and real sleeps; counted from /proc, in this process (the embedded
engine) and in real worker processes (distributed scans).
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import sqe.api
from sqe.catalog.rest import RestTableProvider
from sqe.config import load_config
from sqe.credentials.pool import FILE_IOS, FILESYSTEMS, MIN_HOLD_SECONDS
from sqe.distributed.coordinator import DistributedOptions
from sqe.execution.cache import FRAGMENTS, clear_process_caches
from sqe.session import Session
from sqe.vocabulary import S3_ACCESS_KEY_ID
from tests.conftest import catalog_variant, pyiceberg_catalog, write_sqe_config

if TYPE_CHECKING:
    from tests.conftest import CatalogServer, MotoServer, WorkerFactory, WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.usefixtures("bogus_aws_env")]

LIFETIME_SECONDS = 2  # usable for half of it: every query after a ~1 s pause loads a new set
QUERIES = 15
QUERY = "SELECT sum(id) AS total, max(tag) AS last FROM ns.t"
EXPECTED = [(21, "f")]
# Sets released at expiry but held at least MIN_HOLD_SECONDS: about MIN_HOLD / pause of them are live at once,
# one filesystem each. Before the fix every query added one for good (QUERIES of them, four eventfds each).
LIVE_SETS_BOUND = 8
FD_GROWTH_BOUND = 20


def fd_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_kinds(pid: int | str = "self") -> dict[str, int]:
    """Descriptors by kind (socket, anon_inode = eventfd, pipe, file), for the failure message."""
    kinds: collections.Counter[str] = collections.Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kinds[target.split(":", 1)[0] if ":" in target else "file"] += 1
    return dict(kinds)


@pytest.fixture(scope="module")
def short_catalog(tmp_path_factory: pytest.TempPathFactory, moto_server: MotoServer) -> Iterator[CatalogServer]:
    workdir = tmp_path_factory.mktemp("short-credentials-catalog")
    with catalog_variant(
        workdir, moto_server, credential_lifetime_seconds=LIFETIME_SECONDS, location="s3://warehouse/fdbound"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def owner_config(short_catalog: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ns.t with three data files, written through vended credentials; the owner's config reads it."""
    owner = short_catalog.admin
    pyiceberg_catalog(short_catalog, owner).create_namespace("ns")
    path = write_sqe_config(
        tmp_path_factory.mktemp("owner") / "owner.toml", short_catalog.url, owner, short_catalog.moto
    )
    with sqe.api.connect(path) as session:
        session.sql("CREATE TABLE ns.t AS SELECT * FROM (VALUES (1, 'a'), (2, 'b')) v(id, tag)")
        session.sql("INSERT INTO ns.t VALUES (3, 'c'), (4, 'd')")
        session.sql("INSERT INTO ns.t VALUES (5, 'e'), (6, 'f')")
    return path


def run_with_fresh_credentials(session: Session, queries: int) -> set[str]:
    """Run QUERY ``queries`` times, each after the previous set's usable point; returns the access keys used."""
    keys: set[str] = set()
    for _ in range(queries):
        assert session.sql(QUERY).fetchall() == EXPECTED
        [stream] = session.last_streams
        loaded = stream.plan.loaded
        keys.add(str(loaded.io.resolve(loaded.table.location()).properties[S3_ACCESS_KEY_ID]))  # type: ignore[attr-defined]
        assert loaded.usable_until is not None
        time.sleep(max(0.0, loaded.usable_until - time.time()) + 0.1)
    return keys


def test_embedded_queries_with_short_credentials_keep_filesystems_and_descriptors_bounded(owner_config: Path) -> None:
    clear_process_caches()  # the pool is per process: earlier tests' long-lived sets would count here
    with sqe.api.connect(owner_config) as session:
        run_with_fresh_credentials(session, 2)  # warm-up: DuckDB, pyarrow's thread pools, the catalog client
        fds, live = fd_count(), FILESYSTEMS.live
        keys = run_with_fresh_credentials(session, QUERIES)
        assert len(keys) >= QUERIES - 2, "the credentials did not rotate: this test would prove nothing"
        growth, kinds = fd_count() - fds, fd_kinds()
        assert growth <= FD_GROWTH_BOUND, (growth, kinds)
        assert FILESYSTEMS.live - live <= LIVE_SETS_BOUND, FILESYSTEMS.snapshot()
        assert len(FILE_IOS) <= LIVE_SETS_BOUND

        # Once every earlier set has expired, one more query releases them all, footers included.
        time.sleep(MIN_HOLD_SECONDS + 0.5)
        assert session.sql(QUERY).fetchall() == EXPECTED
        [stream] = session.last_streams
        current = stream.plan.loaded.io.resolve(stream.plan.loaded.table.location()).identity  # type: ignore[attr-defined]
        assert len(FILE_IOS) <= 2 and current in FILE_IOS
        assert FILESYSTEMS.live <= live, FILESYSTEMS.snapshot()
        assert {key[2] for key in FRAGMENTS.snapshot_keys()} <= {current}  # the kept footers are the current set's only
        assert fd_count() - fds <= FD_GROWTH_BOUND // 2, fd_kinds()


def test_distributed_queries_with_short_credentials_keep_worker_descriptors_bounded(
    owner_config: Path, worker_process_factory: WorkerFactory
) -> None:
    token = os.urandom(16).hex()
    workers: list[WorkerProcess] = [worker_process_factory.start(token=token) for _ in range(2)]
    try:
        config = load_config(
            owner_config, env={}, overrides={"coordinator": {"workers": [w.address for w in workers], "token": token}}
        )
        options = DistributedOptions(max_files_per_fragment=1, idle_timeout_seconds=10.0)
        with Session(RestTableProvider(config), config, distributed=options) as session:
            run_with_fresh_credentials(session, 2)
            start = {w.proc.pid: fd_count(w.proc.pid) for w in workers}
            run_with_fresh_credentials(session, QUERIES)
            growth = {pid: fd_count(pid) - fds for pid, fds in start.items()}
            assert all(g <= FD_GROWTH_BOUND for g in growth.values()), (growth, [fd_kinds(p) for p in start])
    finally:
        for worker in workers:
            worker.stop()
