"""Transitions and admission boundaries of protected tables (key-ID pin + metadata digest).

Rules (each enforced here, before any trusted state changes):

- create pins the candidate: no ``encryption.key-id`` -> protected plaintext, ``K`` -> protected encrypted(K)
  with the digest of the metadata written; the table row and the pin are inserted in one transaction;
- commit to a protected table keeps the pinned key id (or its absence), and replaces pointer and digest in one
  transaction that compare-and-swaps both the table row and the pin on the previous pointer;
- register (new) is trust-on-first-use of the exact revision read; register with overwrite is re-admission,
  allowed only with the pinned key id; notification create/update of a missing table is trust-on-first-use,
  update of a protected plaintext table keeps the pinned absence, update of a protected encrypted table is refused
  (no authenticated expected digest can be bound to it); every (re-)admission is persisted as an audit event;
- load verifies pointer, key id and digest before metadata is returned;
- any revision of format-version < 3 with an ``encryption.*`` property is refused when pinned or re-pinned.

Legacy tables (no pin) never pass through here except to be left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from sqlalchemy import Connection, insert, update
from sqlalchemy.exc import IntegrityError

from sqe.vocabulary import ENCRYPTION_KEY_ID, ENCRYPTION_PROPERTY_PREFIX
from sqe_catalog.errors import AlreadyExistsError, ClaimRaced, CommitFailedError, MetadataIntegrityError
from sqe_catalog.integrity import state as st
from sqe_catalog.integrity.canonical import (
    DIGEST_VERSION,
    ParsedMetadata,
    digest_document,
    document_for_write,
    write_metadata_file,
)
from sqe_catalog.integrity.state import AdmissionEvent, TableName, TrustedState

log = logging.getLogger("sqe_catalog.integrity")

__all__ = [
    "candidate_state",
    "check_candidate",
    "format_version_for",
    "key_id_of",
    "verify_loaded",
    "write_new_table",
]

FORMAT_VERSION_PROPERTY = "format-version"

# Runs inside the transaction that moves a protected table's pointer, with the new pointer and the metadata being
# pinned: records the table's locations and UUID and, for a notification, its timestamp; raising rolls the whole
# transaction back.
AlsoInTransaction = Callable[[Connection, str, TableMetadata], None]


def _no_more(_conn: Connection, _location: str, _metadata: TableMetadata) -> None:
    return None


MIN_ENCRYPTION_FORMAT_VERSION = 3


def key_id_of(properties: Mapping[str, str]) -> str | None:
    return properties.get(ENCRYPTION_KEY_ID)


def format_version_for(schema: Schema, properties: dict[str, str]) -> dict[str, str]:
    """Properties for a create: without an explicit ``format-version``, the lowest version (at least 2) whose
    types the schema uses, so nanosecond timestamps get a v3 table. An explicit version is kept as given."""
    if FORMAT_VERSION_PROPERTY in properties:
        return properties
    needed = max([2, *(field.field_type.minimum_format_version() for field in _all_fields(schema))])
    return {**properties, FORMAT_VERSION_PROPERTY: str(needed)} if needed > 2 else properties


def _all_fields(schema: Schema) -> list[Any]:
    return [schema.find_field(field_id) for field_id in schema._lazy_id_to_field]


# ----------------------------------------------------------------------------------------------------
# Verdicts


def check_candidate(table: TableName, metadata: TableMetadata, pinned: TrustedState | None) -> str | None:
    """Check a revision about to be pinned or re-pinned; returns its key id (None: absent).

    ``pinned`` is the state it must keep (None when this revision starts a new lifetime)."""
    encryption = sorted(k for k in metadata.properties if k.startswith(ENCRYPTION_PROPERTY_PREFIX))
    if encryption and metadata.format_version < MIN_ENCRYPTION_FORMAT_VERSION:
        raise MetadataIntegrityError(
            f"table {table}: encryption property {encryption[0]} requires format-version >= 3, "
            f"the metadata has format-version {metadata.format_version}"
        )
    key_id = key_id_of(metadata.properties)
    if pinned is not None:
        _check_key_id(table, pinned, key_id)
    return key_id


def _check_key_id(table: TableName, pinned: TrustedState, key_id: str | None) -> None:
    if pinned.key_id == key_id:
        return
    if pinned.key_id is None:
        raise MetadataIntegrityError(f"table {table} is a protected plaintext table: encryption.key-id cannot be set")
    if key_id is None:
        raise MetadataIntegrityError(f"table {table} is encrypted: encryption.key-id cannot be removed")
    raise MetadataIntegrityError(f"table {table} is encrypted: encryption.key-id cannot be changed")


def candidate_state(
    table: TableName, location: str, parsed: ParsedMetadata, pinned: TrustedState | None
) -> TrustedState:
    """The trusted state that admitting ``parsed`` (at ``location``) would record."""
    key_id = check_candidate(table, parsed.metadata, pinned)
    if key_id is None:
        return TrustedState(location, None, None, None)
    return TrustedState(location, key_id, digest_document(parsed.document), DIGEST_VERSION)


def verify_loaded(table: TableName, trusted: TrustedState, location: str, parsed: ParsedMetadata) -> None:
    """Metadata read from storage for a protected table must match its trusted state exactly (fail closed)."""
    trusted.check_consistent(table)
    if location != trusted.metadata_location:
        raise MetadataIntegrityError(f"table {table}: the metadata pointer does not match its trusted state")
    check_candidate(table, parsed.metadata, trusted)
    if trusted.key_id is not None:
        assert trusted.digest is not None and trusted.digest_version is not None
        if digest_document(parsed.document, trusted.digest_version) != trusted.digest:
            raise MetadataIntegrityError(f"table {table}: metadata does not match its trusted digest")


# ----------------------------------------------------------------------------------------------------
# Writes that change pointer and pin together


def catalog_io(catalog: SqlCatalog) -> FileIO:
    """The warehouse catalog's own FileIO (``tables._WarehouseSqlCatalog.io``; a plain SqlCatalog has none)."""
    io: FileIO = catalog.io  # type: ignore[attr-defined]
    return io


def new_metadata_location(metadata: TableMetadata, version: int) -> str:
    provider = load_location_provider(metadata.location, metadata.properties)
    return provider.new_table_metadata_file_location(version)


def write_new_table(
    catalog: SqlCatalog, table: TableName, metadata: TableMetadata, also: AlsoInTransaction = _no_more
) -> tuple[str, ParsedMetadata]:
    """Create a protected table: write its first metadata file, insert row and pin in one transaction."""
    location = new_metadata_location(metadata, 0)
    check_candidate(table, metadata, None)
    parsed = write_metadata_file(catalog_io(catalog), location, document_for_write(metadata, None))
    with removed_if_raced(catalog_io(catalog), location):
        _insert_protected(catalog, table, candidate_state(table, location, parsed, None), parsed, None, also)
    return location, parsed


@contextmanager
def removed_if_raced(io: FileIO, location: str) -> Iterator[None]:
    """Delete the metadata file just written at ``location`` when the transaction recording it lost to another
    catalog process's claim (``ClaimRaced``, raised before the commit: rolled back, so nothing names the file). It
    may lie in a place that claim took, readable with the credentials vended there, and each attempt writes one.
    Only then: after any other failure the outcome may be unknown, and a file a pointer names must never go."""
    try:
        yield
    except ClaimRaced:
        try:
            io.delete(location)
        except OSError as exc:  # best effort: the claim is retried whatever happens to the file
            log.warning("could not delete unused metadata file %s: %s", location, type(exc).__name__)
        raise


def _insert_protected(
    catalog: SqlCatalog,
    table: TableName,
    trusted: TrustedState,
    parsed: ParsedMetadata,
    event: AdmissionEvent | None,
    also: AlsoInTransaction,
) -> None:
    """Insert the table row and its pin (and the audit ``event``) in one transaction; 409 if the name is taken."""
    try:
        with catalog.engine.begin() as conn:
            row = catalog._create_table_row(table.dotted_namespace, table.name, trusted.metadata_location)
            conn.execute(insert(IcebergTables).values(**row))
            st.insert_state(conn, table, trusted)
            if event is not None:
                st.record_event(conn, event)
            also(conn, trusted.metadata_location, parsed.metadata)
    except IntegrityError:
        raise AlreadyExistsError(f"table already exists: {table.dotted_namespace}.{table.name}") from None


def commit_revision(
    catalog: SqlCatalog,
    table: TableName,
    trusted: TrustedState,
    base: ParsedMetadata,
    metadata: TableMetadata,
    also: AlsoInTransaction = _no_more,
) -> tuple[str, ParsedMetadata]:
    """Commit a new revision of a protected table: check the pin, write, then CAS row + pin together."""
    check_candidate(table, metadata, trusted)
    location = new_metadata_location(metadata, catalog._parse_metadata_version(trusted.metadata_location) + 1)
    parsed = write_metadata_file(catalog_io(catalog), location, document_for_write(metadata, base.document))
    new_state = candidate_state(table, location, parsed, trusted)
    with removed_if_raced(catalog_io(catalog), location), catalog.engine.begin() as conn:
        _swap_pointer(conn, catalog, table, trusted.metadata_location, location)
        st.replace_state(conn, table, trusted, new_state)
        also(conn, location, parsed.metadata)
    return location, parsed


def _swap_pointer(conn: Connection, catalog: SqlCatalog, table: TableName, expected: str, location: str) -> None:
    result = conn.execute(
        update(IcebergTables)
        .where(
            (IcebergTables.catalog_name == catalog.name)
            & (IcebergTables.table_namespace == table.dotted_namespace)
            & (IcebergTables.table_name == table.name)
            & (IcebergTables.metadata_location == expected)
        )
        .values(metadata_location=location, previous_metadata_location=expected)
    )
    if result.rowcount != 1:
        raise CommitFailedError(f"table {table} has been updated concurrently")


@dataclass(frozen=True)
class Admission:
    """A revision read to be admitted as a table's current one, and who asked for it through which action."""

    location: str
    parsed: ParsedMetadata  # the bytes of the one read of ``location`` (never read again to admit them)
    actor: str  # the principal, as the audit log names it
    action: str  # "register", "notification-create", ... (the audit log's action)


def admit_new(catalog: SqlCatalog, table: TableName, admission: Admission, also: AlsoInTransaction = _no_more) -> None:
    """Trust-on-first-use admission of the exact revision read (register new, notification of a missing table)."""
    trusted = candidate_state(table, admission.location, admission.parsed, None)
    event = _event(admission.action, admission.actor, table, None, trusted)
    _insert_protected(catalog, table, trusted, admission.parsed, event, also)


def readmit(
    catalog: SqlCatalog,
    table: TableName,
    trusted: TrustedState,
    admission: Admission,
    also: AlsoInTransaction = _no_more,
) -> None:
    """Re-admission of a protected table (register overwrite, plaintext notification update): same key id."""
    location, parsed, actor, action = admission.location, admission.parsed, admission.actor, admission.action
    new_state = candidate_state(table, location, parsed, trusted)
    with catalog.engine.begin() as conn:
        _swap_pointer(conn, catalog, table, trusted.metadata_location, location)
        st.replace_state(conn, table, trusted, new_state)
        st.record_event(conn, _event(action, actor, table, trusted, new_state))
        also(conn, location, parsed.metadata)


def replace_legacy_pointer(
    catalog: SqlCatalog,
    table: TableName,
    expected: str,
    location: str,
    also: Callable[[Connection], None] | None = None,
) -> None:
    """Legacy commit, register overwrite, notification update: the pointer moves, no pin and no digest are
    created (``also`` runs in the same transaction: a notification's timestamp). The caller read no pin; checked
    again after the swap took the row, in its transaction: a table that took the name meanwhile at the same
    metadata location (dropped, then admitted again by a register or a notification) is protected, and its pointer
    must not move without its pin."""
    with catalog.engine.begin() as conn:
        _swap_pointer(conn, catalog, table, expected, location)
        if st.load_state(conn, table) is not None:  # raising rolls the swap back
            raise CommitFailedError(
                f"table {table} is a protected table now: its metadata location was admitted again meanwhile "
                "(after a drop, by a register or a notification); nothing was changed, retry on the protected table"
            )
        if also is not None:
            also(conn)


def _event(
    action: str, actor: str, table: TableName, displaced: TrustedState | None, admitted: TrustedState
) -> AdmissionEvent:
    return AdmissionEvent(
        action=action,
        actor=actor,
        table=table,
        displaced_location=displaced.metadata_location if displaced else None,
        displaced_digest=displaced.digest if displaced else None,
        new_location=admitted.metadata_location,
        new_digest=admitted.digest,
        key_id=admitted.key_id,
    )
