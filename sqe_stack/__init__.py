"""The local stack: an S3 + STS store (moto, or Ceph RGW for enforcement) plus ``sqe-catalog``, as background
processes on loopback, described by ``DIR/stack.json``.

A development tool beside the engine, not part of it: ``sqe stack ...`` dispatches here, ``make demo`` runs
``sqe_stack.demo`` and the test session fixtures start their moto and catalog processes with the same
functions. The moto store needs the ``stack`` extra (``pip install 'sqe[stack]'``).

Python API (the CLI in ``sqe_stack.cli`` is a thin wrapper)::

    info = start_stack(Path("/tmp/s"), store="moto")      # returns once everything answers
    info.principal_config("analyst")                      # ready SQE config file (0600)
    info.server_url                                       # `sqe serve` acting as reader sqe-engine
    stop_stack(Path("/tmp/s"))                            # stops exactly the recorded PIDs
    apply_client_env(info.store)                          # client env a store needs (Ceph: the RGW write fix)
    admin_s3_client(info)                                 # boto3 with the catalog's key: test set-up only

``stack.json`` holds endpoints, PIDs and config paths, never a secret: client secrets live only in the 0600
principal config files, the catalog's S3 key and token signing key only in the 0600 ``catalog.toml``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqe._text import first_line
from sqe_stack.catalog import (
    BUCKET,
    CATALOG_DB,
    REGION,
    WAREHOUSE,
    PrincipalCredentials,
    bootstrap_principals,
    read_catalog_key,
    read_engine_credentials,
    read_store_handle,
    spawn_catalog,
    wait_for_catalog,
    write_engine_configs,
    write_stack_catalog_config,
)
from sqe_stack.ceph import CEPH_CLIENT_ENV, CEPH_PACKAGES
from sqe_stack.external import ExternalStore
from sqe_stack.provision import (
    Daemon,
    MissingExtraError,
    StackError,
    StoreHandle,
    create_bucket,
    free_port,
    pid_matches,
    stop_daemon,
)
from sqe_stack.service import READER, create_reader_principal, start_service

__all__ = [
    "CEPH_CLIENT_ENV",
    "CEPH_PACKAGES",
    "STORES",
    "ExternalStore",
    "MissingExtraError",
    "PrincipalCredentials",
    "PrincipalInfo",
    "StackError",
    "StackInfo",
    "admin_s3_client",
    "apply_client_env",
    "client_env",
    "load_stack",
    "stack_status",
    "start_stack",
    "stop_stack",
]

STORES = ("moto", "ceph", "external")  # external: already running (sqe_stack.external)
STACK_FILE = "stack.json"
LOCK_FILE = ".stack.lock"
CATALOG_DB_FILES = tuple(CATALOG_DB + suffix for suffix in ("", "-journal", "-wal", "-shm"))


@dataclass(frozen=True)
class PrincipalInfo:
    """A demo principal: its ready SQE config (0600, holding the secret) and its client id."""

    config: Path  # mode 0600: it holds the client secret
    client_id: str


@dataclass(frozen=True)
class StackInfo:
    """What ``DIR/stack.json`` says. Secrets are read on demand from the 0600 files, never stored here."""

    dir: Path
    store: str
    state: str  # starting | running | stopped | failed
    s3_endpoint: str
    sts_endpoint: str
    catalog_uri: str
    catalog_config: Path
    warehouse: str
    bucket: str
    region: str
    pids: Mapping[str, int]
    markers: Mapping[str, tuple[str, ...]] = field(repr=False)
    principals: Mapping[str, PrincipalInfo]
    started_at: str
    stopped_at: str | None = None
    # seconds from the start of `up` to: store_ready_s, principals_ready_s, server_ready_s, total_s
    timings: Mapping[str, float] = field(default_factory=dict)
    server_url: str = ""  # the stack's `sqe serve` (Flight SQL), acting as the reader principal sqe-engine
    workers: tuple[str, ...] = ()  # addresses of the server's scan workers

    def principal_config(self, name: str) -> Path:
        """Path of the ready-to-use SQE config file of a demo principal (admin, analyst, writer)."""
        if name not in self.principals:
            raise StackError(f"no demo principal {name!r} (have: {', '.join(sorted(self.principals))})")
        return self.principals[name].config

    def principal_credentials(self, name: str) -> PrincipalCredentials:
        """Client id and secret of a demo principal, read from its 0600 config (secret kept out of repr)."""
        return read_engine_credentials(self.principal_config(name), name)

    def catalog_s3_key(self) -> tuple[str, str]:
        """The catalog's static S3 key (access key id, secret): for test set-up and inspection only."""
        return read_catalog_key(self.catalog_config)

    def running_store(self) -> StoreHandle:
        """This stack's store, for another catalog to use beside it; stopping the store stays this stack's job."""
        return read_store_handle(self.catalog_config, self.store)

    def daemons(self) -> list[Daemon]:
        """The stack's processes in start order (stop them in reverse)."""
        return [Daemon(name=n, pid=p, markers=tuple(self.markers.get(n, ()))) for n, p in self.pids.items()]

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "state": self.state,
            "s3_endpoint": self.s3_endpoint,
            "sts_endpoint": self.sts_endpoint,
            "catalog_uri": self.catalog_uri,
            "catalog_config": str(self.catalog_config),
            "warehouse": self.warehouse,
            "bucket": self.bucket,
            "region": self.region,
            "pids": dict(self.pids),
            "process_markers": {n: list(m) for n, m in self.markers.items()},
            "principals": {n: {"config": str(p.config), "client_id": p.client_id} for n, p in self.principals.items()},
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
            "timings": dict(self.timings),
            "server_url": self.server_url,
            "workers": list(self.workers),
        }

    @classmethod
    def from_json(cls, dir: Path, doc: Mapping[str, Any]) -> StackInfo:
        try:
            return cls(
                dir=dir,
                store=str(doc["store"]),
                state=str(doc["state"]),
                s3_endpoint=str(doc["s3_endpoint"]),
                sts_endpoint=str(doc["sts_endpoint"]),
                catalog_uri=str(doc["catalog_uri"]),
                catalog_config=Path(doc["catalog_config"]),
                warehouse=str(doc["warehouse"]),
                bucket=str(doc["bucket"]),
                region=str(doc["region"]),
                pids={str(n): int(p) for n, p in doc["pids"].items()},
                markers={str(n): tuple(str(x) for x in m) for n, m in doc["process_markers"].items()},
                principals={
                    str(n): PrincipalInfo(config=Path(p["config"]), client_id=str(p["client_id"]))
                    for n, p in doc["principals"].items()
                },
                started_at=str(doc["started_at"]),
                stopped_at=doc.get("stopped_at"),
                timings={str(k): float(v) for k, v in doc.get("timings", {}).items()},
                server_url=str(doc.get("server_url", "")),
                workers=tuple(str(w) for w in doc.get("workers", ())),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise StackError(f"{dir / STACK_FILE} is not a valid stack file") from None


def client_env(store: str) -> dict[str, str]:
    """Environment variables a client process needs for this store before pyarrow's S3 layer starts."""
    return dict(CEPH_CLIENT_ENV) if store == "ceph" else {}


def apply_client_env(store: str) -> None:
    """Set :func:`client_env` in this process (call before the first pyarrow S3 filesystem is created).

    Part of the stack's Python API for client programs of a stack (the benchmarks call it; the Ceph quickstart
    README tells users to): the stack's own processes get the same variables when they are spawned.
    """
    os.environ.update(client_env(store))


def admin_s3_client(info: StackInfo) -> Any:
    """A boto3 S3 client signed with the catalog's static key (full access to the store).

    Part of the stack's Python API for tests that use the stack as their launcher (documented in the local
    quickstart README): they seed and inspect the bucket with it. Set-up and inspection only: clients of the
    engine never hold this key, they read through vended credentials.
    """
    import boto3
    from botocore.config import Config

    access_key, secret_key = info.catalog_s3_key()
    return boto3.client(
        "s3",
        endpoint_url=info.s3_endpoint,
        region_name=info.region,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    )


def load_stack(dir: Path) -> StackInfo:
    """Read ``DIR/stack.json``."""
    dir = Path(dir).resolve()
    path = dir / STACK_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise StackError(f"no stack in {dir} ({STACK_FILE} not found)") from None
    except ValueError:
        raise StackError(f"{path} is not valid JSON") from None
    if not isinstance(doc, dict):
        raise StackError(f"{path} is not a valid stack file")
    return StackInfo.from_json(dir, doc)


def _save(info: StackInfo) -> None:
    tmp = info.dir / f".{STACK_FILE}.tmp"
    tmp.write_text(json.dumps(info.to_json(), indent=2) + "\n")
    os.replace(tmp, info.dir / STACK_FILE)


@contextlib.contextmanager
def _locked(dir: Path) -> Iterator[None]:
    """Serialise ``up``/``down`` on one DIR (a second concurrent command fails instead of racing)."""
    with open(dir / LOCK_FILE, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StackError(f"another `sqe stack` command is working on {dir}") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _refuse_if_running(dir: Path) -> None:
    if not (dir / STACK_FILE).exists():
        return
    try:
        old = load_stack(dir)
    except StackError:
        return  # unreadable leftovers: nothing we could stop anyway
    alive = [d.name for d in old.daemons() if pid_matches(d.pid, d.markers)]
    if alive:
        raise StackError(
            f"a {old.store} stack is already running in {dir} ({', '.join(alive)}); "
            f"run `sqe stack down --dir {dir}` first"
        )


class _Progress:
    """Writes stack.json after each step of ``up``: even an interrupted ``up`` leaves PIDs for ``down``."""

    def __init__(self, dir: Path, store: str, started: list[Daemon]) -> None:
        self.dir, self.store, self.started = dir, store, started
        self.started_at = _now()
        self.t0 = time.monotonic()
        self.s3_endpoint = self.sts_endpoint = self.catalog_uri = ""
        self.principals: dict[str, PrincipalInfo] = {}
        self.timings: dict[str, float] = {}
        self.server_url = ""
        self.workers: tuple[str, ...] = ()

    def mark(self, step: str) -> None:
        """Record how long ``up`` had taken when ``step`` was done."""
        self.timings[step] = round(time.monotonic() - self.t0, 2)

    def save(self, state: str = "starting") -> StackInfo:
        info = StackInfo(
            dir=self.dir,
            store=self.store,
            state=state,
            s3_endpoint=self.s3_endpoint,
            sts_endpoint=self.sts_endpoint,
            catalog_uri=self.catalog_uri,
            catalog_config=self.dir / "catalog.toml",
            warehouse=WAREHOUSE,
            bucket=BUCKET,
            region=REGION,
            pids={d.name: d.pid for d in self.started},
            markers={d.name: d.markers for d in self.started},
            principals=dict(self.principals),
            started_at=self.started_at,
            timings=dict(self.timings),
            server_url=self.server_url,
            workers=self.workers,
        )
        _save(info)
        return info


def _start_store(dir: Path, store: str, started: list[Daemon], external: ExternalStore | None) -> StoreHandle:
    if store == "external":
        if external is None:
            raise StackError("--store external needs --s3-endpoint, --role-arn and the catalog's key")
        return external.handle()  # nothing started: `down` never touches the external store
    if store == "ceph":
        from sqe_stack.ceph import start_ceph

        return start_ceph(dir / "ceph", started)
    from sqe_stack.moto import start_moto

    return start_moto(dir / "logs" / "moto.log", started)


def _start(
    dir: Path,
    store_kind: str,
    credential_lifetime: int,
    started: list[Daemon],
    external: ExternalStore | None,
    serve: bool,
    workers: int,
) -> StackInfo:
    progress = _Progress(dir, store_kind, started)
    progress.save()
    store = _start_store(dir, store_kind, started, external)
    progress.s3_endpoint, progress.sts_endpoint = store.s3_endpoint, store.sts_endpoint
    progress.mark("store_ready_s")
    progress.save()
    create_bucket(store, BUCKET, REGION)
    for name in CATALOG_DB_FILES:  # the store's data lives in memory, so old table metadata would dangle
        (dir / name).unlink(missing_ok=True)
    port = free_port()
    config_path = write_stack_catalog_config(dir, port, store, credential_lifetime)
    credentials = bootstrap_principals(config_path)
    credentials[READER] = create_reader_principal(config_path)
    progress.mark("principals_ready_s")
    # The catalog writes table metadata through pyarrow: give it the RGW write fix whatever the store
    # (moto accepts requests either way).
    started.append(spawn_catalog(dir, config_path, client_env("ceph")))
    progress.save()
    progress.catalog_uri = wait_for_catalog(dir, port, started[-1])
    paths = write_engine_configs(dir, list(credentials.values()), progress.catalog_uri, store.s3_endpoint)
    progress.principals = {n: PrincipalInfo(paths[n], c.client_id) for n, c in credentials.items()}
    if serve:
        progress.save()
        service = start_service(dir, credentials[READER], progress.catalog_uri, store.s3_endpoint, workers, started)
        progress.server_url, progress.workers = service.url, service.workers
        progress.mark("server_ready_s")
    progress.mark("total_s")
    return progress.save(state="running")


def start_stack(
    dir: Path,
    store: str = "moto",
    credential_lifetime: int = 3600,
    external: ExternalStore | None = None,
    *,
    serve: bool = True,
    workers: int = 0,
) -> StackInfo:
    """Start the store, the catalog and (``serve``) ``sqe serve`` with ``workers`` workers; return once all answer.

    ``store="external"`` starts no store: ``external`` (see :func:`sqe_stack.external.external_store`) names a
    running one, whose bucket is created when missing.

    On any failure every process started so far is stopped and :class:`StackError` is raised.
    """
    if store not in STORES:
        raise StackError(f"unknown store {store!r} (choose from {', '.join(STORES)})")
    if credential_lifetime < 1:
        raise StackError("credential lifetime must be at least 1 second")
    if workers < 0 or (workers and not serve):
        raise StackError("workers need the server (serve=True) and cannot be negative")
    dir = Path(dir).resolve()
    try:
        dir.mkdir(parents=True, exist_ok=True)
        (dir / "logs").mkdir(exist_ok=True)
    except OSError as exc:  # a file in the way, no permission, a read-only file system
        raise StackError(f"cannot use {dir} as the stack directory: {exc.strerror or exc}") from None
    with _locked(dir):
        _refuse_if_running(dir)
        started: list[Daemon] = []
        try:
            return _start(dir, store, credential_lifetime, started, external, serve, workers)
        except BaseException as exc:
            for daemon in reversed(started):
                stop_daemon(daemon)
            with contextlib.suppress(Exception):
                failed = load_stack(dir)
                _save(_with_state(failed, "failed"))
            if isinstance(exc, StackError) or not isinstance(exc, Exception):
                raise
            raise StackError(f"stack up failed: {type(exc).__name__}: {first_line(exc)}") from None


def _with_state(info: StackInfo, state: str) -> StackInfo:
    doc = info.to_json()
    doc["state"] = state
    doc["stopped_at"] = _now()
    return StackInfo.from_json(info.dir, doc)


def stop_stack(dir: Path) -> dict[str, str]:
    """Stop exactly the processes recorded in ``stack.json``, last started first. Idempotent.

    Returns, per process, what happened: ``stopped``, ``killed`` (needed SIGKILL), ``gone`` (already dead)
    or ``not-ours`` (the PID now belongs to another program, which is left alone).
    """
    dir = Path(dir).resolve()
    load_stack(dir)  # a clear error for a DIR without a stack, before touching it
    with _locked(dir):
        info = load_stack(dir)
        outcome = {d.name: stop_daemon(d) for d in reversed(info.daemons())}
        if info.state != "stopped":
            _save(_with_state(info, "stopped"))
        return outcome


def stack_status(dir: Path) -> tuple[StackInfo, dict[str, bool]]:
    """The stack file and, per process, whether it is alive and still the process that was started."""
    info = load_stack(dir)
    return info, {d.name: pid_matches(d.pid, d.markers) for d in info.daemons()}
