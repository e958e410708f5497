"""A commit keeps the table's history in order: sequence numbers rise, and time does not run backwards.

pyiceberg's update code checks a new snapshot's sequence number on format-version 2 only (a v3 table took any),
and takes an added snapshot's ``timestamp-ms`` as ``last-updated-ms`` however old it is. The next revision logs
that time in ``metadata-log``, after the newer one before it, and an added snapshot's ``snapshot-log`` entry lands
behind the current one: Iceberg's Java reader refuses metadata whose logs go back more than a minute (its
tolerance for clocks of different machines), so such a table could no longer be read by Spark or Trino. The
catalog refuses the commit instead (400), with the same minute's tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyiceberg.table.metadata import TableMetadata, TableMetadataV1
from pyiceberg.table.update import AddSnapshotUpdate, TableUpdate

from sqe_catalog.errors import BadRequestError

__all__ = ["check_history"]

CLOCK_SKEW_MS = 60_000  # what Iceberg's Java metadata parser tolerates between log entries


def check_history(base: TableMetadata | None, staged: TableMetadata, updates: Sequence[TableUpdate]) -> None:
    """Refuse ``updates`` (applied to ``base``, giving ``staged``) when they break the order of the history."""
    if base is None:
        return  # a create: no history yet
    _check_sequence_numbers(base, updates)
    if staged.last_updated_ms < base.last_updated_ms - CLOCK_SKEW_MS:
        raise BadRequestError(
            f"invalid table update: the commit's time {staged.last_updated_ms} (a snapshot's timestamp-ms) is more "
            f"than a minute before the table's last update at {base.last_updated_ms}"
        )


def _check_sequence_numbers(base: TableMetadata, updates: Sequence[TableUpdate]) -> None:
    if isinstance(base, TableMetadataV1):
        return  # v1 snapshots carry no sequence numbers
    last = base.last_sequence_number
    for update in updates:
        if not isinstance(update, AddSnapshotUpdate):
            continue
        snapshot = update.snapshot
        if snapshot.sequence_number is None or snapshot.sequence_number <= last:
            raise BadRequestError(
                f"invalid table update: snapshot {snapshot.snapshot_id} has sequence-number "
                f"{snapshot.sequence_number}, not above the table's last-sequence-number {last}"
            )
        last = snapshot.sequence_number
