"""The Docker quickstarts' bootstrap steps (``python -m sqe_stack.quickstart``), run here against moto in place
of rustack: there is no Docker engine on these machines, but what a bootstrap does to the store is testable."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import boto3
import pytest

from sqe_stack import moto as moto_store
from sqe_stack.catalog import BUCKET
from sqe_stack.provision import Daemon, StackError
from sqe_stack.quickstart import POLARIS, polaris_bootstrap
from tests.conftest import free_loopback_port, stop_process

pytestmark = pytest.mark.e2e


def test_the_polaris_bootstrap_creates_the_bucket_polaris_writes_into(tmp_path: Path) -> None:
    """Polaris creates no bucket, and nothing else in the polaris-rustack scenario did: the writer's first data
    file would have failed with NoSuchBucket. (Polaris is not running here, so the bootstrap stops after it.)"""
    started: list[Daemon] = []
    try:
        store = moto_store.start_moto(tmp_path / "moto.log", started)
        scenario = replace(
            POLARIS,
            s3_endpoint=store.s3_endpoint,
            access_key_id=store.access_key_id,
            secret_access_key=store.secret_access_key,
        )
        no_polaris = f"http://127.0.0.1:{free_loopback_port()}"
        with pytest.raises(StackError, match="Polaris: the root principal could not get a token"):
            polaris_bootstrap(no_polaris, "root", "root-secret", tmp_path / "principals", scenario)
        s3 = boto3.client(
            "s3",
            endpoint_url=store.s3_endpoint,
            region_name=moto_store.REGION,
            aws_access_key_id=store.access_key_id,
            aws_secret_access_key=store.secret_access_key,
        )
        assert BUCKET in [bucket["Name"] for bucket in s3.list_buckets()["Buckets"]]
    finally:
        for daemon in started:
            stop_process(daemon)
