"""What a table's data folder holds in the shared moto store, and which of it the table's snapshots reference:
a write that failed or was retried must leave nothing in the first set that is not in the second."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

if TYPE_CHECKING:
    from tests.conftest import CatalogServer


def data_objects(server: CatalogServer, table: Any) -> set[str]:
    moto = server.moto
    fs = pafs.S3FileSystem(
        access_key=moto.access_key_id, secret_key=moto.secret_access_key, endpoint_override=moto.url, region=moto.region
    )
    root = table.location().removeprefix("s3://") + "/data"
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return {"s3://" + i.path for i in infos if i.type == pafs.FileType.File}


def referenced(table: Any) -> set[str]:
    """Every data file of every snapshot of ``table`` (refreshed first)."""
    table.refresh()
    return {t.file.file_path for s in table.snapshots() for t in table.scan(snapshot_id=s.snapshot_id).plan_files()}
