"""An external table's synthesized scan plan: its ticket round-trips, and a worker fragment reading it returns the
same rows as the local stream (hive partition values filled in from the partition record); what stays local."""

from __future__ import annotations

import datetime
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from sqe.catalog.base import TableIdent
from sqe.credentials import CredentialSet
from sqe.distributed.coordinator.credentials import wire_table_id
from sqe.distributed.coordinator.external import NotDistributableError, external_scan_plan
from sqe.distributed.protocol.ipc import decode_batch, decode_schema
from sqe.distributed.protocol.ticket import build_ticket, decode_ticket
from sqe.execution.local import LocalExecutor
from sqe.execution.tvf import FileSource, FileStream
from tests.unit.workers.worker_fixtures import wire
from workers.fileio import FragmentFileIO
from workers.fragment import RunningFragment, WorkerStats

IDENT = TableIdent("wh", ("ext",), "sales")
KEYS = CredentialSet(
    prefix="s3://", access_key_id="AKIDEXAMPLE", secret_access_key="not-a-real-secret", source="static"
)
PARTITIONS = pa.schema([("region", pa.string()), ("day", pa.date32())])


def mount(root: Path, file_format: str = "parquet", filter_: ds.Expression | None = None) -> FileStream:
    """``root/region=<r>/day=<d>/part.parquet`` as an external table's local stream (local file system)."""
    files = []
    for region, day, ids in (("eu", "2024-01-01", [1, 2]), ("eu", "2024-01-02", [3]), ("us", "2024-01-01", [4])):
        directory = root / f"region={region}" / f"day={day}"
        directory.mkdir(parents=True)
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), directory / "part.parquet")
        files.append(str(directory / "part.parquet"))
    source = FileSource(
        "wh.ext.sales",
        file_format,
        tuple(files),
        tuple(files),
        pafs.LocalFileSystem(),
        {},
        str(root) + "/",
        PARTITIONS,
        filter_,
        pa.schema([("id", pa.int64())]),
    )
    return FileStream(source)


def worker_rows(stream: FileStream, root: Path) -> list[dict[str, object]]:
    plan = external_scan_plan(IDENT, str(root), stream, KEYS)
    ticket = build_ticket(
        query_id="q1",
        fragment_id="q1.f0",
        table=wire_table_id(IDENT),
        metadata=plan.metadata,
        read_schema=plan.read.projected_schema,
        output_field_ids=plan.output_field_ids,
        tasks=plan.tasks,
        credentials=[],
    )
    decoded = decode_ticket(ticket)
    cancel = threading.Event()
    io = FragmentFileIO(decoded.credentials, decoded.storage, cancel=cancel, allow_local=True)
    messages = wire(RunningFragment(decoded, io, cancel).stream(LocalExecutor(), 1 << 20, WorkerStats()))
    schema = decode_schema(messages[0].schema.ipc)
    batches = [decode_batch(m.batch.ipc, schema) for m in messages if m.WhichOneof("payload") == "batch"]
    table = pa.Table.from_batches(batches, schema=schema).cast(plan.arrow_schema)
    return sorted(table.to_pylist(), key=lambda r: int(str(r["id"])))


def local_rows(stream: FileStream) -> list[dict[str, object]]:
    table = pa.RecordBatchReader.from_stream(stream).read_all()
    return sorted(table.to_pylist(), key=lambda r: int(str(r["id"])))


def test_a_worker_reads_the_same_rows_as_the_local_stream(tmp_path: Path) -> None:
    stream = mount(tmp_path)
    expected = local_rows(stream)
    assert expected[0] == {"id": 1, "region": "eu", "day": datetime.date(2024, 1, 1)}
    assert worker_rows(stream, tmp_path) == expected


def test_pruning_happens_before_the_tasks_are_built(tmp_path: Path) -> None:
    stream = mount(tmp_path, filter_=ds.field("region") == "eu")
    plan = external_scan_plan(IDENT, str(tmp_path), stream, KEYS)
    assert sorted(t.file.file_path.rpartition("region=")[2] for t in plan.tasks) == [
        "eu/day=2024-01-01/part.parquet",
        "eu/day=2024-01-02/part.parquet",
    ]
    days = sorted(t.file.partition[1] for t in plan.tasks)
    assert days == [19723, 19724], "identity date partition values are days since the epoch"
    assert all(t.file.record_count >= 1 and t.file.file_size_in_bytes > 0 for t in plan.tasks)
    assert [r["id"] for r in worker_rows(stream, tmp_path)] == [1, 2, 3]


def test_the_static_set_is_scoped_to_the_mount_and_hidden(tmp_path: Path) -> None:
    plan = external_scan_plan(IDENT, "s3://bucket/sales", mount(tmp_path), KEYS)
    static = plan.credentials.static
    assert static is not None and static.source == "static" and static.prefix == "s3://bucket/sales/"
    assert "not-a-real-secret" not in repr(plan) and "not-a-real-secret" not in repr(plan.credentials)
    assert plan.metadata.properties["schema.name-mapping.default"]
    assert [f.name for f in plan.metadata.spec().fields] == ["region", "day"]


def test_csv_mounts_stay_on_the_coordinator(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("id\n1\n")
    source = FileSource(
        "wh.ext.c",
        "csv",
        (str(tmp_path / "a.csv"),),
        (str(tmp_path / "a.csv"),),
        pafs.LocalFileSystem(),
        {"columns": {"id": "BIGINT"}},
        str(tmp_path) + "/",
        None,
        None,
        pa.schema([("id", pa.int64())]),
    )
    with pytest.raises(NotDistributableError, match="only Parquet external tables are scanned on workers"):
        external_scan_plan(IDENT, str(tmp_path), FileStream(source), KEYS)
