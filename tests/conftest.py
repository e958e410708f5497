"""Session-scoped servers shared by every test tier (one moto, one catalog, one Ceph cluster, workers per session)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sqe.stack import StackInfo, client_env, start_stack, stop_stack

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
# per session, both real subprocesses on free loopback ports. Principals are created with `sqe-catalog admin`.


MOTO_ACCOUNT = "123456789012"
CATALOG_WAREHOUSE = "wh"
CATALOG_BUCKET = "warehouse"


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


@dataclass(frozen=True)
class CatalogPrincipal:
    name: str
    client_id: str
    client_secret: str = field(repr=False)

    @property
    def credential(self) -> str:
        """``client_id:client_secret``, the form pyiceberg's ``credential`` property takes."""
        return f"{self.client_id}:{self.client_secret}"


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

    def create_principal(self, name: str, *, admin: bool = False) -> CatalogPrincipal:
        out = json.loads(self.admin_cli("create-principal", name, *(["--admin"] if admin else [])))
        principal = CatalogPrincipal(out["name"], out["client_id"], out["client_secret"])
        self.secrets.add(principal.client_secret)
        return principal

    def principal_with_grants(self, name: str, grants: list[tuple[str, str | None, str | None]]) -> CatalogPrincipal:
        """A principal holding role ``<name>_role`` with ``(privilege, dotted namespace, table)`` grants."""
        principal = self.create_principal(name)
        role = f"{name}_role"
        self.admin_cli("create-role", role)
        self.admin_cli("assign-role", name, role)
        for privilege, namespace, table in grants:
            scope = ["--warehouse", self.warehouse]
            scope += ["--namespace", namespace] if namespace else []
            scope += ["--table", table] if table else []
            self.admin_cli("grant", role, privilege, *scope)
        return principal

    def token(self, principal: CatalogPrincipal) -> str:
        form = urllib.parse.urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": principal.client_id,
                "client_secret": principal.client_secret,
                "scope": "PRINCIPAL_ROLE:ALL",
            }
        ).encode()
        request = urllib.request.Request(f"{self.url}/v1/oauth/tokens", data=form, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            token = str(json.loads(response.read())["access_token"])
        self.secrets.add(token)
        return token

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def spawn_another(self, workdir: Path, **server: Any) -> tuple[subprocess.Popen[bytes], Path]:
        """A second catalog process on the same moto with its own database; returns (process, log path)."""
        port = free_loopback_port()
        config_path = write_catalog_config(workdir, self.moto, port, **server)
        log_path = workdir / "catalog.log"
        return start_catalog_process(config_path, log_path, port), log_path

    @staticmethod
    def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
        """Send ``sig``, wait up to 15 s (then SIGKILL); returns the exit code."""
        return _stop_process(proc, sig)


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 30.0) -> None:
    """Until ``url`` answers at all (any HTTP status counts); fails early if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer within {timeout} s")


def _stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def _moto_identities(url: str) -> tuple[str, str, str]:
    """Bucket, the catalog's IAM user + key and the role it assumes; then IAM auth goes on."""
    import boto3

    def client(service: str) -> Any:
        return boto3.client(
            service,  # type: ignore[call-overload]
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )

    iam = client("iam")
    allow_all = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.create_user(UserName="catalog")
    iam.put_user_policy(UserName="catalog", PolicyName="all", PolicyDocument=json.dumps(allow_all))
    key = iam.create_access_key(UserName="catalog")["AccessKey"]
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": f"arn:aws:iam::{MOTO_ACCOUNT}:user/catalog"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    role = iam.create_role(RoleName="lakehouse", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    s3_all = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_role_policy(RoleName="lakehouse", PolicyName="s3all", PolicyDocument=json.dumps(s3_all))
    client("s3").create_bucket(Bucket=CATALOG_BUCKET)
    # A raw body (not a form): from here on moto authenticates and authorises every request.
    reset = urllib.request.Request(
        f"{url}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
    )
    with urllib.request.urlopen(reset, timeout=10):
        pass
    return str(role), str(key["AccessKeyId"]), str(key["SecretAccessKey"])


@contextlib.contextmanager
def start_moto(log_path: Path) -> Iterator[MotoServer]:
    """A moto server (S3 + STS + IAM) with bucket ``warehouse``, role ``lakehouse`` and IAM auth on; stopped on exit."""
    port = free_loopback_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for_http(f"{url}/moto-api/", proc, "moto server")
        role_arn, access_key_id, secret_access_key = _moto_identities(url)
        yield MotoServer(url, port, proc.pid, "us-east-1", CATALOG_BUCKET, role_arn, access_key_id, secret_access_key)
    finally:
        _stop_process(proc)


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """The session's shared moto server (see ``start_moto``)."""
    with start_moto(tmp_path_factory.mktemp("moto") / "moto.log") as moto:
        yield moto


def write_catalog_config(workdir: Path, moto: MotoServer, port: int, **server: Any) -> Path:
    """A catalog.toml for one warehouse ``wh`` on moto, logging at debug level."""
    settings: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "database": f"sqlite:///{workdir / 'catalog.db'}",
        "token_signing_key": secrets.token_hex(32),
        "log_level": "debug",
        **server,
    }
    warehouse = {
        "name": CATALOG_WAREHOUSE,
        "location": f"s3://{moto.bucket}/{CATALOG_WAREHOUSE}",
        "endpoint": moto.url,
        "region": moto.region,
        "path_style": True,
        "sts_endpoint": moto.url,
        "role_arn": moto.role_arn,
        "credential_lifetime_seconds": 900,
        "access_key_id": moto.access_key_id,
        "secret_access_key": moto.secret_access_key,
    }
    lines = ["[server]", *(f"{k} = {json.dumps(v)}" for k, v in settings.items())]
    lines += ["", "[[warehouses]]", *(f"{k} = {json.dumps(v)}" for k, v in warehouse.items())]
    path = workdir / "catalog.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def start_catalog_process(config_path: Path, log_path: Path, port: int) -> subprocess.Popen[bytes]:
    """``sqe-catalog serve`` with stdout/stderr in ``log_path``; returns once it answers HTTP."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sqe_catalog.cli", "serve", "--config", str(config_path)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        _wait_for_http(f"http://127.0.0.1:{port}/v1/config", proc, "sqe-catalog")
    except RuntimeError:
        _stop_process(proc)
        raise RuntimeError(f"sqe-catalog did not start; log:\n{log_path.read_text()[-3000:]}") from None
    return proc


@pytest.fixture(scope="session")
def catalog_server(tmp_path_factory: pytest.TempPathFactory, moto_server: MotoServer) -> Iterator[CatalogServer]:
    """``sqe-catalog serve`` on a free port (debug log in ``log_path``), warehouse ``wh``, an admin."""
    workdir = tmp_path_factory.mktemp("catalog")
    port = free_loopback_port()
    config_path = write_catalog_config(workdir, moto_server, port)
    log_path = workdir / "catalog.log"
    placeholder = CatalogPrincipal("", "", "")
    server = CatalogServer(
        url=f"http://127.0.0.1:{port}",
        port=port,
        pid=0,
        warehouse=CATALOG_WAREHOUSE,
        warehouse_location=f"s3://{moto_server.bucket}/{CATALOG_WAREHOUSE}",
        workdir=workdir,
        config_path=config_path,
        log_path=log_path,
        moto=moto_server,
        admin=placeholder,
    )
    server.secrets.add(moto_server.secret_access_key)
    server.admin = server.create_principal("admin", admin=True)
    proc = start_catalog_process(config_path, log_path, port)
    server.pid = proc.pid
    try:
        yield server
    finally:
        _stop_process(proc)


# ---------------------------------------------------------------------------------------------------------
# SQE engine helpers (test_engine_*.py): catalog variants with other [[warehouses]] settings, SQE config files.


def write_catalog_config_variant(
    workdir: Path, moto: MotoServer, port: int, warehouse: dict[str, Any], **server: Any
) -> Path:
    """``write_catalog_config`` with some ``[[warehouses]]`` keys replaced or added (e.g. vend_credentials)."""
    path = write_catalog_config(workdir, moto, port, **server)
    lines = path.read_text(encoding="utf-8").splitlines()
    start = lines.index("[[warehouses]]")
    kept = [line for line in lines[start + 1 :] if line.split(" = ", 1)[0] not in warehouse]
    lines = lines[: start + 1] + kept + [f"{k} = {json.dumps(v)}" for k, v in warehouse.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@contextlib.contextmanager
def catalog_variant(workdir: Path, moto: MotoServer, **warehouse: Any) -> Iterator[CatalogServer]:
    """Another ``sqe-catalog serve`` on ``moto`` with its own database, an admin principal and warehouse ``wh``
    whose ``[[warehouses]]`` settings are overridden by ``warehouse``; stopped on exit."""
    port = free_loopback_port()
    config_path = write_catalog_config_variant(workdir, moto, port, warehouse)
    location = str(warehouse.get("location", f"s3://{moto.bucket}/{CATALOG_WAREHOUSE}"))
    server = CatalogServer(
        url=f"http://127.0.0.1:{port}",
        port=port,
        pid=0,
        warehouse=CATALOG_WAREHOUSE,
        warehouse_location=location,
        workdir=workdir,
        config_path=config_path,
        log_path=workdir / "catalog.log",
        moto=moto,
        admin=CatalogPrincipal("", "", ""),
    )
    server.secrets.add(moto.secret_access_key)
    server.admin = server.create_principal("admin", admin=True)
    proc = start_catalog_process(config_path, server.log_path, port)
    server.pid = proc.pid
    try:
        yield server
    finally:
        _stop_process(proc)


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
        return _stop_process(self.proc)


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


ENGINE_WRITER_GRANTS: list[tuple[str, str | None, str | None]] = [
    ("NAMESPACE_FULL_METADATA", None, None),
    ("TABLE_CREATE", None, None),
    ("TABLE_WRITE_DATA", None, None),
]


@pytest.fixture(scope="session")
def engine_writer(catalog_server: CatalogServer) -> CatalogPrincipal:
    """One principal that creates namespaces and tables and writes data (shared: admin calls are slow)."""
    return catalog_server.principal_with_grants("engine_writer", ENGINE_WRITER_GRANTS)
