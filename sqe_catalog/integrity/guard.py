"""The one object ``WarehouseTables`` calls for everything integrity-related (kept out of ``tables.py``).

It owns the decision "legacy or protected" for each table operation and hands protected tables to
``admission`` and purges to ``purge``; a legacy table keeps pyiceberg's behaviour everywhere.

Read routes keep what they verified: a revision that passed ``verify_loaded`` on a load-table, credentials or
plan request is cached per table with its metadata location, the exact pin (key id, digest, digest version) it
was checked against and the stored file's fingerprint taken before the read (``integrity.fingerprint``: one HEAD
or a local file's hash). A later load uses it only while all three still match: the pin is re-read from the
database and (by default) the fingerprint taken again on every load, so after a commit, a re-admission, a drop
or a rewrite of the file in storage the load reads and verifies the file again, and a rewrite is refused by the
very next load exactly as without the cache. ``metadata_recheck_seconds`` > 0 skips the fingerprint while the
last one matched less than that long ago: a rewrite is then refused at most that much later (never served: the
cache holds the verified revision). Writes (and the revision they return), purges and the cleaner's second
check always read storage. ``metadata_cache_entries = 0`` keeps nothing.

Load-table does not wait for that fingerprint before its other work (``load_pending``): with a verified revision
for the current pointer and pin in hand, the HEAD is sent on a small pool while the request resolves the user's
restrictions, and the ETag and answer wait for it (``PendingRead.confirmed``): nothing is sent before it.
Nothing about the guarantee moves: the fingerprint is still taken on every load (same recheck rule), after the
pointer and pin were read for this request and before any re-read of the file; a mismatch or no fingerprint
still reads and verifies the file (a rewrite is refused by this very load, 422); and the revision the work ran
on is exactly the one that is answered, or the work is redone on the re-verified one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableRequirement, TableUpdate
from sqlalchemy import Connection, delete, select, update
from sqlalchemy.exc import IntegrityError

from sqe._lru import LRUCache
from sqe_catalog.errors import (
    BadRequestError,
    ClaimRaced,
    CommitFailedError,
    MetadataIntegrityError,
    NoSuchTableError,
    ServiceUnavailableError,
)
from sqe_catalog.integrity import admission
from sqe_catalog.integrity import state as st
from sqe_catalog.integrity.admission import Admission
from sqe_catalog.integrity.canonical import ParsedMetadata, model_document
from sqe_catalog.integrity.fingerprint import Fingerprint
from sqe_catalog.integrity.lineage import check_snapshot_lineage, with_next_row_id
from sqe_catalog.integrity.purge import DeleteFiles, run_pending_tasks
from sqe_catalog.integrity.state import Protection, TableName, TrustedState

__all__ = ["ClaimRaced", "IntegrityGuard", "PendingRead"]

log = logging.getLogger("sqe_catalog.integrity")

Namespace = tuple[str, ...]
Requirements = tuple[TableRequirement, ...]
Updates = tuple[TableUpdate, ...]
Written = tuple[str, ParsedMetadata]  # (new metadata location, the revision written there)
# (base, new; base None: a new table): raises to refuse a commit or an admission before its write
Judge = Callable[[TableMetadata | None, TableMetadata], None]
ReadParsed = Callable[..., ParsedMetadata]  # (location, fresh=False) -> ParsedMetadata, errors translated
LocationsOf = Callable[[TableMetadata], tuple[str, ...]]  # the locations a revision claims
# A legacy table's locations from (its (namespace, name), its metadata location).
LegacyLocations = Callable[[tuple[Namespace, str], str], tuple[str, ...]]
# Records a notification's timestamp inside the transaction that carries it out (raises when it is stale).
NotificationStamp = Callable[[Connection], None]


@dataclasses.dataclass
class _ClaimSection:
    """The claim section running in this thread: its warehouse, and the claim counter its checks go with."""

    warehouse: str
    epoch: int


# How often a drop reads the table again when commits keep moving its pointer between its read and its delete.
_DROP_ATTEMPTS = 5

_claim_section: ContextVar[_ClaimSection | None] = ContextVar("claim_section", default=None)


@dataclasses.dataclass(frozen=True)
class VerifiedRevision:
    """The revision a read route last verified for one table: where it was read and the pin it matched."""

    location: str
    trusted: TrustedState
    fingerprint: str  # of the stored file, taken before it was read (see integrity.fingerprint)
    parsed: ParsedMetadata
    checked_at: float  # monotonic time of the last fingerprint that matched


class PendingRead:
    """A read route's revision whose storage fingerprint may still be in flight.

    ``candidate`` is the verified revision the route may prepare its answer from; ``confirmed()`` waits for the
    fingerprint and returns the revision to answer with: ``candidate`` itself when the stored file is unchanged,
    otherwise the file read and verified again (or a ``MetadataIntegrityError``). Nothing may be sent before it."""

    def __init__(self, candidate: ParsedMetadata, confirm: Callable[[], ParsedMetadata] | None = None) -> None:
        self.candidate = candidate
        self._confirm = confirm

    def confirmed(self) -> ParsedMetadata:
        return self.candidate if self._confirm is None else self._confirm()


# Fingerprints in flight for load_pending: a HEAD each, waited for by the request that started it. As many as
# the server's request threads, so concurrent loads never queue behind one another's HEADs (threads start lazily).
_FINGERPRINT_THREADS = 40
_fingerprint_pool: ThreadPoolExecutor | None = None
_fingerprint_pool_lock = threading.Lock()


def _fingerprints() -> ThreadPoolExecutor:
    global _fingerprint_pool
    with _fingerprint_pool_lock:
        if _fingerprint_pool is None:
            _fingerprint_pool = ThreadPoolExecutor(_FINGERPRINT_THREADS, thread_name_prefix="sqe-catalog-fingerprint")
        return _fingerprint_pool


class IntegrityGuard:
    def __init__(
        self,
        catalog: SqlCatalog,
        read: ReadParsed,
        locations_of: LocationsOf,
        verified_entries: int = 0,
        fingerprint: Fingerprint | None = None,
        recheck_seconds: float = 0.0,
        legacy_locations: LegacyLocations | None = None,
        *,
        credential_lifetime_ms: int,
    ) -> None:
        self._catalog = catalog
        self._credential_lifetime_ms = credential_lifetime_ms  # what STS is asked for
        self._read = read
        self._locations_of = locations_of
        self._legacy_locations = legacy_locations or (lambda _table, location: locations_of(read(location).metadata))
        self._fingerprint = fingerprint or _no_fingerprint
        # 0: every load takes the fingerprint again; more: a revision confirmed this recently is used without it.
        self._recheck_seconds = recheck_seconds
        # 0 entries: every load of a protected table reads and verifies its metadata file again.
        # One entry per table (its newest verified revision), so old revisions never pile up in memory.
        self.verified: LRUCache[TableName, VerifiedRevision] = LRUCache(verified_entries)
        st.create_integrity_schema(catalog.engine)

    def _also(
        self, table: TableName, stamp: NotificationStamp | None = None, left: tuple[str, ...] = ()
    ) -> admission.AlsoInTransaction:
        """What every pointer move of a protected table records in its own transaction."""
        legacy = self._also_legacy(table, stamp, left)

        def also(conn: Connection, location: str, metadata: TableMetadata) -> None:
            st.store_locations(conn, table, self._locations_of(metadata))
            st.store_table_uuid(conn, table, location, str(metadata.table_uuid), schemas_digest(metadata))
            legacy(conn)

        return also

    def _also_legacy(
        self, table: TableName, stamp: NotificationStamp | None, left: tuple[str, ...]
    ) -> Callable[[Connection], None]:
        """What a pointer move of any table records in its own transaction: the places it leaves (``left``) and
        a notification's timestamp."""

        def also(conn: Connection) -> None:
            self.fence(conn)
            self._keep_left_places(conn, table, left)
            if stamp is not None:
                stamp(conn)

        return also

    def _keep_left_places(self, conn: Connection, table: TableName, left: tuple[str, ...]) -> None:
        """Keep the places a pointer move leaves as a tombstone, reserved as a drop's are: the table's snapshots
        still name the files there. In the move's transaction, so neither is ever kept without the other. Only a
        purge's own tombstone goes with its task, so this one stays."""
        if not left:
            return
        moved_ms = st.now_ms()
        st.record_dropped(conn, table, left, moved_ms)
        # No UUID needed: the table still holds its name, and no other can hold its UUID while it exists.
        st.record_reserved(conn, table, None, left, self._vended_until(conn, moved_ms))

    def _vended_until(self, conn: Connection, at_ms: int) -> int:
        """Until when credentials vended for the warehouse's places before ``at_ms`` may be valid: the latest
        expiry STS answered for any of them; with none recorded, ``at_ms`` plus the lifetime the catalog asks for."""
        recorded = st.vended_credentials_until(conn, self._catalog.name)
        return at_ms + self._credential_lifetime_ms if recorded is None else recorded

    def record_vended_expiry(self, until_ms: int) -> None:
        """Record a vended credential's expiry (before it is handed out): reservations last until then."""
        self._record_expiry(lambda conn: st.record_vended_expiry(conn, self._catalog.name, until_ms))

    def cover_unrecorded_credentials(self) -> None:
        """At a serving process's start, with tables in the warehouse: raise the recorded expiry to the lifetime
        asked for from now. A process of an earlier version, which records nothing, may have vended credentials
        for them until just now (a rolling upgrade stops it, then starts this one), valid at most that long; an
        expiry recorded already tells nothing about those."""
        self._record_expiry(self._cover_unrecorded)

    def _cover_unrecorded(self, conn: Connection) -> None:
        if conn.execute(select(IcebergTables.table_name).where(self._in_warehouse()).limit(1)).first():
            st.record_vended_expiry(conn, self._catalog.name, st.now_ms() + self._credential_lifetime_ms)

    def _record_expiry(self, write: Callable[[Connection], None]) -> None:
        """Run ``write`` in a transaction; once more when another process recorded the warehouse's first expiry
        meanwhile (the insert's unique key refused): the second run finds that one and raises or keeps it."""
        for attempt in range(2):
            try:
                with self._catalog.engine.begin() as conn:
                    write(conn)
                return
            except IntegrityError:
                if attempt:
                    raise

    def stored_locations(self) -> dict[tuple[Namespace, str], tuple[str, ...]]:
        """The locations the catalog recorded for its protected tables (legacy tables have none)."""
        return st.stored_locations(self._catalog.engine, self._catalog.name)

    def dropped_locations(self) -> list[tuple[tuple[Namespace, str], tuple[str, ...]]]:
        """The locations of dropped tables whose files may still be in storage (no purge, or one not done yet)."""
        return st.dropped_locations(self._catalog.engine, self._catalog.name)

    def reserved_locations(self) -> list[st.Reservation]:
        """Places whose vended credentials may still be valid in the hands of another table's readers."""
        return st.reserved_locations(self._catalog.engine, self._catalog.name)

    def reserve(
        self, namespace: Namespace, name: str, uuid: str | None, locations: tuple[str, ...], until_ms: int
    ) -> None:
        with self._catalog.engine.begin() as conn:
            st.record_reserved(conn, self.ref(namespace, name), uuid, locations, until_ms)
            self.fence(conn)

    # -- claims across processes ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def claiming(self) -> Iterator[None]:
        """A claim section: the checks of the places claimed, then the transaction recording the claim, which
        ``fence`` rolls back (``ClaimRaced``) when another claim committed after the section began, in this
        process or another on the database. So the section holds across processes without holding a database
        lock while it reads metadata files and writes a new one (SQLite would stop every other writer meanwhile)."""
        token = _claim_section.set(_ClaimSection(self._catalog.name, self._claims_epoch()))
        try:
            yield
        finally:
            _claim_section.reset(token)

    def fence(self, conn: Connection) -> None:
        """In the transaction recording a claim (none outside a claim section): raise ``ClaimRaced`` when another
        claim committed since this section's checks began, so the transaction rolls back."""
        section = _claim_section.get()
        if section is None or section.warehouse != self._catalog.name:
            return
        if not st.advance_claims_epoch(conn, section.warehouse, section.epoch):
            raise ClaimRaced(f"places of warehouse {section.warehouse} were claimed concurrently; retry")
        section.epoch += 1  # a second record in the same section goes with this one's checks

    def _claims_epoch(self) -> int:
        """The warehouse's claim counter, read before a section's checks (its row inserted on first use)."""
        for _attempt in range(2):
            with self._catalog.engine.connect() as conn:
                epoch = st.claims_epoch(conn, self._catalog.name)
            if epoch is not None:
                return epoch
            with contextlib.suppress(IntegrityError), self._catalog.engine.begin() as conn:
                st.start_claims_epoch(conn, self._catalog.name)  # another process may have inserted it meanwhile
        raise ServiceUnavailableError(f"the claim counter of warehouse {self._catalog.name} cannot be read")

    def settle_staged(self, namespace: Namespace, name: str, uuid: str, until_ms: int) -> None:
        """End the staged table's reservation when the credential its answer carries expires (STS answered that
        expiry after the reservation was made). Raises ServiceUnavailableError when the reservation is over
        already: the place may have been claimed since, so the credential must not be handed out."""
        with self._catalog.engine.begin() as conn:
            if not st.settle_staged_reservation(conn, self.ref(namespace, name), uuid, until_ms):
                raise ServiceUnavailableError(
                    f"the place staged for table {'.'.join((*namespace, name))} is no longer reserved: stage it again"
                )

    def ref(self, namespace: Namespace, name: str) -> TableName:
        return TableName(self._catalog.name, tuple(namespace), name)

    def trusted(self, namespace: Namespace, name: str) -> TrustedState | None:
        with self._catalog.engine.connect() as conn:
            return st.load_state(conn, self.ref(namespace, name))

    def is_protected(self, namespace: Namespace, name: str) -> bool:
        return self.trusted(namespace, name) is not None

    def protection(self, namespace: Namespace, name: str) -> Protection:
        trusted = self.trusted(namespace, name)
        return Protection.LEGACY if trusted is None else trusted.protection

    @staticmethod
    def create_properties(schema: Schema, properties: dict[str, str]) -> dict[str, str]:
        # A fresh dict: pyiceberg pops format-version from the dict it gets.
        return dict(admission.format_version_for(schema, dict(properties)))

    # -- reads ---------------------------------------------------------------------------------------------

    def current(self, namespace: Namespace, name: str) -> tuple[str | None, TrustedState | None]:
        """The table's metadata location (None: no such table) and pin (None: legacy), from one query."""
        with self._catalog.engine.connect() as conn:
            return st.pointer_and_state(conn, self.ref(namespace, name))

    def load(
        self,
        namespace: Namespace,
        name: str,
        location: str,
        trusted: TrustedState | None,
        reuse_verified: bool = False,
    ) -> ParsedMetadata:
        """The metadata at ``location`` (from ``current``); for a protected table read from storage and verified
        against ``trusted`` before it is returned.

        ``reuse_verified`` (the read routes: load-table, credentials, plan) may answer with the revision an
        earlier such load verified against the same pointer and pin; it never caches a revision that was not
        verified, and a load without it (writes, purges) always reads storage and so detects a rewritten file.
        """
        if trusted is None:
            return self._read(location)
        if not reuse_verified:
            return self._verified(self.ref(namespace, name), trusted, location)
        return self._reusing(namespace, name, location, trusted, in_background=False).confirmed()

    def load_pending(self, namespace: Namespace, name: str, location: str, trusted: TrustedState | None) -> PendingRead:
        """``load(..., reuse_verified=True)`` whose fingerprint runs while the caller prepares its answer from
        ``PendingRead.candidate``; the caller answers only with ``PendingRead.confirmed()``."""
        if trusted is None:
            return PendingRead(self._read(location))
        return self._reusing(namespace, name, location, trusted, in_background=True)

    def _reusing(
        self, namespace: Namespace, name: str, location: str, trusted: TrustedState, *, in_background: bool
    ) -> PendingRead:
        table = self.ref(namespace, name)
        hit = self.verified.get(table)
        if hit is not None and (hit.location, hit.trusted) != (location, trusted):
            hit = None  # another revision or pin: never this entry
        now = time.monotonic()
        if hit is not None and now - hit.checked_at < self._recheck_seconds:
            return PendingRead(hit.parsed)  # verified, and its stored file confirmed unchanged recently enough
        if hit is None or not self.verified.bound:
            return PendingRead(self._checked(table, trusted, location, now, None, self._take_fingerprint(location)))
        if not in_background:
            return PendingRead(self._checked(table, trusted, location, now, hit, self._take_fingerprint(location)))
        # Taken before any read: a rewrite after it changes the fingerprint, so it is caught by the next check.
        future = _fingerprints().submit(self._fingerprint, location)
        revision = hit
        return PendingRead(
            revision.parsed, lambda: self._checked(table, trusted, location, now, revision, future.result())
        )

    def _take_fingerprint(self, location: str) -> str | None:
        return self._fingerprint(location) if self.verified.bound else None

    def _checked(
        self,
        table: TableName,
        trusted: TrustedState,
        location: str,
        now: float,
        hit: VerifiedRevision | None,
        fingerprint: str | None,
    ) -> ParsedMetadata:
        """The revision to answer with, given a fingerprint taken (before any read) for this load."""
        if hit is not None and fingerprint is not None and fingerprint == hit.fingerprint:
            self.verified.put(table, dataclasses.replace(hit, checked_at=now))
            return hit.parsed  # verify_loaded passed for these inputs and the stored file is the same
        parsed = self._verified(table, trusted, location)
        if fingerprint is not None:
            self.verified.put(table, VerifiedRevision(location, trusted, fingerprint, parsed, now))
        return parsed

    def _verified(self, table: TableName, trusted: TrustedState, location: str) -> ParsedMetadata:
        try:
            try:
                parsed = self._read(location, fresh=True)  # a cache would hide a rewritten file from the check
            except BadRequestError as exc:
                raise MetadataIntegrityError(f"table {table}: {exc.message}") from None
            admission.verify_loaded(table, trusted, location, parsed)
            self._check_recorded_locations(table, trusted, parsed.metadata)
            self._check_recorded_identity(table, trusted, parsed.metadata)
        except MetadataIntegrityError as exc:
            log.error("integrity check failed: %s", exc.message)
            raise
        return parsed

    def _check_recorded_locations(self, table: TableName, trusted: TrustedState, metadata: TableMetadata) -> None:
        """The file must name the places the catalog recorded when it wrote or admitted it: a plaintext table's
        has no digest, and credentials are vended, purges bounded and commits built on these places."""
        if trusted.locations is None:
            return  # recorded before the catalog kept them: nothing to compare with
        if set(self._locations_of(metadata)) != set(trusted.locations):
            raise MetadataIntegrityError(
                f"table {table}: the metadata's locations do not match the ones the catalog recorded for it"
            )

    @staticmethod
    def _check_recorded_identity(table: TableName, trusted: TrustedState, metadata: TableMetadata) -> None:
        """The file must name the table-uuid and hold the schemas the catalog recorded with its pointer: column tags
        (and so masks) match a table by its UUID, row filters and masks bind its columns by name, and a plaintext
        table's file has no digest that would catch another UUID or renamed columns (recorded before the catalog
        kept them: nothing to compare with)."""
        if trusted.table_uuid is not None and str(metadata.table_uuid) != trusted.table_uuid:
            raise MetadataIntegrityError(
                f"table {table}: the metadata names another table-uuid than the catalog recorded for it"
            )
        if trusted.schemas_digest is not None and schemas_digest(metadata) != trusted.schemas_digest:
            raise MetadataIntegrityError(
                f"table {table}: the metadata holds other schemas than the catalog recorded for it"
            )

    # -- writes --------------------------------------------------------------------------------------------

    def create(self, namespace: Namespace, name: str, metadata: TableMetadata) -> Written:
        table = self.ref(namespace, name)
        return admission.write_new_table(self._catalog, table, with_next_row_id(metadata), self._also(table))

    def staged_create(
        self, namespace: Namespace, name: str, requirements: Requirements, updates: Updates
    ) -> TableMetadata:
        """The first revision a create transaction's commit makes, written nowhere (what its gate judges)."""
        staged = self._catalog._update_and_stage_table(None, (*namespace, name), requirements, updates)
        check_snapshot_lineage(staged.metadata.format_version, updates)
        return with_next_row_id(staged.metadata)

    def commit_create(self, namespace: Namespace, name: str, requirements: Requirements, updates: Updates) -> Written:
        """A create transaction's commit: the new table starts protected."""
        metadata = self.staged_create(namespace, name, requirements, updates)
        table = self.ref(namespace, name)
        return admission.write_new_table(self._catalog, table, metadata, self._also(table))

    def commit(
        self,
        namespace: Namespace,
        name: str,
        requirements: Requirements,
        updates: Updates,
        left: tuple[str, ...] = (),
        judge: Judge | None = None,
    ) -> Written:
        """Commit to a table, legacy or protected as the pin read with its pointer says. A protected table's base
        is verified, the pin checked, and pointer + pin swapped together; a legacy table's swap is refused (409)
        if a pin appeared meanwhile (the table dropped and admitted again), so no pointer moves without its pin.
        ``left``: the places the commit moves the table away from, kept in the swap's transaction. ``judge``
        sees (base, new metadata) of a commit that changes something, before anything is written, and may refuse
        it by raising: it judges the base the swap compares against (a commit in between fails the swap, 409)."""
        table = self.ref(namespace, name)
        location, trusted = self.current(namespace, name)
        if location is None:
            raise NoSuchTableError(f"table does not exist: {table}")
        if trusted is None:
            return self._commit_legacy(table, location, requirements, updates, left, judge)
        base = self._verified(table, trusted, trusted.metadata_location)
        # A v3 revision written before the catalog completed next-row-id gets it here, so adding a snapshot
        # advances it (pyiceberg's update keeps an unset one unset).
        lineage_base = with_next_row_id(base.metadata)
        current = Table(
            (*namespace, name),
            lineage_base,
            trusted.metadata_location,
            admission.catalog_io(self._catalog),
            self._catalog,
        )
        staged = self._catalog._update_and_stage_table(current, (*namespace, name), requirements, updates)
        check_snapshot_lineage(staged.metadata.format_version, updates)
        metadata = with_next_row_id(staged.metadata)  # an upgrade to v3 starts row ids at 0
        if metadata == lineage_base:
            return trusted.metadata_location, base  # nothing changed: no new revision
        if judge is not None:
            judge(base.metadata, metadata)
        return admission.commit_revision(self._catalog, table, trusted, base, metadata, self._also(table, left=left))

    def _commit_legacy(
        self,
        table: TableName,
        location: str,
        requirements: Requirements,
        updates: Updates,
        left: tuple[str, ...],
        judge: Judge | None,
    ) -> Written:
        """pyiceberg's commit of a legacy table (no verification, no pin), its swap refusing a pin."""
        identifier = (*table.namespace, table.name)
        base = self._read(location)
        current = Table(identifier, base.metadata, location, admission.catalog_io(self._catalog), self._catalog)
        staged = self._catalog._update_and_stage_table(current, identifier, requirements, updates)
        if staged.metadata == base.metadata:
            return location, base  # nothing changed: no new revision
        if judge is not None:
            judge(base.metadata, staged.metadata)
        self._catalog._write_metadata(staged.metadata, staged.io, staged.metadata_location)
        also = self._also_legacy(table, None, left)
        with admission.removed_if_raced(admission.catalog_io(self._catalog), staged.metadata_location):
            admission.replace_legacy_pointer(self._catalog, table, location, staged.metadata_location, also)
        return staged.metadata_location, ParsedMetadata(staged.metadata, model_document(staged.metadata))

    def admit(
        self, namespace: Namespace, name: str, admitted: Admission, stamp: NotificationStamp | None = None
    ) -> None:
        table = self.ref(namespace, name)
        admission.admit_new(self._catalog, table, admitted, self._also(table, stamp))

    def readmit(
        self,
        namespace: Namespace,
        name: str,
        displaced: tuple[str, TrustedState | None],
        admitted: Admission,
        stamp: NotificationStamp | None = None,
        left: tuple[str, ...] = (),
    ) -> None:
        """Register overwrite / notification update (``stamp`` given): re-admission if protected, a plain pointer
        move if legacy. ``displaced``: the pointer and pin (from ``current``) the caller checked the admission
        against; the swap compares against exactly those (409 if the table moved on meanwhile). ``left``: the
        places the new revision moves the table away from, kept in the swap's transaction."""
        table = self.ref(namespace, name)
        current, trusted = displaced
        if trusted is None:
            also = self._also_legacy(table, stamp, left)
            admission.replace_legacy_pointer(self._catalog, table, current, admitted.location, also)
            return
        if stamp is not None:
            # Checked again on the pin the swap compares against: the name may hold another table by now.
            _refuse_notification_update(table, trusted.protection)
        admission.readmit(self._catalog, table, trusted, admitted, self._also(table, stamp, left))

    def notification_stamp(self, namespace: Namespace, name: str, timestamp_ms: int) -> NotificationStamp:
        """Refuse a stale notification now (409 before anything is read); the returned stamp records its
        timestamp inside the transaction that carries it out, so a failed notification uses up nothing."""
        table = self.ref(namespace, name)
        with self._catalog.engine.connect() as conn:
            if not st.notification_is_newer(conn, table, timestamp_ms):
                raise _stale(table)

        def stamp(conn: Connection) -> None:
            if not st.claim_notification_time(conn, table, timestamp_ms):
                raise _stale(table)  # a concurrent notification won: this one rolls back

        return stamp

    def require_notification_update(self, namespace: Namespace, name: str) -> None:
        """A notification carries no authenticated expected digest: it cannot replace an encrypted table's (checked
        here before anything is read, and again by ``readmit``)."""
        _refuse_notification_update(self.ref(namespace, name), self.protection(namespace, name))

    def drop(
        self,
        namespace: Namespace,
        name: str,
        purge_location: str | None,
        uuid: str | None,
        stamp: NotificationStamp | None = None,
    ) -> int | None:
        """Drop row and pin, keep the table's locations as a tombstone and, for a purge, persist a cleanup task
        (whose success removes the tombstone), in one transaction; returns the task id. The locations are also
        reserved, for the table's UUID if known (``uuid``), until the credentials vended before the drop expire.

        The files are deleted later, by the background cleaner or ``admin run-cleanup``, after a second check."""
        table = self.ref(namespace, name)
        for _attempt in range(_DROP_ATTEMPTS):
            with self._catalog.engine.begin() as conn:
                found = conn.execute(select(IcebergTables.metadata_location).where(self._row(table))).first()
                if found is None:
                    raise NoSuchTableError(f"table does not exist: {table.dotted_namespace}.{table.name}")
                if purge_location is not None and found[0] != purge_location:
                    # The purge verified (and its task will delete) that revision: a commit since would be lost.
                    raise CommitFailedError(f"table {table} was changed concurrently")
                pointer: str | None = found[0]
                trusted = st.load_state(conn, table)
                kept = self._claimed_locations(conn, table, pointer)  # a purge's files remain until its task is done
                # Removed only at the revision its places were read with (the reads may run outside the write
                # transaction): a commit that moved the table meanwhile recorded others, which must be kept.
                at_pointer = self._row(table) & (IcebergTables.metadata_location == pointer)
                if pointer is None:  # a row without a pointer (never written by the catalog) holds no file
                    at_pointer = self._row(table) & IcebergTables.metadata_location.is_(None)
                if conn.execute(delete(IcebergTables).where(at_pointer)).rowcount == 1:
                    return self._record_drop(conn, table, trusted, kept, purge_location, uuid, stamp)
            # A commit (or a drop) went first: read the table again.
        raise CommitFailedError(f"table {table} was changed concurrently; retry")

    def _record_drop(
        self,
        conn: Connection,
        table: TableName,
        trusted: TrustedState | None,
        kept: tuple[str, ...],
        purge_location: str | None,
        uuid: str | None,
        stamp: NotificationStamp | None,
    ) -> int | None:
        """In the drop's transaction, after its row went: pin, tombstone, reservation, purge task, timestamp."""
        st.delete_state(conn, table)
        dropped_ms = st.now_ms()
        if kept:
            st.record_dropped(conn, table, kept, dropped_ms)
            st.record_reserved(conn, table, uuid, kept, self._vended_until(conn, dropped_ms))
        task_id = st.insert_task(conn, table, purge_location, trusted, dropped_ms) if purge_location else None
        if stamp is not None:
            stamp(conn)
        return task_id

    def _claimed_locations(self, conn: Connection, table: TableName, pointer: str | None) -> tuple[str, ...]:
        """The locations the table at ``pointer`` claims: recorded, or a legacy table's from its metadata file."""
        if (recorded := st.recorded_locations(conn, table)) is not None:
            return recorded
        return self._legacy_locations((table.namespace, table.name), pointer) if pointer else ()

    def run_pending_cleanup(self, delete_files: DeleteFiles, persisted_before_ms: int | None = None) -> dict[int, str]:
        return run_pending_tasks(
            self._catalog.engine,
            admission.catalog_io(self._catalog),
            self._catalog.name,
            delete_files,
            persisted_before_ms,
        )

    def rename(self, source: tuple[Namespace, str], target: tuple[Namespace, str]) -> None:
        src, dst = self.ref(*source), self.ref(*target)
        with self._catalog.engine.begin() as conn:
            result = conn.execute(
                update(IcebergTables)
                .where(self._row(src))
                .values(table_namespace=dst.dotted_namespace, table_name=dst.name)
            )
            if result.rowcount != 1:
                raise NoSuchTableError(f"table does not exist: {src.dotted_namespace}.{src.name}")
            st.rename_state(conn, src, dst)

    def _in_warehouse(self) -> Any:
        return IcebergTables.catalog_name == self._catalog.name

    def _row(self, table: TableName) -> Any:
        return (
            self._in_warehouse()
            & (IcebergTables.table_namespace == table.dotted_namespace)
            & (IcebergTables.table_name == table.name)
        )


def _refuse_notification_update(table: TableName, protection: Protection) -> None:
    if protection is Protection.ENCRYPTED:
        raise MetadataIntegrityError(
            f"table {table} is a protected encrypted table: a notification cannot replace its trusted metadata digest"
        )


def schemas_digest(metadata: TableMetadata) -> str:
    """SHA-256 of a revision's schemas (by id) and current schema id: what read-restrictions bind to. Each field in
    its printed form (id, name, required, type with every nested field's), not pyiceberg's model dump, whose keys a
    pyiceberg release may add to: a digest recorded before an upgrade must still match the same schemas after it."""
    schemas = [
        [schema.schema_id, [str(field) for field in schema.fields]]
        for schema in sorted(metadata.schemas, key=lambda s: s.schema_id)
    ]
    text = json.dumps([metadata.current_schema_id, schemas], separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _no_fingerprint(_location: str) -> str | None:
    return None


def _stale(table: TableName) -> CommitFailedError:
    return CommitFailedError(f"stale notification for table {table}: timestamp is not newer")
