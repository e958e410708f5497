"""Row lineage (Iceberg format-version 3): ``next-row-id`` on every v3 revision the catalog writes.

The spec requires ``next-row-id`` in v3 table metadata (a new table starts at 0) and ``first-row-id`` plus
``added-rows`` on every v3 snapshot; adding a snapshot advances ``next-row-id`` by its ``added-rows``. pyiceberg
0.12 creates v3 metadata without ``next-row-id``, and its add-snapshot update then keeps it unset (it also accepts
a v3 snapshot without ``added-rows``), so the catalog completes and checks both itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyiceberg.table.metadata import TableMetadata, TableMetadataV3
from pyiceberg.table.update import AddSnapshotUpdate, TableUpdate

__all__ = ["MIN_ROW_LINEAGE_FORMAT_VERSION", "check_snapshot_lineage", "with_next_row_id"]

MIN_ROW_LINEAGE_FORMAT_VERSION = 3


def with_next_row_id(metadata: TableMetadata) -> TableMetadata:
    """``metadata`` with ``next-row-id`` set when v3 lacks it: past every row id its snapshots assigned (0 for a
    table without snapshots). Metadata that has it, and v1/v2 metadata, are returned unchanged."""
    if not isinstance(metadata, TableMetadataV3) or metadata.next_row_id is not None:
        return metadata  # v1/v2 (pyiceberg 0.12 knows no format above 3), or already set
    assigned = [
        snapshot.first_row_id + snapshot.added_rows
        for snapshot in metadata.snapshots
        if snapshot.first_row_id is not None and snapshot.added_rows is not None
    ]
    return metadata.model_copy(update={"next_row_id": max(assigned, default=0)})


def check_snapshot_lineage(format_version: int, updates: Sequence[TableUpdate]) -> None:
    """A v3 snapshot must say how many row ids it assigns; ValueError (the client's mistake) otherwise."""
    if format_version < MIN_ROW_LINEAGE_FORMAT_VERSION:
        return
    for update in updates:
        if not isinstance(update, AddSnapshotUpdate):
            continue
        snapshot = update.snapshot
        if snapshot.added_rows is None or snapshot.added_rows < 0:
            raise ValueError(f"snapshot {snapshot.snapshot_id}: a format-version 3 snapshot needs added-rows >= 0")
        if snapshot.first_row_id is not None and snapshot.first_row_id < 0:
            raise ValueError(f"snapshot {snapshot.snapshot_id}: first-row-id must not be negative")
