"""OPTIMIZE against a buggy or hostile worker: what its ``RewriteResponse`` says was written is checked before the
coordinator commits a ``replace`` that deletes the bin's inputs. A response that drops a written file, names one
twice, or states record counts or sizes other than the stored file's (or than the bin can have) fails the
compaction (``WorkerError``) with nothing committed and no output left behind, never a snapshot that loses or
duplicates rows. The statistics committed are read from the stored file; a worker stating others (a false upper
bound would have every later ``WHERE id > 0`` prune the compacted file and miss its rows) fails it alike."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from sqe.catalog.rest import RestTableProvider
from sqe.config import load_config
from sqe.distributed.coordinator import DistributedOptions
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.errors import WorkerError
from sqe.session import Session
from tests.conftest import CatalogPrincipal, CatalogServer, write_sqe_config
from tests.e2e.test_compaction import fingerprint, small_files_table
from tests.helpers.orphans import data_objects
from tests.unit.sqe.iceberg_local import add_positional_deletes
from workers.auth import BearerTokenInterceptor
from workers.server import _add_service
from workers.service import WorkerService

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

TOKEN = "a-rewrite-test-token-0123456789"
TARGET = "64 * 1024 * 1024"


class _MisreportingWorker:
    """A real ``WorkerService`` whose ``Rewrite`` answer is altered after it really wrote the bin (``mode``)."""

    def __init__(self, mode: str) -> None:
        self._service = WorkerService()
        self._mode = mode

    def Rewrite(self, request: pb.RewriteTicket, context: Any) -> pb.RewriteResponse:
        response = self._service.Rewrite(request, context)
        if self._mode == "drops-its-files":  # wrote them, reports none (and no rows)
            return pb.RewriteResponse(files=[], rows=0, files_read=response.files_read)
        if self._mode == "names-a-file-twice":
            again = pb.WrittenFile()
            again.CopyFrom(response.files[0])
            response.files.append(again)
            response.rows += again.record_count
        if self._mode == "overstates-its-rows":  # more rows than the bin's files hold
            response.files[0].record_count += 1000
            response.rows += 1000
        if self._mode == "understates-its-rows":  # fewer rows than the bin's files hold, nothing deleted
            response.files[0].record_count -= 1
            response.rows -= 1
        if self._mode == "states-false-bounds":  # every id at most 0: a later WHERE id > 0 would skip the file
            for written in response.files:
                stats = json.loads(written.stats_json)
                stats["upper_bounds"]["1"] = base64.b64encode((0).to_bytes(8, "little", signed=True)).decode()
                written.stats_json = json.dumps(stats).encode()
        return response

    def __getattr__(self, name: str) -> Any:  # Execute, Cancel, Health, Stats, RefreshCredentials: as they are
        return getattr(self._service, name)


@contextlib.contextmanager
def _session(mode: str, server: CatalogServer, writer: CatalogPrincipal, tmp_path: Path) -> Iterator[Session]:
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=[BearerTokenInterceptor(TOKEN)])
    _add_service(_MisreportingWorker(mode), grpc_server)  # type: ignore[arg-type]  # Execute's frames too
    address = f"127.0.0.1:{grpc_server.add_insecure_port('127.0.0.1:0')}"
    grpc_server.start()
    path = write_sqe_config(tmp_path / "sqe.toml", server.url, writer, server.moto)
    overrides = {"coordinator": {"workers": [address], "token": TOKEN, "distributed_credentials": "vended"}}
    config = load_config(path, env={}, overrides=overrides)
    try:
        with Session(RestTableProvider(config), config, distributed=DistributedOptions(max_attempts=1)) as session:
            yield session
    finally:
        grpc_server.stop(grace=None)


@pytest.mark.parametrize(
    "mode",
    ["drops-its-files", "names-a-file-twice", "overstates-its-rows", "understates-its-rows", "states-false-bounds"],
)
def test_a_worker_misreporting_its_rewrite_never_gets_a_replace_committed(
    mode: str, catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    name, table = small_files_table(catalog_server, engine_writer, 4)
    snapshot = table.current_snapshot().snapshot_id
    with _session(mode, catalog_server, engine_writer, tmp_path) as s:
        before = fingerprint(s, name)
        with pytest.raises(WorkerError, match="OPTIMIZE"):
            s.sql(f"OPTIMIZE {name} WITH (target_file_size = {TARGET})")
        assert fingerprint(s, name) == before
    table.refresh()
    assert table.current_snapshot().snapshot_id == snapshot  # nothing committed
    assert not any("/compact-" in p for p in data_objects(catalog_server, table))  # and nothing left behind


def test_an_honest_workers_rewrite_with_position_deletes_passes_the_checks(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    """The row checks allow what a bin's position deletes remove (the bin gives fewer rows than its files hold)."""
    name, table = small_files_table(catalog_server, engine_writer, 6)
    add_positional_deletes(table, (0,))  # a merge-on-read DELETE of one row of an input, by another engine
    with _session("honest", catalog_server, engine_writer, tmp_path) as s:
        before = fingerprint(s, name)
        result = s.sql(f"OPTIMIZE {name} WITH (target_file_size = {TARGET})").arrow().to_pylist()[0]
        assert result["rewritten_files"] == 6 and result["added_files"] >= 1
        assert fingerprint(s, name) == before
