"""A commit keeps the table's history in order: sequence numbers rise, and time does not run backwards.

It also keeps ``main`` a branch, as the spec defines it: pyiceberg let a commit make it a tag, which no writer
can commit to.

pyiceberg's update code checks a new snapshot's sequence number on format-version 2 only (a v3 table took any),
and takes an added snapshot's ``timestamp-ms`` as ``last-updated-ms`` however old it is. The next revision logs
that time in ``metadata-log``, after the newer one before it, and an added snapshot's ``snapshot-log`` entry lands
behind the current one: Iceberg's Java reader refuses metadata whose logs go back more than a minute (its
tolerance for clocks of different machines), so such a table could no longer be read by Spark or Trino. The
catalog refuses the commit instead (400), with the same minute's tolerance.

pyiceberg also drops just the entries of removed snapshots from ``snapshot-log``: with ``s2`` of ``s1, s2, s3``
expired, the log said ``s1`` was current until ``s3`` was, and time travel to a moment in between read ``s1``. As
Iceberg's reference implementation does, a removed snapshot's entry now ends the history: every entry before it
goes. A snapshot a commit made current and then replaced in the same commit (an intermediate one) was never
current, so its entry goes too. And a removed snapshot's partition statistics go with it, as its table
statistics already did (pyiceberg kept them, naming a snapshot the table no longer has).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

from pyiceberg.table.metadata import TableMetadata, TableMetadataV1
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import SnapshotLogEntry
from pyiceberg.table.update import AddSnapshotUpdate, RemoveSnapshotsUpdate, SetSnapshotRefUpdate, TableUpdate

from sqe_catalog.errors import BadRequestError

__all__ = ["check_history", "with_snapshot_log"]

_MAIN = "main"
CLOCK_SKEW_MS = 60_000  # what Iceberg's Java metadata parser tolerates between log entries


def check_history(base: TableMetadata | None, staged: TableMetadata, updates: Sequence[TableUpdate]) -> None:
    """Refuse ``updates`` (applied to ``base``, giving ``staged``) when they break the order of the history."""
    _check_main_is_a_branch(updates)
    if base is None:
        return  # a create: no history yet
    _check_sequence_numbers(base, updates)
    if staged.last_updated_ms < base.last_updated_ms - CLOCK_SKEW_MS:
        raise BadRequestError(
            f"invalid table update: the commit's time {staged.last_updated_ms} (a snapshot's timestamp-ms) is more "
            f"than a minute before the table's last update at {base.last_updated_ms}"
        )


def _check_main_is_a_branch(updates: Sequence[TableUpdate]) -> None:
    """The spec's ``main`` is the branch at the current snapshot; a tag there would stop every writer."""
    for update in updates:
        if _sets_main(update) and update.type != SnapshotRefType.BRANCH:
            raise BadRequestError("invalid table update: the main ref must be a branch, not a tag")


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


def with_snapshot_log(
    base: TableMetadata | None, staged: TableMetadata, updates: Sequence[TableUpdate]
) -> TableMetadata:
    """``staged`` with the snapshot-log a reader may time-travel by (no gap left by a removed snapshot, and no
    entry for a snapshot that was current only within this commit), and no removed snapshot's statistics."""
    removed = any(isinstance(update, RemoveSnapshotsUpdate) for update in updates)
    intermediate = _intermediate_snapshots(updates, staged.current_snapshot_id)
    if not removed and not intermediate:
        return staged
    existing = {snapshot.snapshot_id for snapshot in staged.snapshots}
    partition_statistics = [s for s in staged.partition_statistics if s.snapshot_id in existing or not removed]
    before = list(base.snapshot_log) if base else []
    logged = before + [entry for entry in staged.snapshot_log if entry not in before]
    history: list[SnapshotLogEntry] = []
    for entry in logged:
        if entry.snapshot_id not in existing:
            history.clear()  # what came before a removed snapshot can no longer be told apart from it
        elif entry.snapshot_id not in intermediate:
            history.append(entry)
    return staged.model_copy(update={"snapshot_log": history, "partition_statistics": partition_statistics})


def _intermediate_snapshots(updates: Sequence[TableUpdate], current: int | None) -> set[int]:
    added: set[int] = set()
    intermediate: set[int] = set()
    for update in updates:
        if isinstance(update, AddSnapshotUpdate):
            added.add(update.snapshot.snapshot_id)
        elif _sets_main(update) and update.snapshot_id in added and update.snapshot_id != current:
            intermediate.add(update.snapshot_id)
    return intermediate


def _sets_main(update: TableUpdate) -> TypeGuard[SetSnapshotRefUpdate]:
    return isinstance(update, SetSnapshotRefUpdate) and update.ref_name == _MAIN
