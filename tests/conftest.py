"""Session-scoped servers shared by every test tier (one moto, one catalog, one Ceph cluster, workers per session)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from sqe_catalog.config import MIN_SECRET_HASH_SCRYPT_N
from sqe_stack import StackInfo, client_env, start_stack, stop_stack
from sqe_stack import catalog as stack_catalog
from sqe_stack import moto as moto_store
from sqe_stack.catalog import catalog_log_path
from sqe_stack.provision import Daemon, StackError, StoreHandle, create_bucket, free_port
from tests.helpers.processes import stop_child
from tests.helpers.waiting import wait_until

# `make test` runs the suite on several processes (pytest-xdist): most of its time is spent waiting on servers.
# Each module runs whole on one process, so its module-scoped servers start once, and the modules that use the
# Ceph cluster all run on one process, so Ceph starts once per run. Listed here by path, since the scheduler sees
# node ids only; collection refuses a test of another module that uses the cluster.
CEPH_MODULES = frozenset(
    {
        "tests/e2e/test_catalog_integrity_ceph.py",
        "tests/e2e/test_ceph_enforcement.py",
        "tests/e2e/test_distributed_ceph.py",
        "tests/e2e/test_external_tables_ceph.py",
        "tests/soak/test_soak_short.py",
    }
)


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class _ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type information
    """xdist's scope scheduling with a module (not a class) as the unit, and one unit for the Ceph modules."""

    def _split_scope(self, nodeid: str) -> str:
        module = _module_of(nodeid)
        return "ceph" if module in CEPH_MODULES else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> _ModuleScheduling:
    return _ModuleScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    strays = sorted(
        {_module_of(i.nodeid) for i in items if "ceph_stack" in getattr(i, "fixturenames", ())} - CEPH_MODULES
    )
    if strays:
        raise pytest.UsageError(f"add {', '.join(strays)} to CEPH_MODULES in tests/conftest.py (Ceph starts once)")


# Vended credentials in the Ceph tests live 5 s: long enough for one step, short enough to watch expire.
CEPH_CREDENTIAL_LIFETIME = 5


@pytest.fixture(scope="session")
def ceph_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackInfo]:
    """A Ceph RGW stack (mon + memstore OSD + radosgw with STS, then sqe-catalog) with 5-second credentials.

    Also sets the client environment pyarrow needs for writes against RGW, before any S3 filesystem exists.
    """
    saved = {name: os.environ.get(name) for name in client_env("ceph")}
    os.environ.update(client_env("ceph"))
    dir = tmp_path_factory.mktemp("ceph-stack")
    info = start_stack(dir, store="ceph", credential_lifetime=CEPH_CREDENTIAL_LIFETIME)
    try:
        yield info
    finally:
        stop_stack(dir)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ---------------------------------------------------------------------------------------------------------
# moto_server + catalog_server: one moto (S3 + STS + IAM, IAM auth on) and one `sqe-catalog serve` process
# per session, both real subprocesses on free loopback ports, started by the stack's own launcher (sqe_stack).
# Principals, roles and grants are created as `sqe stack up` creates its own (sqe_stack.catalog.create_principal:
# the catalog's admin store on the catalog's database, in this process, while the catalog serves).


MOTO_ACCOUNT = moto_store.ACCOUNT_ID
CATALOG_WAREHOUSE = "wh"
CATALOG_BUCKET = stack_catalog.BUCKET


@dataclass(frozen=True)
class MotoServer:
    url: str
    port: int
    pid: int
    region: str
    bucket: str
    role_arn: str
    # The catalog's IAM user: the only static key in the session (IAM auth is on after set-up).
    access_key_id: str
    secret_access_key: str = field(repr=False)

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(
            service,  # type: ignore[call-overload]
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )

    def store(self) -> StoreHandle:
        """This server as the stack's store description (what the catalog config is written from)."""
        return StoreHandle(
            kind="moto",
            s3_endpoint=self.url,
            sts_endpoint=self.url,
            role_arn=self.role_arn,
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
            daemons=(),
        )


# A principal's OAuth client credentials (name, client_id, client_secret; the secret kept out of its repr).
CatalogPrincipal = stack_catalog.PrincipalCredentials


# (privilege, dotted namespace or None for the whole warehouse, table or None)
Grants = Sequence[tuple[str, str | None, str | None]]


def _grant(privilege: str, namespace: str | None, table: str | None) -> stack_catalog.Grant:
    return stack_catalog.Grant(privilege, tuple(namespace.split(".")) if namespace else None, table)


@dataclass
class CatalogServer:
    url: str
    port: int
    pid: int
    warehouse: str
    warehouse_location: str
    workdir: Path
    config_path: Path
    log_path: Path
    moto: MotoServer
    admin: CatalogPrincipal
    # Every secret handed out in the session (client secrets, vended keys, tokens): tests check the log.
    secrets: set[str] = field(default_factory=set, repr=False)

    def admin_cli(self, *args: str) -> str:
        """Run ``sqe-catalog admin --config <config> ARGS`` and return its stdout (raises on failure).

        The CLI's own ``main`` runs in-process (the same code and database as the command; a process per call
        would cost seconds of imports each). ``test_admin.py`` covers the installed script itself.
        """
        from sqe_catalog.cli import main as catalog_cli

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = catalog_cli(["admin", "--config", str(self.config_path), *args])
        if code != 0:
            raise RuntimeError(f"sqe-catalog admin {' '.join(args)} failed: {err.getvalue().strip()}")
        return out.getvalue()

    def create_principal(
        self, name: str, *, admin: bool = False, reader: bool = False, role: str = "", grants: Grants = ()
    ) -> CatalogPrincipal:
        """A new principal (an ``admin``, a ``reader``; with ``role``, that role holding ``grants`` in this
        warehouse), created as ``sqe stack up`` creates its own; its secret joins :attr:`secrets`."""
        grant_list = [_grant(*grant) for grant in grants]
        spec = stack_catalog.PrincipalSpec(name, admin, reader, role, grant_list, self.warehouse)
        principal = stack_catalog.create_principal(self.config_path, spec)
        self.secrets.add(principal.client_secret)
        return principal

    def principal_with_grants(self, name: str, grants: Grants) -> CatalogPrincipal:
        """A principal holding role ``<name>_role`` with ``(privilege, dotted namespace, table)`` grants."""
        return self.create_principal(name, role=f"{name}_role", grants=grants)

    def token(self, principal: CatalogPrincipal, scope: str = "PRINCIPAL_ROLE:ALL") -> str:
        """A client-credentials token of ``principal``; ``scope`` may name some of its roles only."""
        form = urllib.parse.urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": principal.client_id,
                "client_secret": principal.client_secret,
                "scope": scope,
            }
        ).encode()
        request = urllib.request.Request(f"{self.url}/v1/oauth/tokens", data=form, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            token = str(json.loads(response.read())["access_token"])
        self.secrets.add(token)
        return token

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def settled_log_text(self) -> str:
        """The log with the line of every request the catalog answered before this call. It writes a request's
        line just after sending the answer, in the same step of its one event loop: a request of our own sent now
        is read only after that step, so once its line is in the log, so are theirs."""
        barrier = f"/sqe-test-log-barrier/{secrets.token_hex(8)}"
        with contextlib.suppress(urllib.error.HTTPError):  # its 404 (or 401) is logged like any answer
            urllib.request.urlopen(self.url + barrier, timeout=30).close()
        wait_until(lambda: barrier in self.log_text(), "the catalog never logged the barrier request")
        return self.log_text()

    def delegated_token(self, user: CatalogPrincipal, reader: CatalogPrincipal) -> str:
        """``user``'s token exchanged (RFC 8693) with ``reader``'s: subject = the user, actor = the reader."""
        form = urllib.parse.urlencode(
            {
                "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
                "subject_token": self.token(user),
                "subject_token_type": "urn:ietf:params:oauth:token-type:access_token",
                "actor_token": self.token(reader),
                "actor_token_type": "urn:ietf:params:oauth:token-type:access_token",
            }
        ).encode()
        request = urllib.request.Request(f"{self.url}/v1/oauth/tokens", data=form, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            token = str(json.loads(response.read())["access_token"])
        self.secrets.add(token)
        return token

    def spawn_another(self, workdir: Path, **server: Any) -> tuple[Daemon, Path]:
        """A second catalog process on the same moto with its own database; returns (process, log path)."""
        port = free_loopback_port()
        config_path = write_catalog_config(workdir, self.moto, port, **server)
        return start_catalog_process(config_path, workdir, port), catalog_log_path(workdir)

    @staticmethod
    def stop_process(process: Daemon, sig: int = signal.SIGTERM) -> int:
        """Send ``sig``, wait up to 15 s (then SIGKILL); returns the exit code."""
        return stop_process(process, sig)


def free_loopback_port() -> int:
    return free_port()


def stop_process(process: Daemon, sig: int = signal.SIGTERM) -> int:
    """Stop a process the stack's launcher started (``sig``, then SIGKILL after 15 s); returns its exit code."""
    assert process.process is not None, "only processes started by this session have an exit code"
    return stop_child(process.process, signal.Signals(sig))


@contextlib.contextmanager
def start_moto(log_path: Path) -> Iterator[MotoServer]:
    """A moto server (S3 + STS + IAM) with bucket ``warehouse``, role ``lakehouse`` and IAM auth on; stopped on exit."""
    started: list[Daemon] = []
    try:
        store = moto_store.start_moto(log_path, started)
        create_bucket(store, CATALOG_BUCKET, moto_store.REGION)
        moto_store.enable_iam_auth(store.s3_endpoint)
        yield MotoServer(
            url=store.s3_endpoint,
            port=int(urllib.parse.urlsplit(store.s3_endpoint).port or 0),
            pid=store.daemons[0].pid,
            region=moto_store.REGION,
            bucket=CATALOG_BUCKET,
            role_arn=store.role_arn,
            access_key_id=store.access_key_id,
            secret_access_key=store.secret_access_key,
        )
    finally:
        for daemon in started:
            stop_process(daemon)


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """The session's shared moto server (see ``start_moto``)."""
    with start_moto(tmp_path_factory.mktemp("moto") / "moto.log") as moto:
        yield moto


def write_catalog_config(
    workdir: Path, moto: MotoServer, port: int, warehouse: dict[str, Any] | None = None, **server: Any
) -> Path:
    """A catalog.toml (0600) for one warehouse ``wh`` on moto, logging at debug level; ``warehouse`` and
    ``server`` replace or add keys of ``[[warehouses]]`` and ``[server]``."""
    # The cheapest secret hash the catalog allows: every test issues tokens, each one a scrypt of the secret.
    cheap_hash = {"secret_hash_scrypt_n": MIN_SECRET_HASH_SCRYPT_N}
    server_keys = {**stack_catalog.server_settings(workdir, port, log_level="debug"), **cheap_hash, **server}
    location = f"s3://{moto.bucket}/{CATALOG_WAREHOUSE}"
    warehouse_keys = stack_catalog.warehouse_settings(
        moto.store(), name=CATALOG_WAREHOUSE, location=location, region=moto.region, credential_lifetime=900
    )
    warehouse_keys.update(warehouse or {})
    return stack_catalog.write_catalog_config(workdir / "catalog.toml", server_keys, warehouse_keys)


def start_catalog_process(config_path: Path, workdir: Path, port: int) -> Daemon:
    """``sqe-catalog serve`` (output in ``catalog_log_path(workdir)``); returns once it answers HTTP."""
    process = stack_catalog.spawn_catalog(workdir, config_path, {})
    try:
        stack_catalog.wait_for_catalog(workdir, port, process)
    except StackError:
        stop_process(process)
        log = catalog_log_path(workdir).read_text(errors="replace")
        raise RuntimeError(f"sqe-catalog did not start; log:\n{log[-3000:]}") from None
    return process


def catalog_record(
    workdir: Path, moto: MotoServer, port: int, config_path: Path, location: str | None = None
) -> CatalogServer:
    """The record of a catalog about to be started from ``config_path``, with its admin principal created."""
    server = CatalogServer(
        url=f"http://127.0.0.1:{port}",
        port=port,
        pid=0,
        warehouse=CATALOG_WAREHOUSE,
        warehouse_location=location or f"s3://{moto.bucket}/{CATALOG_WAREHOUSE}",
        workdir=workdir,
        config_path=config_path,
        log_path=catalog_log_path(workdir),
        moto=moto,
        admin=CatalogPrincipal("", "", ""),
    )
    server.secrets.add(moto.secret_access_key)
    server.admin = server.create_principal("admin", admin=True)
    return server


@pytest.fixture(scope="session")
def catalog_server(tmp_path_factory: pytest.TempPathFactory, moto_server: MotoServer) -> Iterator[CatalogServer]:
    """``sqe-catalog serve`` on a free port (debug log in ``log_path``), warehouse ``wh``, an admin."""
    workdir = tmp_path_factory.mktemp("catalog")
    port = free_loopback_port()
    # Tag-based policies on (tests/conformance/policies): without policies or tags nothing changes for others.
    config_path = write_catalog_config(workdir, moto_server, port, read_restriction_policies=True)
    server = catalog_record(workdir, moto_server, port, config_path)
    process = start_catalog_process(config_path, workdir, port)
    server.pid = process.pid
    try:
        yield server
    finally:
        stop_process(process)


# ---------------------------------------------------------------------------------------------------------
# SQE engine helpers (test_engine_*.py): catalog variants with other [[warehouses]] settings, SQE config files.


def write_catalog_config_variant(
    workdir: Path, moto: MotoServer, port: int, warehouse: dict[str, Any], **server: Any
) -> Path:
    """``write_catalog_config`` with some ``[[warehouses]]`` keys replaced or added (e.g. vend_credentials)."""
    return write_catalog_config(workdir, moto, port, warehouse, **server)


@contextlib.contextmanager
def catalog_variant(workdir: Path, moto: MotoServer, **warehouse: Any) -> Iterator[CatalogServer]:
    """Another ``sqe-catalog serve`` on ``moto`` with its own database, an admin principal and warehouse ``wh``
    whose ``[[warehouses]]`` settings are overridden by ``warehouse``; stopped on exit."""
    with restartable_catalog(workdir, moto, warehouse) as (server, _restart):
        yield server


RestartCatalog = Callable[..., None]


@contextlib.contextmanager
def restartable_catalog(
    workdir: Path, moto: MotoServer, warehouse: dict[str, Any], **settings: Any
) -> Iterator[tuple[CatalogServer, RestartCatalog]]:
    """Another ``sqe-catalog serve`` on ``moto`` (``[[warehouses]]`` keys from ``warehouse``, server keys from
    ``settings``), and ``restart(new_signing_key=False)`` that starts it again on the same port and database
    (with a new token signing key when asked); stopped on exit."""
    port = free_loopback_port()
    config_path = write_catalog_config_variant(workdir, moto, port, warehouse, **settings)
    location = str(warehouse.get("location", f"s3://{moto.bucket}/{CATALOG_WAREHOUSE}"))
    server = catalog_record(workdir, moto, port, config_path, location)
    processes = [start_catalog_process(config_path, workdir, port)]
    server.pid = processes[-1].pid

    def restart(new_signing_key: bool = False) -> None:
        stop_process(processes[-1])
        if new_signing_key:  # a fresh config: the same port and warehouse, another token signing key
            write_catalog_config_variant(workdir, moto, port, warehouse, **settings)
        processes.append(start_catalog_process(config_path, workdir, port))
        server.pid = processes[-1].pid

    try:
        yield server, restart
    finally:
        stop_process(processes[-1])


def write_sqe_config(
    path: Path,
    catalog_uri: str,
    principal: CatalogPrincipal,
    moto: MotoServer,
    *,
    catalog: dict[str, Any] | None = None,
    storage: dict[str, Any] | None = None,
) -> Path:
    """An SQE ``config.toml`` for ``principal`` (like ``sqe stack``'s, vended credentials required by default);
    ``catalog``/``storage`` add or replace keys of those sections. Written 0600: it holds a client secret."""
    catalog_keys: dict[str, Any] = {
        "uri": catalog_uri,
        "warehouse": CATALOG_WAREHOUSE,
        "client_id": principal.client_id,
        "client_secret": principal.client_secret,
        "scope": "PRINCIPAL_ROLE:ALL",
        "access_delegation": "vended-credentials",
        "require_vended_credentials": True,
        **(catalog or {}),
    }
    storage_keys: dict[str, Any] = {"endpoint": moto.url, "region": moto.region, "path_style": True, **(storage or {})}
    lines = ["[catalog]", *(f"{k} = {json.dumps(v)}" for k, v in catalog_keys.items())]
    lines += ["", "[storage]", *(f"{k} = {json.dumps(v)}" for k, v in storage_keys.items())]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


def pyiceberg_catalog(server: CatalogServer, principal: CatalogPrincipal) -> Any:
    """pyiceberg's own ``RestCatalog`` as ``principal``, asking for vended credentials (no S3 key of its own)."""
    from pyiceberg.catalog.rest import RestCatalog

    return RestCatalog(
        f"test-{principal.name}",
        uri=server.url,
        warehouse=server.warehouse,
        credential=principal.credential,
        scope="PRINCIPAL_ROLE:ALL",
        **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
    )


def raw_load_table(server: CatalogServer, principal: CatalogPrincipal, namespace: str, table: str) -> dict[str, Any]:
    """A raw LoadTableResult as ``principal`` with vended credentials; its vended secrets join ``server.secrets``."""
    request = urllib.request.Request(
        f"{server.url}/v1/{server.warehouse}/namespaces/{namespace}/tables/{table}",
        headers={
            "Authorization": f"Bearer {server.token(principal)}",
            "X-Iceberg-Access-Delegation": "vended-credentials",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body: dict[str, Any] = json.loads(response.read())
    for credential in body.get("storage-credentials", []):
        for key in ("s3.secret-access-key", "s3.session-token"):
            if credential["config"].get(key):
                server.secrets.add(credential["config"][key])
    return body


# Keys moto rejects (IAM auth is on): with these in the environment, any read that works used other credentials.
BOGUS_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7BOGUS00",
    "AWS_SECRET_ACCESS_KEY": "bogus-secret-access-key-from-the-environment",
    "AWS_SESSION_TOKEN": "bogus-session-token-from-the-environment",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture()
def bogus_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bogus ambient AWS credentials in this process's environment for the duration of one test."""
    for name, value in BOGUS_AWS_ENV.items():
        monkeypatch.setenv(name, value)


# ---------------------------------------------------------------------------------------------------------
# sqe-worker processes (test_worker.py and the distributed tests): `worker_process_factory.start(...)` spawns
# `sqe-worker` on a free loopback port (port 0, read back from --port-file) with its own random token file and its
# log in `log_path`; every worker started is stopped at the end of the session (or earlier with `stop()`).


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    token: str = field(repr=False)
    log_path: Path
    workdir: Path
    _channels: list[Any] = field(default_factory=list, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metadata(self, token: str | None = None) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying this worker's token (or ``token``)."""
        return (("authorization", f"Bearer {self.token if token is None else token}"),)

    def stub(
        self,
        *,
        root_certificates: bytes | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        channel_options: list[tuple[str, Any]] | None = None,
    ) -> Any:
        """A ``WorkerStub`` on a new channel (TLS when ``root_certificates`` is given); closed by ``stop()``."""
        import grpc

        from sqe.distributed.protocol._proto import worker_pb2_grpc

        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            *(channel_options or []),
        ]
        if root_certificates is None:
            channel = grpc.insecure_channel(self.address, options=options)
        else:
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            channel = grpc.secure_channel(f"localhost:{self.port}", credentials, options=options)
        self._channels.append(channel)
        return worker_pb2_grpc.WorkerStub(channel)

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        return stop_child(self.proc)


class WorkerFactory:
    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self.started: list[WorkerProcess] = []

    def start(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 30.0, token: str | None = None
    ) -> WorkerProcess:
        """``sqe-worker --listen 127.0.0.1:0 --token-file ... ARGS``; ``env`` is added to an AWS_*-free copy of
        this process's environment. ``token``: share one coordinator token across workers (default: a new one)."""
        workdir = self._tmp.mktemp("worker")
        token = token or secrets.token_urlsafe(32)
        token_file = workdir / "token"
        token_file.write_text(token + "\n", encoding="utf-8")
        token_file.chmod(0o600)
        port_file, log_path = workdir / "port", workdir / "worker.log"
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        child_env.update(env or {})
        command = [sys.executable, "-m", "workers.cli", "--listen", "127.0.0.1:0", "--token-file", str(token_file)]
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                [*command, "--port-file", str(port_file), *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=child_env,
            )
        worker = WorkerProcess(proc, 0, token, log_path, workdir)
        self.started.append(worker)
        worker.port = self._wait_for_port(worker, port_file, timeout)
        return worker

    @staticmethod
    def _wait_for_port(worker: WorkerProcess, port_file: Path, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if worker.proc.poll() is not None:
                code = worker.proc.returncode
                raise RuntimeError(f"sqe-worker exited with code {code}:\n{worker.log_text()[-3000:]}")
            if port_file.is_file():
                return int(port_file.read_text().strip())
            time.sleep(0.05)
        worker.stop()
        raise RuntimeError(f"sqe-worker did not start within {timeout} s:\n{worker.log_text()[-3000:]}")

    def stop_all(self) -> None:
        for worker in self.started:
            worker.stop()


@pytest.fixture(scope="session")
def worker_process_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerFactory]:
    """Starts ``sqe-worker`` processes on loopback (see WorkerFactory.start); all stopped at session end."""
    factory = WorkerFactory(tmp_path_factory)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="session")
def catalog_reader(catalog_server: CatalogServer) -> CatalogPrincipal:
    """A reader principal (``create-principal --reader``, no grants) that may act for restricted end users."""
    return catalog_server.create_principal("test-reader", reader=True)


ENGINE_WRITER_GRANTS: list[tuple[str, str | None, str | None]] = [
    ("NAMESPACE_FULL_METADATA", None, None),
    ("TABLE_CREATE", None, None),
    ("TABLE_WRITE_DATA", None, None),
]


@pytest.fixture(scope="module")
def own_catalog(tmp_path_factory: pytest.TempPathFactory, moto_server: MotoServer) -> Iterator[CatalogServer]:
    """A catalog process of one test module's own (own database, own warehouse location on the shared moto).

    For features that look at EVERY table a user can see and fail closed on one they cannot load (file table
    functions, external tables): other modules leave tampered or policy-conflicted tables in the shared catalog.
    """
    workdir = tmp_path_factory.mktemp("own-catalog")
    location = f"s3://{moto_server.bucket}/own_{secrets.token_hex(4)}"
    with catalog_variant(workdir, moto_server, location=location) as server:
        yield server


@pytest.fixture(scope="module")
def own_writer(own_catalog: CatalogServer) -> CatalogPrincipal:
    """``engine_writer``'s grants on ``own_catalog``."""
    return own_catalog.principal_with_grants("engine_writer", ENGINE_WRITER_GRANTS)


@pytest.fixture(scope="session")
def engine_writer(catalog_server: CatalogServer) -> CatalogPrincipal:
    """One principal that creates namespaces and tables and writes data (shared: admin calls are slow)."""
    return catalog_server.principal_with_grants("engine_writer", ENGINE_WRITER_GRANTS)
