"""Trusted per-table integrity state, admission audit events and cleanup tasks, in the catalog's own database.

Nothing here is a client-visible table property, and nothing is ever derived from a metadata file after the
fact. A table is in one of three states (see ``TrustedState``):

================== =========== ================ ======================
state              pin marker  trusted key id   trusted digest
================== =========== ================ ======================
legacy             absent      unknown          none
protected plaintext present    pinned absent    none
protected encrypted present    pinned value     present (+ version)
================== =========== ================ ======================

The marker is the presence of a row in ``sqe_table_integrity``. The table is created empty, and no code path
inserts a row for a table that already exists, so every table that existed before this schema (the migration)
stays legacy: never enrolled automatically, never given a backfilled digest.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.catalog.sql import IcebergTables
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Integer,
    String,
    Table,
    Text,
    bindparam,
    delete,
    insert,
    select,
    update,
)

from sqe_catalog.errors import CommitFailedError, MetadataIntegrityError
from sqe_catalog.schema import METADATA, create_tables, object_key, trusted_state_columns, warehouse_key

__all__ = [
    "AdmissionEvent",
    "CleanupTask",
    "Protection",
    "TableName",
    "TrustedState",
    "create_integrity_schema",
]

# On the catalog's one MetaData. Another store's schema call may create these tables too; they start empty either
# way, so no existing table is enrolled by it.
_pins = Table(
    "sqe_table_integrity",
    METADATA,
    *object_key(),
    Column("metadata_location", Text, nullable=False),  # the pointer this state was recorded for
    *trusted_state_columns(),
)
_events = Table(
    "sqe_integrity_events",
    METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at_ms", BigInteger, nullable=False),
    *object_key(primary_key=False),
    Column("action", String(64), nullable=False),
    Column("actor", String(255), nullable=False),
    Column("displaced_location", Text, nullable=True),
    Column("displaced_digest", String(128), nullable=True),
    Column("new_location", Text, nullable=False),
    Column("new_digest", String(128), nullable=True),
    Column("key_id", Text, nullable=True),
)
_notification_times = Table(
    "sqe_notification_times",
    METADATA,
    *object_key(),
    Column("timestamp_ms", BigInteger, nullable=False),
)
# The locations (table location, write.data.path, write.metadata.path) each table claims, recorded by the catalog
# whenever it writes or admits a revision: the overlap check reads these, never a metadata file that storage could
# have rewritten or broken. Legacy tables have no row (their files are read, as before).
_locations = Table(
    "sqe_table_locations",
    METADATA,
    *object_key(),
    Column("locations", Text, nullable=False),  # JSON array of strings
)
# The table-uuid and a digest of the schemas of the revision each protected table's pointer names, recorded with
# that pointer (in the transaction that moved it): a plaintext table's file has no digest, and these decide what
# read-restrictions bind to (tags, and so masks, match the table by its UUID; a row filter names its columns, and
# masks select them, by name). Keyed by the pointer too, so a row a process of an earlier version left behind (it
# moved the pointer without one) never applies to another revision. Legacy tables, and protected ones not moved
# since this table was created, have no row (nothing is compared, as before).
_uuids = Table(
    "sqe_table_uuids",
    METADATA,
    *object_key(),
    Column("metadata_location", Text, nullable=False),
    Column("table_uuid", String(36), nullable=False),
    Column("schemas_digest", String(64), nullable=False),
)


def _place_records(name: str, time_column: str, *extra: Column[Any]) -> Table:
    """A log of places recorded under a table name: an id, when (ms), the name, ``extra``, the locations."""
    return Table(
        name,
        METADATA,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column(time_column, BigInteger, nullable=False),
        *object_key(primary_key=False),
        *extra,
        Column("locations", Text, nullable=False),  # JSON array of strings
    )


# Tombstones: the locations of dropped tables whose files are still in storage, so a new table claiming an
# overlapping location would be vended credentials for them (see WarehouseTables._check_dropped_locations). A drop
# without purge keeps its tombstone; a purge drop's goes when its cleanup task is done (same dropped_ms as the
# task's created_ms: one drop transaction wrote both), and stays when the task fails. Like every table here,
# create_all adds it to an existing database (empty: tables dropped before it existed left no record).
_dropped = _place_records("sqe_dropped_table_locations", "dropped_ms")
# Reservations: places whose credentials the catalog may have vended to a table that no longer holds them
# (dropped, moved away) or never did (a staged create), kept until those credentials have expired (``until_ms``:
# for a drop or move, the latest expiry vended for the warehouse (``_vended``); for a staged create, the expiry of
# the credential its answer carried, or the warehouse's credential lifetime when none went out). Until then no
# other table may claim the place, a content manager's neither: whoever holds the keys would read the new table's
# files. Expired rows are removed when a new one is written.
# table_uuid None: not known (a drop of unreadable metadata)
_reserved = _place_records("sqe_reserved_table_locations", "until_ms", Column("table_uuid", String(36), nullable=True))
_tasks = Table(
    "sqe_cleanup_tasks",
    METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("created_ms", BigInteger, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    *object_key(primary_key=False),
    Column("metadata_location", Text, nullable=False),
    Column("protected", Integer, nullable=False),  # 0: legacy table, no trusted state was copied
    *trusted_state_columns(),
    Column("status", String(16), nullable=False),  # pending | running | done | failed
    Column("detail", Text, nullable=True),
)
# The latest expiry (the ``Expiration`` STS answered) of any credential the catalog vended for a place of the
# warehouse, written before the credential is handed out and only ever raised, by every catalog process on the
# database: a drop or move reserves the places it leaves until then, since no credential vended before it is valid
# longer. No row: nothing recorded (static keys, or no STS credential yet); see ``vended_credentials_until``.
_vended = Table("sqe_vended_credentials", METADATA, warehouse_key(), Column("until_ms", BigInteger, nullable=False))
# A counter per warehouse that every claim of places (a create, stage-create, admission, move, view create or
# replace) raises in the transaction that records it, from the value read before its checks: a claim whose checks
# another catalog process's claim committed behind (the value moved on) rolls back, so checks and record act as
# one critical section across all processes on the database (see ``IntegrityGuard.claiming``).
_claims = Table("sqe_location_claims", METADATA, warehouse_key(), Column("epoch", BigInteger, nullable=False))
_TABLES = (_pins, _events, _notification_times, _locations, _uuids, _dropped, _reserved, _tasks, _vended, _claims)


def create_integrity_schema(engine: Engine) -> None:
    """Create the tables if missing (the migration: existing tables get no row and stay legacy)."""
    create_tables(engine, _TABLES)


def now_ms() -> int:
    return int(time.time() * 1000)


# ----------------------------------------------------------------------------------------------------
# Trusted state


class Protection(enum.StrEnum):
    LEGACY = "legacy"
    PLAINTEXT = "protected-plaintext"
    ENCRYPTED = "protected-encrypted"


@dataclass(frozen=True)
class TableName:
    """A table of the catalog by warehouse, namespace and name (the key of its pin and digest)."""

    warehouse: str
    namespace: tuple[str, ...]
    name: str

    @property
    def dotted_namespace(self) -> str:
        return ".".join(self.namespace)

    def __str__(self) -> str:
        return ".".join((self.warehouse, *self.namespace, self.name))


@dataclass(frozen=True)
class TrustedState:
    """A protected table's pin: the pointer it was recorded for, the key id (None = pinned absence), the digest."""

    metadata_location: str
    key_id: str | None
    digest: str | None
    digest_version: str | None
    # The places the catalog recorded for this pointer, in the transaction that moved it (None: not read, or a
    # table from before they were recorded). A function of the pointer, so no part of the pin's identity.
    locations: tuple[str, ...] | None = field(default=None, compare=False)
    # The table-uuid and schemas digest recorded with this pointer (None: recorded before the catalog kept them).
    # Likewise no part of the pin's identity.
    table_uuid: str | None = field(default=None, compare=False)
    schemas_digest: str | None = field(default=None, compare=False)

    @property
    def protection(self) -> Protection:
        return Protection.PLAINTEXT if self.key_id is None else Protection.ENCRYPTED

    def check_consistent(self, table: TableName) -> None:
        """An encrypted pin without a digest (or a plaintext pin with one) is inconsistent: fail closed."""
        if self.key_id is not None and (self.digest is None or self.digest_version is None):
            raise MetadataIntegrityError(f"trusted state of {table} pins a key id but has no metadata digest")
        if self.key_id is None and self.digest is not None:
            raise MetadataIntegrityError(f"trusted state of {table} has a digest but pins no key id")


def _where(ref: TableName) -> Any:
    return (
        (_pins.c.warehouse == ref.warehouse)
        & (_pins.c.namespace == ref.dotted_namespace)
        & (_pins.c.table_name == ref.name)
    )


def _row_to_state(row: Any, pinned_location: str | None = None) -> TrustedState:
    """The state of a pin row (with its recorded columns); ``pinned_location`` where the row names the pointer
    ``metadata_location`` and the pin's own apart."""
    return TrustedState(
        row.metadata_location if pinned_location is None else pinned_location,
        row.key_id,
        row.digest,
        row.digest_version,
        _recorded(row),
        row.recorded_uuid,
        row.recorded_schemas,
    )


def _recorded(row: Any) -> tuple[str, ...] | None:
    return tuple(json.loads(row.recorded_locations)) if row.recorded_locations is not None else None


def _with_recorded_locations(pins: Any) -> Any:
    """``pins`` (a select from the pin table) with the table's recorded locations and the table-uuid recorded with
    its pinned pointer, from the same snapshot."""
    with_locations = pins.add_columns(_locations.c.locations.label("recorded_locations")).outerjoin(
        _locations,
        (_locations.c.warehouse == _pins.c.warehouse)
        & (_locations.c.namespace == _pins.c.namespace)
        & (_locations.c.table_name == _pins.c.table_name),
    )
    recorded = (_uuids.c.table_uuid.label("recorded_uuid"), _uuids.c.schemas_digest.label("recorded_schemas"))
    return with_locations.add_columns(*recorded).outerjoin(
        _uuids,
        (_uuids.c.warehouse == _pins.c.warehouse)
        & (_uuids.c.namespace == _pins.c.namespace)
        & (_uuids.c.table_name == _pins.c.table_name)
        & (_uuids.c.metadata_location == _pins.c.metadata_location),
    )


# The table's pointer, its pin and its recorded locations in one statement, so all come from one snapshot (a
# commit between two reads would pair an old pointer with a new pin). Built once: the hot load path skips SQL
# construction.
_POINTER_AND_STATE = _with_recorded_locations(
    select(IcebergTables.metadata_location, _pins.c.metadata_location.label("pinned_location"))
    .add_columns(_pins.c.key_id, _pins.c.digest, _pins.c.digest_version)
    .select_from(IcebergTables)
    .outerjoin(
        _pins,
        (_pins.c.warehouse == IcebergTables.catalog_name)
        & (_pins.c.namespace == IcebergTables.table_namespace)
        & (_pins.c.table_name == IcebergTables.table_name),
    )
).where(
    (IcebergTables.catalog_name == bindparam("warehouse"))
    & (IcebergTables.table_namespace == bindparam("namespace"))
    & (IcebergTables.table_name == bindparam("name"))
)


def pointer_and_state(conn: Connection, ref: TableName) -> tuple[str | None, TrustedState | None]:
    """The table's metadata location (None: no such table) and its trusted state (None: legacy), read together."""
    params = {"warehouse": ref.warehouse, "namespace": ref.dotted_namespace, "name": ref.name}
    row = conn.execute(_POINTER_AND_STATE, params).first()
    if row is None:
        return None, None
    if row.pinned_location is None:
        return row.metadata_location, None
    return row.metadata_location, _row_to_state(row, row.pinned_location)


def load_state(conn: Connection, ref: TableName) -> TrustedState | None:
    """The table's trusted state, or None for a legacy table."""
    row = conn.execute(_with_recorded_locations(select(_pins)).where(_where(ref))).first()
    return _row_to_state(row) if row is not None else None


def insert_state(conn: Connection, ref: TableName, state: TrustedState) -> None:
    # A leftover row for a name no table holds (crash between two drops) is stale: a new lifetime replaces it.
    conn.execute(delete(_pins).where(_where(ref)))
    conn.execute(insert(_pins).values(**_state_values(ref, state)))


def replace_state(conn: Connection, ref: TableName, expected: TrustedState, state: TrustedState) -> None:
    """Compare-and-swap on the whole recorded pin; a lost race is a commit failure (409).

    The pointer alone is not enough: a re-admission of the current location keeps it but changes the digest, and a
    commit built on the displaced revision must not then replace the re-admitted one."""
    same = (
        (_pins.c.metadata_location == expected.metadata_location)
        & _pins.c.key_id.is_not_distinct_from(expected.key_id)
        & _pins.c.digest.is_not_distinct_from(expected.digest)
        & _pins.c.digest_version.is_not_distinct_from(expected.digest_version)
    )
    result = conn.execute(
        update(_pins)
        .where(_where(ref) & same)
        .values(metadata_location=state.metadata_location, key_id=state.key_id, digest=state.digest)
        .values(digest_version=state.digest_version)
    )
    if result.rowcount != 1:
        raise CommitFailedError(f"table {ref} was changed concurrently")


def delete_state(conn: Connection, ref: TableName) -> None:
    conn.execute(delete(_pins).where(_where(ref)))
    conn.execute(delete(_locations).where(_where_locations(ref)))
    conn.execute(delete(_uuids).where(_named(_uuids, ref)))


def rename_state(conn: Connection, source: TableName, target: TableName) -> None:
    conn.execute(delete(_pins).where(_where(target)))
    conn.execute(update(_pins).where(_where(source)).values(namespace=target.dotted_namespace, table_name=target.name))
    conn.execute(delete(_locations).where(_where_locations(target)))
    renamed = {"namespace": target.dotted_namespace, "table_name": target.name}
    conn.execute(update(_locations).where(_where_locations(source)).values(**renamed))
    conn.execute(delete(_uuids).where(_named(_uuids, target)))
    conn.execute(update(_uuids).where(_named(_uuids, source)).values(**renamed))
    # Records of places left under the source name (its moves, or a dropped table of that name) follow it as the
    # restriction entries and tags found by that name do (the API renames them too): a claim there is checked
    # against the governance of the name they now carry. The tombstone of a purge still to run stays: its task
    # finds it by name once done (a failed task never is, so its tombstone, kept for good, follows too).
    purge = select(_tasks.c.id).where(
        _tasks.c.warehouse == source.warehouse,
        _tasks.c.namespace == source.dotted_namespace,
        _tasks.c.table_name == source.name,
        _tasks.c.created_ms == _dropped.c.dropped_ms,
        _tasks.c.status.in_((PENDING, RUNNING)),
    )
    conn.execute(update(_dropped).where(_named(_dropped, source), ~purge.exists()).values(**renamed))
    conn.execute(update(_reserved).where(_named(_reserved, source)).values(**renamed))


def _named(table: Table, ref: TableName) -> Any:
    """The rows of ``table`` (tombstones, reservations) recorded under ``ref``'s name."""
    return (
        (table.c.warehouse == ref.warehouse)
        & (table.c.namespace == ref.dotted_namespace)
        & (table.c.table_name == ref.name)
    )


def _where_locations(ref: TableName) -> Any:
    return (
        (_locations.c.warehouse == ref.warehouse)
        & (_locations.c.namespace == ref.dotted_namespace)
        & (_locations.c.table_name == ref.name)
    )


def store_locations(conn: Connection, ref: TableName, locations: tuple[str, ...]) -> None:
    """Record the locations the revision being written or admitted claims (same transaction as its pointer)."""
    conn.execute(delete(_locations).where(_where_locations(ref)))
    conn.execute(
        insert(_locations).values(
            warehouse=ref.warehouse,
            namespace=ref.dotted_namespace,
            table_name=ref.name,
            locations=json.dumps(list(locations)),
        )
    )


def store_table_uuid(
    conn: Connection, ref: TableName, metadata_location: str, table_uuid: str, schemas_digest: str
) -> None:
    """Record the table-uuid and schemas digest of the revision at ``metadata_location`` (same transaction as the
    pointer move)."""
    conn.execute(delete(_uuids).where(_named(_uuids, ref)))
    conn.execute(
        insert(_uuids).values(
            warehouse=ref.warehouse,
            namespace=ref.dotted_namespace,
            table_name=ref.name,
            metadata_location=metadata_location,
            table_uuid=table_uuid,
            schemas_digest=schemas_digest,
        )
    )


def stored_locations(engine: Engine, warehouse: str) -> dict[tuple[tuple[str, ...], str], tuple[str, ...]]:
    """(namespace, name) -> the locations the catalog recorded for it; tables without a record are absent."""
    stmt = select(_locations).where(_locations.c.warehouse == warehouse)
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    return {(tuple(row.namespace.split(".")), row.table_name): tuple(json.loads(row.locations)) for row in rows}


def recorded_locations(conn: Connection, ref: TableName) -> tuple[str, ...] | None:
    """The locations recorded for one table (None: a legacy table, nothing recorded)."""
    row = conn.execute(select(_locations.c.locations).where(_where_locations(ref))).first()
    return tuple(json.loads(row.locations)) if row is not None else None


def record_dropped(conn: Connection, ref: TableName, locations: tuple[str, ...], stamp: int) -> None:
    """Keep the locations of a dropped table (same transaction as the drop, whose time ``stamp`` is)."""
    _insert_locations(conn, _dropped, ref, locations, dropped_ms=stamp)


def _insert_locations(conn: Connection, table: Table, ref: TableName, locations: tuple[str, ...], **row: Any) -> None:
    """One row of ``table`` naming ``ref`` and its ``locations``, with the table's other columns in ``row``."""
    names = {"warehouse": ref.warehouse, "namespace": ref.dotted_namespace, "table_name": ref.name}
    conn.execute(insert(table).values(**names, locations=json.dumps(list(locations)), **row))


def dropped_locations(engine: Engine, warehouse: str) -> list[tuple[tuple[tuple[str, ...], str], tuple[str, ...]]]:
    """((namespace, name), locations) of every dropped table of the warehouse whose files may remain, oldest
    first."""
    stmt = select(_dropped).where(_dropped.c.warehouse == warehouse).order_by(_dropped.c.id)
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    return [((tuple(row.namespace.split(".")), row.table_name), tuple(json.loads(row.locations))) for row in rows]


def record_reserved(
    conn: Connection, ref: TableName, uuid: str | None, locations: tuple[str, ...], until_ms: int
) -> None:
    """Reserve the table's places until ``until_ms``; reservations already over are removed."""
    conn.execute(delete(_reserved).where(_reserved.c.warehouse == ref.warehouse, _reserved.c.until_ms <= now_ms()))
    _insert_locations(conn, _reserved, ref, locations, until_ms=until_ms, table_uuid=uuid)


def settle_staged_reservation(conn: Connection, ref: TableName, uuid: str, until_ms: int) -> bool:
    """Set the reservation of the staged table ``uuid`` to end at ``until_ms`` (the expiry of the credential its
    answer carries); False when it is over already (the place may have been claimed since: nothing to settle)."""
    named = _named(_reserved, ref) & (_reserved.c.table_uuid == uuid) & (_reserved.c.until_ms > now_ms())
    return bool(conn.execute(update(_reserved).where(named).values(until_ms=until_ms)).rowcount)


def record_vended_expiry(conn: Connection, warehouse: str, until_ms: int) -> None:
    """Raise the warehouse's latest vended expiry to ``until_ms`` (a later one recorded already stays)."""
    where = _vended.c.warehouse == warehouse
    if conn.execute(select(_vended.c.until_ms).where(where)).first() is None:
        conn.execute(insert(_vended).values(warehouse=warehouse, until_ms=until_ms))
    else:
        conn.execute(update(_vended).where(where & (_vended.c.until_ms < until_ms)).values(until_ms=until_ms))


def claims_epoch(conn: Connection, warehouse: str) -> int | None:
    """The warehouse's claim counter (None: no row yet, see ``start_claims_epoch``)."""
    return conn.execute(select(_claims.c.epoch).where(_claims.c.warehouse == warehouse)).scalar()


def start_claims_epoch(conn: Connection, warehouse: str) -> None:
    """The warehouse's claim counter, at 0 (raises IntegrityError when another process inserted it meanwhile)."""
    conn.execute(insert(_claims).values(warehouse=warehouse, epoch=0))


def advance_claims_epoch(conn: Connection, warehouse: str, read: int) -> bool:
    """Raise the claim counter past ``read`` (in the claim's transaction); False when another claim moved it on
    since it was read: that claim's record committed after this one's checks read, so they may not reflect it."""
    where = (_claims.c.warehouse == warehouse) & (_claims.c.epoch == read)
    return bool(conn.execute(update(_claims).where(where).values(epoch=read + 1)).rowcount)


def vended_credentials_until(conn: Connection, warehouse: str) -> int | None:
    """The latest expiry of the credentials vended for the warehouse's places (None: none recorded). Read for a
    drop or move with the row locked where the database can (FOR UPDATE), so a vend recording meanwhile waits
    for the drop's commit and then sees the table gone (``WarehouseTables.require_holding``); SQLite's single
    writer orders them anyway."""
    stmt = select(_vended.c.until_ms).where(_vended.c.warehouse == warehouse).with_for_update()
    return conn.execute(stmt).scalar()


@dataclass(frozen=True)
class Reservation:
    """Places reserved for one table until ``until_ms`` (see ``_reserved``): its name, and its UUID if known."""

    namespace: tuple[str, ...]  # as stored
    name: str
    uuid: str | None
    locations: tuple[str, ...]
    until_ms: int


def reserved_locations(engine: Engine, warehouse: str) -> list[Reservation]:
    """The reservations of the warehouse that are not over yet."""
    stmt = select(_reserved).where(_reserved.c.warehouse == warehouse, _reserved.c.until_ms > now_ms())
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    return [
        Reservation(
            tuple(row.namespace.split(".")),
            row.table_name,
            row.table_uuid,
            tuple(json.loads(row.locations)),
            row.until_ms,
        )
        for row in rows
    ]


def _state_values(ref: TableName, state: TrustedState) -> dict[str, Any]:
    return {
        "warehouse": ref.warehouse,
        "namespace": ref.dotted_namespace,
        "table_name": ref.name,
        "metadata_location": state.metadata_location,
        "key_id": state.key_id,
        "digest": state.digest,
        "digest_version": state.digest_version,
    }


def _where_notification(ref: TableName) -> Any:
    return (
        (_notification_times.c.warehouse == ref.warehouse)
        & (_notification_times.c.namespace == ref.dotted_namespace)
        & (_notification_times.c.table_name == ref.name)
    )


def notification_is_newer(conn: Connection, ref: TableName, timestamp_ms: int) -> bool:
    """Whether ``timestamp_ms`` is newer than the last notification accepted for the table (read only)."""
    row = conn.execute(select(_notification_times.c.timestamp_ms).where(_where_notification(ref))).first()
    return row is None or int(row.timestamp_ms) < timestamp_ms


def claim_notification_time(conn: Connection, ref: TableName, timestamp_ms: int) -> bool:
    """Record ``timestamp_ms`` as the table's newest notification; False when it is not newer (stale).

    Called inside the transaction that carries out the notification, so a failed one records nothing."""
    where = _where_notification(ref)
    row = conn.execute(select(_notification_times.c.timestamp_ms).where(where)).first()
    if row is None:
        conn.execute(
            insert(_notification_times).values(
                warehouse=ref.warehouse, namespace=ref.dotted_namespace, table_name=ref.name, timestamp_ms=timestamp_ms
            )
        )
        return True
    result = conn.execute(
        update(_notification_times)
        .where(where & (_notification_times.c.timestamp_ms < timestamp_ms))
        .values(timestamp_ms=timestamp_ms)
    )
    return bool(result.rowcount == 1)


# ----------------------------------------------------------------------------------------------------
# Admission audit events


@dataclass(frozen=True)
class AdmissionEvent:
    """One (re-)admission: who selected which revision, and which trusted revision it displaced."""

    action: str
    actor: str
    table: TableName
    displaced_location: str | None
    displaced_digest: str | None
    new_location: str
    new_digest: str | None
    key_id: str | None


def record_event(conn: Connection, event: AdmissionEvent) -> None:
    conn.execute(
        insert(_events).values(
            at_ms=now_ms(),
            warehouse=event.table.warehouse,
            namespace=event.table.dotted_namespace,
            table_name=event.table.name,
            action=event.action,
            actor=event.actor,
            displaced_location=event.displaced_location,
            displaced_digest=event.displaced_digest,
            new_location=event.new_location,
            new_digest=event.new_digest,
            key_id=event.key_id,
        )
    )


def list_events(engine: Engine, warehouse: str | None = None) -> list[dict[str, Any]]:
    return _rows_in_order(engine, _events, warehouse)


def _rows_in_order(engine: Engine, table: Table, warehouse: str | None) -> list[dict[str, Any]]:
    """Every row of an id-keyed log table (events, tasks) in insertion order, optionally of one warehouse."""
    stmt = select(table).order_by(table.c.id)
    if warehouse is not None:
        stmt = stmt.where(table.c.warehouse == warehouse)
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(stmt)]


# ----------------------------------------------------------------------------------------------------
# Cleanup tasks

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"


@dataclass(frozen=True)
class CleanupTask:
    id: int
    table: TableName
    metadata_location: str
    trusted: TrustedState | None  # a copy of the dropped table's trusted state; None for a legacy table
    status: str
    detail: str | None


def insert_task(conn: Connection, table: TableName, location: str, trusted: TrustedState | None, stamp: int) -> int:
    result = conn.execute(
        insert(_tasks).values(
            created_ms=stamp,
            updated_ms=stamp,
            warehouse=table.warehouse,
            namespace=table.dotted_namespace,
            table_name=table.name,
            metadata_location=location,
            protected=int(trusted is not None),
            key_id=trusted.key_id if trusted else None,
            digest=trusted.digest if trusted else None,
            digest_version=trusted.digest_version if trusted else None,
            status=PENDING,
        )
    )
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def _row_to_task(row: Any) -> CleanupTask:
    table = TableName(row.warehouse, tuple(row.namespace.split(".")), row.table_name)
    trusted = TrustedState(row.metadata_location, row.key_id, row.digest, row.digest_version) if row.protected else None
    return CleanupTask(row.id, table, row.metadata_location, trusted, row.status, row.detail)


def pending_tasks(engine: Engine, warehouse: str, persisted_before_ms: int | None = None) -> list[CleanupTask]:
    """Pending tasks of one warehouse; with ``persisted_before_ms`` only those persisted before that instant."""
    stmt = select(_tasks).where((_tasks.c.warehouse == warehouse) & (_tasks.c.status == PENDING))
    if persisted_before_ms is not None:
        stmt = stmt.where(_tasks.c.created_ms <= persisted_before_ms)
    with engine.connect() as conn:
        return [_row_to_task(row) for row in conn.execute(stmt.order_by(_tasks.c.id))]


def claim_task(engine: Engine, task_id: int) -> bool:
    """Move a task from pending to running; False when another runner (server thread or CLI) claimed it first."""
    with engine.begin() as conn:
        result = conn.execute(
            update(_tasks)
            .where((_tasks.c.id == task_id) & (_tasks.c.status == PENDING))
            .values(status=RUNNING, updated_ms=now_ms())
        )
    return bool(result.rowcount == 1)


def finish_task(engine: Engine, task_id: int, status: str, detail: str) -> None:
    with engine.begin() as conn:
        conn.execute(update(_tasks).where(_tasks.c.id == task_id).values(status=status, detail=detail))
        conn.execute(update(_tasks).where(_tasks.c.id == task_id).values(updated_ms=now_ms()))
        if status == DONE:
            _forget_purged_tombstone(conn, task_id)


def _task_tombstone(task: Any) -> Any:
    """The tombstone the task's drop wrote (same table, same instant: one transaction wrote both)."""
    return (
        (_dropped.c.warehouse == task.warehouse)
        & (_dropped.c.namespace == task.namespace)
        & (_dropped.c.table_name == task.table_name)
        & (_dropped.c.dropped_ms == task.created_ms)
    )


def _forget_purged_tombstone(conn: Connection, task_id: int) -> None:
    """The files of the task's table are deleted: its drop's tombstone no longer guards anything."""
    task = conn.execute(select(_tasks).where(_tasks.c.id == task_id)).first()
    if task is None:
        return
    conn.execute(delete(_dropped).where(_task_tombstone(task)))


def task_locations(engine: Engine, task_id: int) -> tuple[str, ...] | None:
    """The locations the catalog recorded for the task's table when it was dropped (its tombstone); None for a
    task older than tombstones. A purge stays inside them whatever the metadata file says: a protected plaintext
    table's file has no digest, so storage could point it at another table's location."""
    with engine.connect() as conn:
        task = conn.execute(select(_tasks).where(_tasks.c.id == task_id)).first()
        if task is None:
            return None
        row = conn.execute(select(_dropped.c.locations).where(_task_tombstone(task))).first()
    return tuple(json.loads(row.locations)) if row is not None else None


def list_tasks(engine: Engine, warehouse: str | None = None) -> list[dict[str, Any]]:
    return _rows_in_order(engine, _tasks, warehouse)
