"""What a table's data folder holds in the shared moto store, and which of it the table's snapshots reference:
a write that failed or was retried must leave nothing in the first set that is not in the second. Also the rows
the data files themselves hold, read with pyarrow alone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from tests.conftest import CatalogServer


def _store(server: CatalogServer) -> pafs.S3FileSystem:
    moto = server.moto
    return pafs.S3FileSystem(
        access_key=moto.access_key_id, secret_key=moto.secret_access_key, endpoint_override=moto.url, region=moto.region
    )


def data_objects(server: CatalogServer, table: Any) -> set[str]:
    fs = _store(server)
    root = table.location().removeprefix("s3://") + "/data"
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return {"s3://" + i.path for i in infos if i.type == pafs.FileType.File}


def referenced(table: Any) -> set[str]:
    """Every data file of every snapshot of ``table`` (refreshed first)."""
    table.refresh()
    return {t.file.file_path for s in table.snapshots() for t in table.scan(snapshot_id=s.snapshot_id).plan_files()}


def parquet_rows(server: CatalogServer, table: Any) -> list[dict[str, Any]]:
    """The rows of every data file of ``table``'s current snapshot as pyarrow reads the files themselves (no
    Iceberg reader's projection in between)."""
    fs = _store(server)
    table.refresh()
    paths = [task.file.file_path.removeprefix("s3://") for task in table.scan().plan_files()]
    return [row for path in paths for row in pq.read_table(path, filesystem=fs).to_pylist()]
