"""``sqe stack up --store external``: the stack against a store it did not start.

A moto server is started separately (the "external" store, IAM auth on, so only the catalog key made here and
the credentials vended from it work); ``sqe stack up --store external`` must start only the catalog against it,
create the bucket when missing, let SQE write and read through vended credentials, and ``down`` must leave moto
running with its data.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

import sqe.api
from sqe_stack import load_stack, stop_stack
from sqe_stack.catalog import BUCKET
from sqe_stack.cli import main
from sqe_stack.moto import REGION, ROLE_ARN, create_catalog_identity, enable_iam_auth, launch_moto
from sqe_stack.provision import Daemon, pid_alive, stop_daemon, write_private

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@dataclass(frozen=True)
class ExternalMoto:
    endpoint: str
    access_key_id: str
    secret_access_key: str
    daemon: Daemon

    def s3(self) -> object:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )


@pytest.fixture(scope="module")
def external_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExternalMoto]:
    started: list[Daemon] = []
    try:
        daemon, endpoint = launch_moto(tmp_path_factory.mktemp("ext-moto") / "moto.log", started)
        access_key, secret_key = create_catalog_identity(endpoint)
        enable_iam_auth(endpoint)
        yield ExternalMoto(endpoint, access_key, secret_key, daemon)
    finally:
        for daemon in started:
            stop_daemon(daemon)


def _create_namespace(config: Path, namespace: str) -> None:
    """Namespaces are made with pyiceberg's RestCatalog (SQE's SQL has no CREATE SCHEMA), as the writer."""
    from pyiceberg.catalog.rest import RestCatalog

    with config.open("rb") as fh:
        catalog = tomllib.load(fh)["catalog"]
    RestCatalog(
        "demo",
        uri=catalog["uri"],
        warehouse=catalog["warehouse"],
        credential=f"{catalog['client_id']}:{catalog['client_secret']}",
        scope=catalog["scope"],
    ).create_namespace(namespace)


def _up_args(dir: Path, moto: ExternalMoto, *extra: str) -> list[str]:
    return ["up", "--dir", str(dir), "--store", "external", "--s3-endpoint", moto.endpoint, *extra]


@pytest.fixture(scope="module")
def stack_dir(tmp_path_factory: pytest.TempPathFactory, external_moto: ExternalMoto) -> Iterator[Path]:
    dir = tmp_path_factory.mktemp("ext-stack")
    key_file = dir / "catalog.env"
    write_private(
        key_file,
        f"# the catalog's key\nAWS_ACCESS_KEY_ID={external_moto.access_key_id}\n"
        f'AWS_SECRET_ACCESS_KEY="{external_moto.secret_access_key}"\n',
    )
    assert main(_up_args(dir, external_moto, "--role-arn", ROLE_ARN, "--key-file", str(key_file))) == 0
    try:
        yield dir
    finally:
        stop_stack(dir)


def test_up_starts_no_store_and_records_the_external_endpoints(stack_dir: Path, external_moto: ExternalMoto) -> None:
    info = load_stack(stack_dir)
    assert (info.store, info.state) == ("external", "running")
    assert set(info.pids) == {"catalog", "server"}  # catalog and SQE server only: the store is not ours to stop
    assert info.s3_endpoint == info.sts_endpoint == external_moto.endpoint
    doc = (stack_dir / "stack.json").read_text()
    assert external_moto.secret_access_key not in doc
    assert info.catalog_s3_key() == (external_moto.access_key_id, external_moto.secret_access_key)
    assert BUCKET in [b["Name"] for b in external_moto.s3().list_buckets()["Buckets"]]  # type: ignore[attr-defined]


def test_sqe_writes_and_reads_through_vended_credentials(stack_dir: Path, external_moto: ExternalMoto) -> None:
    info = load_stack(stack_dir)
    _create_namespace(info.principal_config("writer"), "ext")
    with sqe.api.connect(info.principal_config("writer")) as writer:
        writer.sql("CREATE TABLE demo.ext.orders AS SELECT 1 AS id, 'ada' AS customer")
        writer.sql("INSERT INTO demo.ext.orders VALUES (2, 'grace')")
    with sqe.api.connect(info.principal_config("analyst")) as analyst:
        rows = analyst.sql("SELECT id, customer FROM demo.ext.orders ORDER BY id").arrow().to_pylist()
        explain = json.dumps(analyst.sql("EXPLAIN SELECT * FROM demo.ext.orders").arrow().to_pylist())
    assert rows == [{"id": 1, "customer": "ada"}, {"id": 2, "customer": "grace"}]
    assert "vended" in explain and external_moto.secret_access_key not in explain


def test_errors_are_one_line_and_name_what_is_missing(
    tmp_path: Path, external_moto: ExternalMoto, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", external_moto.secret_access_key)
    assert main(_up_args(tmp_path / "a", external_moto, "--role-arn", ROLE_ARN)) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "sqe stack up: --store external needs the catalog's key: AWS_ACCESS_KEY_ID not set in the environment"
    )
    assert main(_up_args(tmp_path / "b", external_moto)) == 1
    assert "needs --role-arn ARN" in capsys.readouterr().err
    assert main(["up", "--dir", str(tmp_path / "c"), "--s3-endpoint", external_moto.endpoint]) == 1
    assert "need --store external" in capsys.readouterr().err
    assert not (tmp_path / "a" / "stack.json").exists()


def test_down_leaves_the_external_store_and_its_data(
    stack_dir: Path, external_moto: ExternalMoto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = load_stack(stack_dir)
    catalog_pid = info.pids["catalog"]
    assert main(["down", "--dir", str(stack_dir)]) == 0
    assert not pid_alive(catalog_pid)
    assert pid_alive(external_moto.daemon.pid)
    objects = external_moto.s3().list_objects_v2(Bucket=BUCKET, Prefix="demo/ext/orders/")  # type: ignore[attr-defined]
    assert objects["KeyCount"] > 0

    # A second `up` (key from the environment this time) finds the bucket there and keeps it.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", external_moto.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", external_moto.secret_access_key)
    again = tmp_path / "again"
    assert main(_up_args(again, external_moto, "--role-arn", ROLE_ARN)) == 0
    try:
        _create_namespace(load_stack(again).principal_config("writer"), "ext2")
        with sqe.api.connect(load_stack(again).principal_config("writer")) as writer:
            writer.sql("CREATE TABLE demo.ext2.t AS SELECT 7 AS x")
            assert writer.sql("SELECT x FROM demo.ext2.t").arrow().to_pylist() == [{"x": 7}]
    finally:
        assert main(["down", "--dir", str(again)]) == 0
    assert pid_alive(external_moto.daemon.pid)
    assert external_moto.secret_access_key not in (again / "stack.json").read_text()
