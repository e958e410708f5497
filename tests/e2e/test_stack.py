"""``sqe stack up|status|down`` with the moto store: real processes on loopback, driven through the CLI.

One stack serves the module; the ``down`` test runs last and the fixture's finaliser stops the stack anyway.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqe_stack import StackInfo, load_stack, stop_stack
from sqe_stack.cli import main
from sqe_stack.provision import pid_alive

pytestmark = pytest.mark.e2e

PRINCIPALS = ("admin", "analyst", "writer", "sqe-engine")
PROCESSES = {"moto", "catalog", "worker-1", "server"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackInfo]:
    dir = tmp_path_factory.mktemp("moto-stack")
    assert main(["up", "--dir", str(dir), "--credential-lifetime", "900", "--workers", "1"]) == 0
    try:
        yield load_stack(dir)
    finally:
        stop_stack(dir)


@pytest.fixture
def decoy() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process that ``down`` must never touch."""
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _secrets(info: StackInfo) -> list[str]:
    with open(info.catalog_config, "rb") as fh:
        catalog = tomllib.load(fh)
    values = [catalog["server"]["token_signing_key"], catalog["warehouses"][0]["secret_access_key"]]
    values += [info.principal_credentials(name).client_secret for name in PRINCIPALS]
    assert all(len(v) >= 16 for v in values)
    return values


def _get_status(url: str, data: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_up_records_processes_and_endpoints(stack: StackInfo) -> None:
    doc = json.loads((stack.dir / "stack.json").read_text())
    assert doc["store"] == "moto" and doc["state"] == "running"
    assert set(doc["pids"]) == PROCESSES
    assert all(pid_alive(pid) for pid in doc["pids"].values())
    assert doc["s3_endpoint"].startswith("http://127.0.0.1:") and doc["sts_endpoint"] == doc["s3_endpoint"]
    assert doc["catalog_uri"].startswith("http://127.0.0.1:")
    assert (doc["warehouse"], doc["bucket"]) == ("demo", "warehouse")
    assert set(doc["principals"]) == set(PRINCIPALS)
    assert doc["principals"]["analyst"]["config"] == str(stack.dir / "analyst.toml")
    assert doc["started_at"]
    assert doc["server_url"].startswith("grpc://127.0.0.1:") and len(doc["workers"]) == 1
    assert doc["principals"]["sqe-engine"]["config"] == str(stack.dir / "sqe-engine.toml")


def test_stack_json_holds_no_secret(stack: StackInfo) -> None:
    text = (stack.dir / "stack.json").read_text()
    for secret in _secrets(stack):
        assert secret not in text
    assert "client_secret" not in text and "secret_access_key" not in text


def test_secret_files_are_private(stack: StackInfo) -> None:
    service_files = ("server.toml", "server-engine.toml", "worker.token")
    for name in ("catalog.toml", "catalog.db", *service_files, *(f"{p}.toml" for p in PRINCIPALS)):
        assert stat.S_IMODE(os.stat(stack.dir / name).st_mode) == 0o600, name


def test_principal_configs_point_at_the_stack(stack: StackInfo) -> None:
    with open(stack.principal_config("writer"), "rb") as fh:
        config = tomllib.load(fh)
    assert config["catalog"]["uri"] == stack.catalog_uri
    assert config["catalog"]["warehouse"] == "demo"
    assert config["catalog"]["client_id"] == stack.principals["writer"].client_id
    assert config["catalog"]["scope"] == "PRINCIPAL_ROLE:ALL"
    assert config["catalog"]["access_delegation"] == "vended-credentials"
    assert config["catalog"]["require_vended_credentials"] is True
    assert config["storage"] == {"endpoint": stack.s3_endpoint, "region": "us-east-1", "path_style": True}


def test_credentials_reprs_hide_secrets(stack: StackInfo) -> None:
    creds = stack.principal_credentials("analyst")
    assert creds.client_secret not in repr(creds)
    assert creds.client_secret not in repr(stack)


def test_stack_answers_with_demo_principals(stack: StackInfo) -> None:
    assert _get_status(f"{stack.catalog_uri}/v1/config") == 401
    creds = stack.principal_credentials("analyst")
    form = urllib.parse.urlencode(
        {
            "grant_type": "client_credentials",
            "client_id": creds.client_id,
            "client_secret": creds.client_secret,
            "scope": "PRINCIPAL_ROLE:ALL",
        }
    ).encode()
    assert _get_status(f"{stack.catalog_uri}/v1/oauth/tokens", form) == 200
    bad = form.replace(creds.client_secret.encode(), b"wrong")
    assert _get_status(f"{stack.catalog_uri}/v1/oauth/tokens", bad) == 401


def test_bucket_exists_for_the_catalog_key(stack: StackInfo) -> None:
    from sqe_stack import admin_s3_client

    buckets = [b["Name"] for b in admin_s3_client(stack).list_buckets()["Buckets"]]
    assert buckets == ["warehouse"]


def test_status_reports_alive(stack: StackInfo, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--dir", str(stack.dir)]) == 0
    out = capsys.readouterr().out
    for name, pid in stack.pids.items():
        assert f"{name}" in out and f"pid {pid}" in out
    assert out.count("alive") == len(PROCESSES) and "not running" not in out
    assert stack.server_url in out
    assert stack.s3_endpoint in out and stack.catalog_uri in out


def test_the_server_serves_the_restricted_analyst_whom_the_catalog_refuses_directly(
    stack: StackInfo, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make demo``'s steps: pyiceberg and SQE write and read as two users, EXPLAIN shows the credential source
    (one ``table property value`` line each); then the stack's sqe serve (reader sqe-engine, one worker) gives the
    analyst filtered, masked rows; the analyst's own pyiceberg load is refused; the analyst's own config keeps
    working for an unrestricted table."""
    from pyiceberg.exceptions import ForbiddenError

    import sqe.api
    from sqe.config import load_config
    from sqe.server.client import RemoteSession
    from sqe_catalog.admin import open_auth_store
    from sqe_stack import service
    from sqe_stack.catalog import load_catalog_config
    from sqe_stack.demo import _client_props, pyiceberg_round_trip, restrict_analyst, sqe_queries

    with open_auth_store(load_catalog_config(stack.catalog_config)) as store:
        assert service.READER in [p.name for p in store.list_principals() if p.is_reader]
    pyiceberg_round_trip(stack.principal_config("writer"), stack.principal_config("analyst"))
    sqe_queries(stack.principal_config("writer"), stack.principal_config("analyst"))
    shown = capsys.readouterr().out.splitlines()
    assert [line.split() for line in shown if "credential_source" in line] == [
        ["demo.sales.orders", "credential_source", "vended"]
    ]
    assert not any("duckdb plan" in line for line in shown)  # the demo shows the tables' sections only
    restrict_analyst(stack.catalog_config)
    analyst = load_config(stack.principal_config("analyst"))
    remote = RemoteSession(stack.server_url, analyst)
    try:
        rows = remote.sql("SELECT id, customer, amount FROM demo.sales.orders ORDER BY id").arrow().to_pylist()
    finally:
        remote.close()
    assert rows == [{"id": 1, "customer": "ada", "amount": None}, {"id": 4, "customer": "margaret", "amount": None}]
    worker_log = (stack.dir / "logs" / "worker-1.log").read_text(errors="replace")
    assert "fragment" in worker_log.lower(), "the server's scan did not run on its worker"
    from pyiceberg.catalog.rest import RestCatalog

    props = {
        **_client_props(stack.principal_config("analyst")),
        "header.X-Gravitino-Client-Capabilities": "read-restrictions.v1",
    }
    with pytest.raises(ForbiddenError, match="only serves this table through a trusted reader"):
        RestCatalog("bypass", **props).load_table("sales.orders")
    writer = RestCatalog("w", **_client_props(stack.principal_config("writer")))
    import pyarrow as pa

    writer.create_table_if_not_exists("sales.open_data", schema=pa.schema([("x", pa.int64())])).append(
        pa.table({"x": pa.array([7], pa.int64())})
    )
    with sqe.api.connect(stack.principal_config("analyst")) as own:  # embedded, own token, unrestricted table
        assert own.sql("SELECT x FROM demo.sales.open_data").fetchall() == [(7,)]
    logs = "".join(p.read_text(errors="replace") for p in (stack.dir / "logs").glob("*.log"))
    for secret in _secrets(stack):
        assert secret not in logs


def test_second_up_on_a_running_dir_is_refused(stack: StackInfo, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--dir", str(stack.dir)]) == 1
    err = capsys.readouterr().err
    assert "already running" in err and len(err.strip().splitlines()) == 1
    assert load_stack(stack.dir).pids == stack.pids
    assert all(pid_alive(pid) for pid in stack.pids.values())


def test_down_stops_exactly_the_recorded_pids(
    stack: StackInfo, decoy: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["down", "--dir", str(stack.dir)]) == 0
    assert not any(pid_alive(pid) for pid in stack.pids.values())
    assert pid_alive(decoy.pid)
    assert load_stack(stack.dir).state == "stopped"
    assert main(["status", "--dir", str(stack.dir)]) == 1
    assert "not running" in capsys.readouterr().out
    assert main(["down", "--dir", str(stack.dir)]) == 0  # idempotent


def test_down_leaves_a_reused_pid_alone(tmp_path: Path, decoy: subprocess.Popen[bytes]) -> None:
    """A PID recorded for moto that now belongs to another program must survive ``down``."""
    doc = {
        "store": "moto",
        "state": "running",
        "s3_endpoint": "",
        "sts_endpoint": "",
        "catalog_uri": "",
        "catalog_config": str(tmp_path / "catalog.toml"),
        "warehouse": "demo",
        "bucket": "warehouse",
        "region": "us-east-1",
        "pids": {"moto": decoy.pid},
        "process_markers": {"moto": ["moto.server", "-p", "1"]},
        "principals": {},
        "started_at": "x",
    }
    (tmp_path / "stack.json").write_text(json.dumps(doc))
    assert stop_stack(tmp_path) == {"moto": "not-ours"}
    assert pid_alive(decoy.pid)


def test_ceph_without_binaries_names_the_debian_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    monkeypatch.setenv("PATH", str(empty_path))
    assert main(["up", "--dir", str(tmp_path / "s"), "--store", "ceph"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "ceph-mon ceph-osd radosgw ceph-common" in err
    assert load_stack(tmp_path / "s").pids == {}


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    assert main(["up", "--dir", str(tmp_path), "--store", "minio"]) == 2
    assert main(["up", "--dir", str(tmp_path), "--credential-lifetime", "0"]) == 2
    assert main(["status", "--dir", str(tmp_path)]) == 1  # no stack.json there
