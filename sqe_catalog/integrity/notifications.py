"""Polaris-style table notifications and the JSON form of metadata in responses.

``POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/notifications`` with
``{"notification-type": "CREATE"|"UPDATE"|"DROP"|"VALIDATE", "payload": {"table-name", "timestamp",
"table-uuid", "metadata-location"}}``. A notification whose ``timestamp`` is not newer than the last one accepted
for the table is stale (409). CREATE, and UPDATE of a missing table, are trust-on-first-use admissions of the
revision at ``metadata-location``; UPDATE of a protected plaintext table must keep the pinned key-id absence;
UPDATE of a protected encrypted table is refused (422) until an authenticated expected digest can be bound to it;
a legacy table's pointer moves as before. DROP drops without purge; VALIDATE only checks the location.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyiceberg.table.metadata import TableMetadata

from sqe.vocabulary import METADATA_LOCATION
from sqe_catalog.errors import BadRequestError
from sqe_catalog.integrity.canonical import model_document

__all__ = ["Notification", "metadata_response_json", "parse_notification"]

NOTIFICATION_KINDS = frozenset({"CREATE", "UPDATE", "DROP", "VALIDATE"})


@dataclass(frozen=True)
class Notification:
    kind: str
    timestamp_ms: int
    metadata_location: str


def parse_notification(body: dict[str, Any], table: str) -> Notification:
    kind = body.get("notification-type")
    if kind not in NOTIFICATION_KINDS:
        raise BadRequestError("notification-type must be one of CREATE, UPDATE, DROP, VALIDATE")
    payload = body.get("payload")
    if not isinstance(payload, dict):
        raise BadRequestError("payload must be an object")
    if payload.get("table-name", table) != table:
        raise BadRequestError("payload table-name does not match the table in the path")
    timestamp = payload.get("timestamp")
    if not isinstance(timestamp, int) or isinstance(timestamp, bool) or timestamp < 0:
        raise BadRequestError("payload timestamp must be a non-negative integer (milliseconds)")
    location = payload.get(METADATA_LOCATION)
    if kind != "DROP" and (not isinstance(location, str) or not location):
        raise BadRequestError("payload metadata-location must be a non-empty string")
    return Notification(str(kind), timestamp, location if isinstance(location, str) else "")


def metadata_response_json(metadata: TableMetadata, document: dict[str, Any] | None, refs_only: bool) -> str:
    """The metadata object of a LoadTableResult: the complete document (v3 and dropped fields included)."""
    doc = dict(document) if document is not None else model_document(metadata)
    if refs_only:
        referenced = {ref.snapshot_id for ref in metadata.refs.values()}
        doc["snapshots"] = [s for s in doc.get("snapshots") or [] if s.get("snapshot-id") in referenced]
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
