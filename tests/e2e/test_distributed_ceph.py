"""Distributed scans on the Ceph RGW enforcement store, where vended credentials live 5 seconds.

RGW really rejects an expired session token, and workers refuse to open a file with an expired set, so a paced
scan that runs well past one credential lifetime finishes only if the coordinator pushes fresh sets in time:

- with pushing on, every row comes back and each worker opened files with more than one access key;
- with ``push_credentials = false`` the same scan fails with the credential-expired error;
- after the user's grant is revoked mid-scan, the refresh gets 403, nothing more is pushed, and the scan fails
  cleanly once the last pushed set expires.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog

from sqe.config import SQEConfig, load_config
from sqe.errors import CredentialExpiredError
from sqe.session import Session
from sqe_catalog.cli import main as catalog_cli
from sqe_stack import StackInfo
from sqe_stack.catalog import Grant, PrincipalSpec, create_principal
from tests.conftest import CEPH_CREDENTIAL_LIFETIME, WorkerFactory
from tests.e2e.test_distributed import TicketLog, WorkerPool, WorkerPools, distributed_session
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.ceph, pytest.mark.slow]

FILES = 16
ROWS_PER_FILE = 25
# Two workers, one fragment and one file at a time each, a pause before every file: about 8 x 1.1 s per worker,
# well over one 5-second credential lifetime.
PACE_MS = 1100
SCAN = {"slots_per_worker": 1, "max_files_per_fragment": 4, "pace_ms_per_file": PACE_MS}


@pytest.fixture(scope="module")
def worker_factory(worker_process_factory: WorkerFactory) -> Iterator[WorkerPools]:
    pools = WorkerPools(worker_process_factory)
    try:
        yield pools
    finally:
        pools.stop_all()


@pytest.fixture(scope="module")
def workers(worker_factory: WorkerPools) -> WorkerPool:
    return worker_factory.pool(2, "--max-files-in-flight", "1")


def _catalog(stack: StackInfo, credential: str) -> RestCatalog:
    return RestCatalog(
        f"dist-{uuid.uuid4().hex[:6]}",
        uri=stack.catalog_uri,
        credential=credential,
        scope="PRINCIPAL_ROLE:ALL",
        warehouse=stack.warehouse,
        **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
    )


@pytest.fixture(scope="module")
def namespace(ceph_stack: StackInfo) -> str:
    """Table ``events`` with FILES small data files, written by the demo writer (fresh credentials per file)."""
    writer = _catalog(ceph_stack, ceph_stack.principal_credentials("writer").credential)
    name = f"dist_{uuid.uuid4().hex[:8]}"
    writer.create_namespace(name)
    schema = pa.schema([("id", pa.int64()), ("payload", pa.string())])
    writer.create_table((name, "events"), schema=schema)
    for n in range(FILES):
        ids = list(range(n * ROWS_PER_FILE, (n + 1) * ROWS_PER_FILE))
        rows = pa.table({"id": pa.array(ids, pa.int64()), "payload": [f"row-{i}" for i in ids]}, schema=schema)
        writer.load_table((name, "events")).append(rows)  # a fresh load: 5-second credentials
    return name


def _config(path: Path, pool: WorkerPool, **coordinator: Any) -> SQEConfig:
    overrides = {"coordinator": {"workers": pool.addresses, "token": pool.token, **coordinator}}
    return load_config(path, env={}, overrides=overrides)


def _count(session: Session, namespace: str) -> list[tuple[Any, ...]]:
    return session.sql(f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {namespace}.events").fetchall()


EXPECTED = [(FILES * ROWS_PER_FILE, FILES * ROWS_PER_FILE, 0, FILES * ROWS_PER_FILE - 1)]


def _settled_reloads(executor: Any, lease: Any) -> int:
    """The executor's catalog calls for refreshes, once no refresh of ``lease`` is in flight: a lease counts its
    reload before the call, the executor after it answers, so a refresh running at the scan's end (a busy
    machine) is on one side only for a moment."""
    deadline = time.monotonic() + 15
    while True:
        calls = executor.stats.credential_endpoint_calls + executor.stats.table_reloads
        if (calls == lease.stats.reloads and not lease.refreshing) or time.monotonic() > deadline:
            return int(calls)
        time.sleep(0.05)


def test_pushed_credentials_carry_a_scan_past_their_lifetime(
    ceph_stack: StackInfo, namespace: str, workers: WorkerPool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = _config(ceph_stack.principal_config("analyst"), workers)
    before = _key_counts(config, workers)
    started = time.monotonic()
    with distributed_session(config, **SCAN) as session:
        log = TicketLog().attach(session)
        assert _count(session, namespace) == EXPECTED
        elapsed = time.monotonic() - started
        executor = session.distributed_executor
        assert executor is not None
        stats = executor.worker_stats()
        [lease] = executor.refresher.leases()
    assert elapsed > 1.5 * CEPH_CREDENTIAL_LIFETIME
    assert lease.stopped is None and lease.stats.pushes >= 1 and log.pushes
    assert executor.stats.pushes_sent >= 1 and executor.stats.pushes_refused == 0
    # the store accepted more than one credential: each worker opened files with several access keys
    assert all(stats[a].credential_sets_used - before[a] >= 2 for a in workers.addresses), stats
    assert sum(stats[a].refreshes_accepted for a in workers.addresses) >= 1
    # one catalog round trip per refresh of the (user, table) lease, however many fragments and workers
    reloads = _settled_reloads(executor, lease)
    assert reloads == lease.stats.reloads <= elapsed / (CEPH_CREDENTIAL_LIFETIME / 4)
    text = caplog.text + workers.logs()
    assert log.secrets() and not [s for s in log.secrets() if s in text]


def test_pushed_sets_keep_the_load_tables_endpoint_when_sqe_names_none(
    ceph_stack: StackInfo, namespace: str, workers: WorkerPool
) -> None:
    # The catalog sends its store's endpoint in load-table's config; its credentials endpoint answers with keys
    # only. Without a [storage] endpoint, sets pushed from that answer went to AWS's hosts on the workers (the
    # local path keeps the load's settings under a refresh), and the scan failed once the first set expired.
    config = load_config(
        ceph_stack.principal_config("analyst"),
        env={},
        overrides={
            "coordinator": {"workers": workers.addresses, "token": workers.token},
            "storage": {"endpoint": ""},
        },
    )
    assert not config.storage.endpoint
    with distributed_session(config, **SCAN) as session:
        log = TicketLog().attach(session)
        assert _count(session, namespace) == EXPECTED
        executor = session.distributed_executor
        assert executor is not None
        [lease] = executor.refresher.leases()
    assert lease.stopped is None and lease.stats.pushes >= 1 and log.pushes
    assert executor.stats.credential_endpoint_calls >= 1


def test_without_pushing_the_same_scan_fails_with_expired_credentials(
    ceph_stack: StackInfo, namespace: str, workers: WorkerPool
) -> None:
    config = _config(ceph_stack.principal_config("analyst"), workers, push_credentials=False)
    with distributed_session(config, **SCAN) as session:
        log = TicketLog().attach(session)
        with pytest.raises(CredentialExpiredError, match="expired"):
            _count(session, namespace)
        executor = session.distributed_executor
        assert executor is not None and executor.refresher.leases() == []
    assert log.tickets and log.pushes == []


def test_a_revoked_grant_stops_the_refresh_and_the_scan_fails_at_expiry(
    ceph_stack: StackInfo, namespace: str, workers: WorkerPool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    user, role = f"revokee_{uuid.uuid4().hex[:6]}", f"revokee_role_{uuid.uuid4().hex[:6]}"
    read = Grant("TABLE_READ_DATA", (namespace,))
    spec = PrincipalSpec(user, role=role, grants=[read], warehouse=ceph_stack.warehouse)
    made = create_principal(ceph_stack.catalog_config, spec)
    path = _engine_config(ceph_stack, tmp_path, made.client_id, made.client_secret)
    config = _config(path, workers)
    with distributed_session(config, **SCAN) as session:
        log = TicketLog().attach(session)
        errors: list[BaseException] = []
        thread = threading.Thread(target=lambda: _capture(errors, lambda: _count(session, namespace)), daemon=True)
        thread.start()
        wait_until(lambda: (session.progress() or {}).get("files_done", 0) >= 1, "a file read")
        _admin(
            ceph_stack, "revoke", role, read.privilege, "--warehouse", ceph_stack.warehouse, "--namespace", namespace
        )
        revoked_at = time.time()
        thread.join(60)
    assert len(errors) == 1 and isinstance(errors[0], CredentialExpiredError), errors
    assert "no refreshed set arrived" in str(errors[0])
    stops = [r.getMessage() for r in caplog.records if "credential refresh of" in r.getMessage()]
    assert len(stops) == 1 and "PermissionDeniedError" in stops[0] and "nothing pushed" in stops[0]
    assert not [at for at, _, _ in log.pushes if at > revoked_at]


def _admin(stack: StackInfo, *args: str) -> str:
    """``sqe-catalog admin --config <the stack's catalog.toml> ARGS``, in-process (the CLI's own code)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = catalog_cli(["admin", "--config", str(stack.catalog_config), *args])
    assert code == 0, err.getvalue()
    return out.getvalue()


def _engine_config(stack: StackInfo, dir: Path, client_id: str, client_secret: str) -> Path:
    """The demo analyst's config file with another principal's client credentials."""
    text = stack.principal_config("analyst").read_text(encoding="utf-8")
    analyst = stack.principal_credentials("analyst")
    text = text.replace(analyst.client_id, client_id).replace(analyst.client_secret, client_secret)
    path = dir / "revokee.toml"
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)
    return path


def _key_counts(config: SQEConfig, pool: WorkerPool) -> dict[str, int]:
    with distributed_session(config) as session:
        executor = session.distributed_executor
        assert executor is not None
        return {address: stats.credential_sets_used for address, stats in executor.worker_stats().items()}


def _capture(errors: list[BaseException], call: Any) -> None:
    try:
        call()
    except BaseException as exc:
        errors.append(exc)
