"""What the Iceberg table spec requires of the metadata and manifests a writer leaves, checked on the files in
storage: the metadata JSON's required fields and their invariants, and every snapshot's manifest list, manifests
and summary totals against the data files they name. Returns the problems found (empty: valid)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestContent, ManifestEntryStatus, ManifestFile
from pyiceberg.table.metadata import TableMetadataUtil

__all__ = ["metadata_problems"]

OPERATIONS = frozenset({"append", "replace", "overwrite", "delete"})
COMMON_REQUIRED = (
    "format-version",
    "table-uuid",
    "location",
    "last-updated-ms",
    "last-column-id",
    "schemas",
    "current-schema-id",
    "partition-specs",
    "default-spec-id",
    "last-partition-id",
)
V1_REQUIRED = ("schema", "partition-spec")  # deprecated, but required in v1 (older readers use only these)
V2_REQUIRED = ("last-sequence-number", "sort-orders", "default-sort-order-id")


@dataclass
class _Found:
    problems: list[str] = field(default_factory=list)

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.problems.append(message)


def metadata_problems(io: FileIO, metadata_location: str) -> list[str]:
    """Everything in the metadata file at ``metadata_location`` (and the files it names) that breaks the spec."""
    with io.new_input(metadata_location).open() as stream:
        document: dict[str, Any] = json.loads(stream.read())
    found = _Found()
    _check_document(document, found)
    metadata = TableMetadataUtil.parse_obj(document)
    by_id = {s.snapshot_id: s for s in metadata.snapshots}
    for snapshot in metadata.snapshots:
        manifests = snapshot.manifests(io)
        _check_manifests(io, snapshot.snapshot_id, snapshot.sequence_number or 0, manifests, by_id, found)
        if snapshot.summary is not None:
            _check_totals(io, snapshot.snapshot_id, dict(snapshot.summary.additional_properties), manifests, found)
    return found.problems


def _check_document(doc: dict[str, Any], found: _Found) -> None:
    version = doc.get("format-version")
    required = COMMON_REQUIRED + (V2_REQUIRED if isinstance(version, int) and version >= 2 else V1_REQUIRED)
    for key in required:
        found.check(key in doc, f"required field {key} missing")
    if isinstance(version, int) and version >= 3:
        found.check(isinstance(doc.get("next-row-id"), int), "v3 metadata without next-row-id")
    snapshots = doc.get("snapshots") or []
    ids = {s["snapshot-id"] for s in snapshots}
    current = doc.get("current-snapshot-id")
    if current is not None and current != -1:
        found.check(current in ids, f"current-snapshot-id {current} is not a snapshot")
        main = (doc.get("refs") or {}).get("main")
        found.check(
            main is not None and main.get("snapshot-id") == current and main.get("type") == "branch",
            f"refs.main {main} is not the branch at current-snapshot-id {current}",
        )
    for ref_name, ref in (doc.get("refs") or {}).items():
        found.check(ref.get("snapshot-id") in ids, f"ref {ref_name} names a snapshot that is not in snapshots")
    schema_ids = [s.get("schema-id") for s in doc.get("schemas", [])]
    found.check(len(schema_ids) == len(set(schema_ids)), f"schema ids repeat: {schema_ids}")
    found.check(doc.get("current-schema-id") in schema_ids, "current-schema-id names no schema")
    spec_ids = [s.get("spec-id") for s in doc.get("partition-specs", [])]
    found.check(len(spec_ids) == len(set(spec_ids)), f"spec ids repeat: {spec_ids}")
    found.check(doc.get("default-spec-id") in spec_ids, "default-spec-id names no spec")
    partition_field_ids = [f["field-id"] for s in doc.get("partition-specs", []) for f in s.get("fields", [])]
    found.check(
        all(i <= doc.get("last-partition-id", -1) for i in partition_field_ids),
        "partition field id > last-partition-id",
    )
    _check_snapshots(doc, snapshots, found)
    _check_logs(doc, snapshots, found)


def _check_snapshots(doc: dict[str, Any], snapshots: list[dict[str, Any]], found: _Found) -> None:
    by_id = {s["snapshot-id"]: s for s in snapshots}
    last_sequence = doc.get("last-sequence-number", 0)
    version = doc.get("format-version", 1)
    for snapshot in snapshots:
        sid = snapshot["snapshot-id"]
        for key in ("snapshot-id", "timestamp-ms", "manifest-list", "summary"):
            found.check(key in snapshot, f"snapshot {sid} lacks {key}")
        operation = (snapshot.get("summary") or {}).get("operation")
        found.check(operation in OPERATIONS, f"snapshot {sid} has operation {operation!r}")
        found.check(snapshot["timestamp-ms"] <= doc["last-updated-ms"], f"snapshot {sid} is newer than last-updated-ms")
        if version >= 2:
            sequence = snapshot.get("sequence-number")
            found.check(isinstance(sequence, int), f"snapshot {sid} lacks sequence-number")
            found.check((sequence or 0) <= last_sequence, f"snapshot {sid} sequence {sequence} > last")
            parent = by_id.get(snapshot.get("parent-snapshot-id"))
            if parent is not None:
                found.check(
                    (sequence or 0) > (parent.get("sequence-number") or 0),
                    f"snapshot {sid} sequence {sequence} not above its parent's",
                )
        if version >= 3:
            found.check(isinstance(snapshot.get("first-row-id"), int), f"v3 snapshot {sid} lacks first-row-id")
            found.check(isinstance(snapshot.get("added-rows"), int), f"v3 snapshot {sid} lacks added-rows")
    sequences = [s.get("sequence-number") for s in snapshots if version >= 2]
    found.check(len(sequences) == len(set(sequences)), f"sequence numbers repeat: {sequences}")


def _check_logs(doc: dict[str, Any], snapshots: list[dict[str, Any]], found: _Found) -> None:
    snapshot_log = doc.get("snapshot-log") or []
    times = [entry["timestamp-ms"] for entry in snapshot_log]
    found.check(times == sorted(times), f"snapshot-log is not in time order: {times}")
    current = doc.get("current-snapshot-id")
    if current not in (None, -1):
        found.check(
            bool(snapshot_log) and snapshot_log[-1]["snapshot-id"] == current,
            "snapshot-log does not end at the current snapshot",
        )
    metadata_log = doc.get("metadata-log") or []
    logged = [entry["timestamp-ms"] for entry in metadata_log]
    found.check(logged == sorted(logged), f"metadata-log is not in time order: {logged}")
    found.check(all(t <= doc["last-updated-ms"] for t in times + logged), "a log entry is newer than last-updated-ms")
    found.check(len({e["metadata-file"] for e in metadata_log}) == len(metadata_log), "metadata-log names a file twice")


def _check_manifests(
    io: FileIO, sid: int, sequence: int, manifests: list[ManifestFile], by_id: dict[int, Any], found: _Found
) -> None:
    for manifest in manifests:
        if manifest.added_snapshot_id == sid:
            found.check(
                manifest.sequence_number == sequence,
                f"snapshot {sid}: its own manifest has sequence {manifest.sequence_number}, not {sequence}",
            )
        else:
            found.check(
                manifest.added_snapshot_id in by_id or manifest.sequence_number < sequence,
                f"snapshot {sid}: a manifest added by snapshot {manifest.added_snapshot_id} is not older",
            )
        found.check(
            manifest.sequence_number <= sequence,
            f"snapshot {sid}: manifest sequence {manifest.sequence_number} above the snapshot's {sequence}",
        )
        entries = manifest.fetch_manifest_entry(io, discard_deleted=False)
        counts = {status: 0 for status in ManifestEntryStatus}
        rows = {status: 0 for status in ManifestEntryStatus}
        for entry in entries:
            counts[entry.status] += 1
            rows[entry.status] += entry.data_file.record_count
            if entry.status == ManifestEntryStatus.ADDED:
                found.check(
                    entry.snapshot_id == manifest.added_snapshot_id,
                    f"snapshot {sid}: an added entry's snapshot id {entry.snapshot_id} is not its manifest's "
                    f"added_snapshot_id {manifest.added_snapshot_id}",
                )
            found.check(
                entry.sequence_number is None or entry.sequence_number <= sequence,
                f"snapshot {sid}: entry data sequence {entry.sequence_number} above the snapshot's {sequence}",
            )
        for status, count_field in (
            (ManifestEntryStatus.ADDED, "added_files_count"),
            (ManifestEntryStatus.EXISTING, "existing_files_count"),
            (ManifestEntryStatus.DELETED, "deleted_files_count"),
        ):
            stated = getattr(manifest, count_field)
            found.check(
                stated is None or stated == counts[status],
                f"snapshot {sid}: manifest {count_field} {stated} but {counts[status]} entries",
            )


def _check_totals(io: FileIO, sid: int, summary: dict[str, str], manifests: list[ManifestFile], found: _Found) -> None:
    """total-records / total-data-files (and the delete totals) equal the live files the snapshot names."""
    records = files = delete_files = 0
    for manifest in manifests:
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
            if manifest.content == ManifestContent.DATA:
                files += 1
                records += entry.data_file.record_count
            else:
                delete_files += 1
    expected = {"total-records": records, "total-data-files": files, "total-delete-files": delete_files}
    for key, value in expected.items():
        if key in summary:
            found.check(int(summary[key]) == value, f"snapshot {sid}: summary {key} {summary[key]} but {value}")
        else:
            found.check(False, f"snapshot {sid}: summary lacks {key}")
