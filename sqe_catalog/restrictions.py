"""Read-restrictions attached to tables for a principal or a group, served in loadTable (Iceberg REST).

An administrator attaches a raw ``read-restrictions`` object (the REST spec's wire shape) to one table for one
principal or one group (``sqe-catalog admin set-restrictions``). It is validated on save with the engine's own
parser (``sqe.restrictions.parse_restrictions``) against the table's current schema and history, so the catalog
and SQE agree on what is valid.

Which entries apply, and how several combine (fail closed)
    The caller's own principal entry plus the entries of every group it belongs to, and (with
    ``[server] read_restriction_policies = true``) every enabled tag-based policy selected for the table. All of
    them go through one pipeline (``sqe_catalog.policies.resolve``): the same binding, canonicalization,
    signatures and deduplication. Equal restrictions collapse (provenance kept); two *distinct* row filters for
    one caller conflict (they used to be AND-ed: a conflict is now the rule of the Gravitino design), and so do
    two distinct masks of one column. ``set-restrictions`` refuses an entry that conflicts for any principal it
    applies to now; a conflict that arises later (membership changed, a policy was enabled) refuses that
    caller's loads with 403, a stable code and a request id, until an administrator resolves it. No entry ever
    loosens another.

Entries are keyed by the table's UUID and also matched by its current name, so a rename keeps them and a table
re-created under the old name is still restricted (it then has to fit the stored entries, or loads are refused).

Delivery (the Gravitino "tag-based read restrictions" design, "Delivery" and "Trust and failure behavior")
    ====================  ==========================  =======================  ==============================
    restriction applies   ``read-restrictions.v1``    via a trusted reader     answer
    ====================  ==========================  =======================  ==============================
    no                    any                         any                      normal response
    yes                   not declared / malformed    any                      406, no metadata
    yes                   declared                    no                       403, no metadata
    yes                   declared                    yes                      200 with ``read-restrictions``
    ====================  ==========================  =======================  ==============================

    The capability header is ``X-Gravitino-Client-Capabilities``: comma-separated lowercase tokens
    (``[a-z0-9][a-z0-9.-]*``), optional whitespace around each, unknown tokens ignored; one malformed token
    makes the whole header declare nothing. The header is not authorization (anyone can copy it). "Via a
    trusted reader" means a delegated token (``sqe_catalog.delegation``: subject = the restricted end user,
    actor = a principal that is a reader *now*, see ``AuthStore.set_reader``); a caller's own token never
    qualifies, a reader's own token included, and no principal is a reader by default. The same gate guards
    every response that carries metadata or storage credentials of a restricted table (load, create, register,
    commit, and the credentials endpoint: a credential reads raw files). Commits by a restricted end user are
    refused even through a reader (a writer that cannot see every row must not rewrite them), and the
    credentials vended to it never write. The gate runs before any ETag comparison, so a 304 never bypasses
    it; the ETag of a restricted response digests the principal and its restrictions, and every ETag digests
    the actor (never shared across principals or between a reader and the user's own token).

Stored restrictions that no longer fit the table (a schema change dropped a filtered column, say) refuse the
load with 403 rather than serve something unenforceable. Such a schema change, like one that makes policies
unresolvable, needs ``CATALOG_MANAGE_POLICIES`` (``refuse_breaking_schema_change``). ``--unchecked`` stores an
object without validation; it exists to exercise readers' fail-closed paths (conformance tests) and is served
verbatim, and alone.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from pyiceberg.table.metadata import TableMetadata
from sqlalchemy import Connection, Engine, and_, delete, insert, or_, select, update
from sqlalchemy.exc import DBAPIError

from sqe import vocabulary
from sqe.errors import RestrictionError
from sqe.restrictions import parse_restrictions, strict_json_loads
from sqe.restrictions.expressions import referenced_fields
from sqe_catalog.auth import _group_members, _groups, _principals  # AuthStore's tables, read-only here
from sqe_catalog.errors import (
    BadRequestError,
    ForbiddenError,
    NotAcceptableError,
    NotFoundError,
    ServiceUnavailableError,
)
from sqe_catalog.etag import governed_digest
from sqe_catalog.policies.bind import Subject as PolicySubject
from sqe_catalog.policies.lower import signature
from sqe_catalog.policies.resolve import RawEntry, Resolution, ResolutionError
from sqe_catalog.policies.resolve import resolve as resolve_policies
from sqe_catalog.policies.schema_change import explain_refusal, mentions_of, reader_classes
from sqe_catalog.policies.store import GovernanceSnapshot, PolicyStore
from sqe_catalog.schema import create_tables, warehouse_table
from sqe_catalog.tables import Namespace, StoredTable

__all__ = [
    "CAPABILITIES_HEADER",
    "READ_RESTRICTIONS_V1",
    "THROUGH_A_TRUSTED_READER",
    "GovernedLoadError",
    "ResolvedRestrictions",
    "RestrictionEntry",
    "RestrictionStore",
    "SchemaChangeRefusedError",
    "Subject",
    "SubjectKind",
    "declared_capabilities",
    "parse_restrictions_text",
    "refuse_restricted_write",
    "require_capability",
]

log = logging.getLogger("sqe_catalog.restrictions")

CAPABILITIES_HEADER_NAME = vocabulary.CAPABILITIES_HEADER
CAPABILITIES_HEADER = CAPABILITIES_HEADER_NAME.lower()  # Starlette's header lookups are case-insensitive anyway
READ_RESTRICTIONS_V1 = vocabulary.READ_RESTRICTIONS_V1
_TOKEN_RE = re.compile(r"[a-z0-9][a-z0-9.-]*")
_MAX_TEXT = 1024 * 1024


# ----------------------------------------------------------------------------------------------------
# Client capabilities


def declared_capabilities(header_values: Sequence[str]) -> frozenset[str]:
    """The tokens of ``X-Gravitino-Client-Capabilities`` (all of its lines); empty if any token is malformed."""
    if not header_values:
        return frozenset()
    tokens = [token.strip(" \t") for value in header_values for token in value.split(",")]
    if not all(_TOKEN_RE.fullmatch(token) for token in tokens):
        return frozenset()
    return frozenset(tokens)


# ----------------------------------------------------------------------------------------------------
# Subjects, entries, resolution results


class SubjectKind(enum.StrEnum):
    PRINCIPAL = "principal"
    GROUP = "group"


@dataclass(frozen=True)
class Subject:
    kind: SubjectKind
    name: str

    def __str__(self) -> str:
        return f"{self.kind.value} {self.name}"


@dataclass(frozen=True)
class RestrictionEntry:
    warehouse: str
    namespace: Namespace
    table: str  # the table's name when saved (kept current by renames through the API)
    table_uuid: str
    subject: Subject
    restrictions: Any  # the stored JSON value
    checked: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "warehouse": self.warehouse,
            "namespace": list(self.namespace),
            "table": self.table,
            "table_uuid": self.table_uuid,
            self.subject.kind.value: self.subject.name,
            "checked": self.checked,
            vocabulary.READ_RESTRICTIONS: self.restrictions,
        }


@dataclass(frozen=True)
class ResolvedRestrictions:
    """What one caller must be served for one table: the combined wire object and its ETag digest.

    ``digest`` covers the end user and its identity revision (its groups), the governance revision (tags and
    policies), the schema, the canonical restriction signature and the capability version
    (``sqe_catalog.etag.governed_digest``); the reader is added by the ETag itself."""

    wire: Any  # the ``read-restrictions`` value to return
    digest: str
    signature: str = ""
    report: dict[str, Any] | None = None


class SchemaChangeRefusedError(ForbiddenError):
    """A schema change that would make the table's read-restrictions fail to resolve for some reader, by a
    principal without ``CATALOG_MANAGE_POLICIES`` (``sqe_catalog.policies.schema_change``); nothing was written."""


class GovernedLoadError(ForbiddenError):
    """A governed load that cannot be served: a stable ``code`` and a ``request_id`` (also in the catalog log);
    ``detail`` names policies, tags or groups and is shown only to principals that may view policies."""

    def __init__(self, code: str, request_id: str, detail: str, *, show_detail: bool = False) -> None:
        message = (
            f"read-restrictions for this table cannot be applied [{code}] (request id {request_id}); "
            "access is refused until an administrator fixes them"
        )
        super().__init__(f"{message}: {detail}" if show_detail else message)
        self.code = code
        self.request_id = request_id
        self.detail = detail


# ----------------------------------------------------------------------------------------------------
# Database schema (on the catalog's one MetaData, beside the AuthStore tables)

_entries = warehouse_table(
    "sqe_read_restrictions",
    sa.Column("table_uuid", sa.String(64), primary_key=True),
    sa.Column("subject_kind", sa.String(16), primary_key=True),
    sa.Column("subject", sa.String(128), primary_key=True),
    sa.Column("namespace", sa.String(1024), nullable=False),
    sa.Column("table_name", sa.String(255), nullable=False),
    sa.Column("restrictions", sa.Text, nullable=False),
    sa.Column("checked", sa.Boolean, nullable=False),
    sa.Index("sqe_read_restrictions_by_name", "warehouse", "namespace", "table_name"),
)


def _table_condition(warehouse: Any, table_uuid: Any, namespace: Any, table_name: Any) -> tuple[Any, ...]:
    """One table's entries, by its UUID or its current name: a rename or a re-creation never sheds an entry. The
    arguments are values, or bound parameters for a statement built once."""
    c = _entries.c
    by_name = and_(c.namespace == namespace, c.table_name == table_name)
    return c.warehouse == warehouse, or_(c.table_uuid == table_uuid, by_name)


def _table_values(warehouse: str, loaded: StoredTable) -> dict[str, str]:
    """``_table_condition``'s arguments for a loaded table, by name (also the built statement's parameters)."""
    return {
        "warehouse": warehouse,
        "table_uuid": str(loaded.metadata.table_uuid),
        "namespace": _encode_namespace(loaded.namespace),
        "table_name": loaded.name,
    }


# Each load's reads, built once (building a statement costs more than running it on SQLite).
_TABLE_ENTRIES = select(_entries).where(
    *_table_condition(**{name: sa.bindparam(name) for name in ("warehouse", "table_uuid", "namespace", "table_name")})
)
_GROUPS_OF = select(_group_members.c.group_name).where(_group_members.c.principal_name == sa.bindparam("principal"))
_ALL_GROUPS = select(_groups.c.name)

# AuthStore's tables (one MetaData, sqe_catalog.schema), read only to check that a named subject exists.
_principal_names = _principals
_group_names = _groups


def _encode_namespace(namespace: Namespace) -> str:
    return vocabulary.NAMESPACE_SEPARATOR.join(namespace)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_restrictions_text(text: str | bytes) -> Any:
    """A restrictions document from a file: strict JSON (no duplicate keys, no NaN), at most 1 MiB."""
    if len(text) > _MAX_TEXT:
        raise BadRequestError(f"read-restrictions document is larger than {_MAX_TEXT} bytes")
    try:
        return strict_json_loads(text)
    except RestrictionError as exc:
        raise BadRequestError(f"read-restrictions rejected ({type(exc).__name__}): {exc}") from None


# ----------------------------------------------------------------------------------------------------
# Combining entries


class RestrictionConflictError(BadRequestError):
    """Entries that apply to one caller do not resolve together (distinct filters, distinct masks of a column)."""


def _identity_revision(user: str, groups: Iterable[str]) -> str:
    return hashlib.sha256(_canonical([user, sorted(groups)]).encode("utf-8")).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------
# The store


class DroppedGovernance(enum.Enum):
    """Why a dropped table's files may hold data restricted for someone."""

    ENTRIES = "read-restriction entries name it"
    POLICIES = "tag-based policies select it"


class RestrictionStore:
    """Restriction entries in the catalog database (reader trust lives in ``AuthStore``). Thread-safe."""

    def __init__(self, engine: Engine, policies: PolicyStore | None = None) -> None:
        self._engine = engine
        self._policies = policies  # None: tag-based policies are switched off

    def __repr__(self) -> str:
        return f"RestrictionStore(engine={self._engine!r}, policies={self._policies is not None})"

    def create_schema(self) -> None:
        """Create the tables if missing; safe to call from several processes at once."""
        create_tables(self._engine)

    # --- administration ---------------------------------------------------------------------------------

    def set(
        self, warehouse: str, loaded: StoredTable, subject: Subject, document: Any, *, checked: bool = True
    ) -> None:
        """Attach ``document`` to the table for ``subject``, replacing that subject's previous entry.

        Checked (the default): it must parse against the table's schema and, for every principal it applies to
        now, combine with that principal's other checked entries into one valid object.
        """
        uuid = str(loaded.metadata.table_uuid)
        if checked:
            self._check_document(document, loaded)
        row = {
            "warehouse": warehouse,
            "table_uuid": uuid,
            "subject_kind": subject.kind.value,
            "subject": subject.name,
            "namespace": _encode_namespace(loaded.namespace),
            "table_name": loaded.name,
            "restrictions": _canonical(document),
            "checked": checked,
        }
        with self._engine.begin() as conn:
            self._require_subject(conn, subject)
            if checked:
                stored = self._table_entries(conn, warehouse, loaded)
                for principal, subjects in self._affected_callers(conn, subject):
                    others = [e for e in stored if e.checked and e.subject in subjects - {subject}]
                    raw = [RawEntry(str(e.subject), e.restrictions) for e in others]
                    self._check_combination([*raw, RawEntry(str(subject), document)], loaded, principal)
            conn.execute(delete(_entries).where(*self._subject_rows(warehouse, loaded, subject)))
            conn.execute(insert(_entries).values(**row))

    def clear(self, warehouse: str, namespace: Namespace, table_name: str, uuid: str | None, subject: Subject) -> None:
        """Remove the subject's entries for the table: by its name, and by its UUID when it exists."""
        c = _entries.c
        by_table = and_(c.namespace == _encode_namespace(namespace), c.table_name == table_name)
        if uuid is not None:
            by_table = or_(by_table, c.table_uuid == uuid)
        stmt = delete(_entries).where(
            c.warehouse == warehouse, by_table, c.subject_kind == subject.kind.value, c.subject == subject.name
        )
        with self._engine.begin() as conn:
            if conn.execute(stmt).rowcount == 0:
                what = ".".join([warehouse, *namespace, table_name])
                raise NotFoundError(f"no read-restrictions on {what} for {subject}")

    def entries(self, warehouse: str | None = None, namespace: Namespace | None = None) -> list[RestrictionEntry]:
        c = _entries.c
        query = select(_entries).order_by(c.warehouse, c.namespace, c.table_name, c.subject_kind, c.subject)
        if warehouse is not None:
            query = query.where(c.warehouse == warehouse)
        if namespace is not None:
            query = query.where(c.namespace == _encode_namespace(namespace))
        with self._engine.connect() as conn:
            return [_entry(row) for row in conn.execute(query)]

    def renamed(self, warehouse: str, source: tuple[Namespace, str], target: tuple[Namespace, str]) -> None:
        """Keep the entries' table names current after a rename (matching by UUID does not need it)."""
        c = _entries.c
        stmt = (
            update(_entries)
            .where(
                c.warehouse == warehouse,
                c.namespace == _encode_namespace(source[0]),
                c.table_name == source[1],
            )
            .values(namespace=_encode_namespace(target[0]), table_name=target[1])
        )
        with self._engine.begin() as conn:
            conn.execute(stmt)

    def dropped_table_governance(self, warehouse: str, namespace: Namespace, name: str) -> DroppedGovernance | None:
        """What made a dropped table's data restricted for someone (its files may still hold it), or None. Found by
        the table's name at its drop: a drop removes neither entries nor tags, and API renames keep both current."""
        c = _entries.c
        by_name = select(c.table_name).where(
            c.warehouse == warehouse, c.namespace == _encode_namespace(namespace), c.table_name == name
        )
        with self._engine.connect() as conn:
            if conn.execute(by_name.limit(1)).first() is not None:
                return DroppedGovernance.ENTRIES
        if self._policies is None:
            return None
        snapshot = self._policies.snapshot(warehouse, namespace, name, table_uuid="")
        tagged = {assignment.tag for assignment in snapshot.assignments}
        # Policy and tag names stay out: the caller need not be a policy manager.
        selected = any(p.enabled and any(s.tag in tagged for s in p.selectors) for p in snapshot.policies)
        return DroppedGovernance.POLICIES if selected else None

    # --- serving ----------------------------------------------------------------------------------------

    def resolve(
        self,
        warehouse: str,
        loaded: StoredTable,
        principal: str,
        groups: Iterable[str] = (),
        *,
        request_id: str = "-",
        show_detail: bool = False,
    ) -> ResolvedRestrictions | None:
        """The restrictions that apply to the end user ``principal``, or None when none do.

        Raises GovernedLoadError (403, stable code, request id) when they cannot be resolved; the detail (policy,
        tag and group names) is in the message only with ``show_detail``. ``groups`` is ignored: memberships
        and group existence are read here, in one snapshot with the entries.
        """
        del groups
        what = ".".join([warehouse, *loaded.namespace, loaded.name])
        try:
            subject, entries = self._subject_and_entries(warehouse, loaded, principal)
            snapshot = None
            if self._policies is not None:
                uuid = str(loaded.metadata.table_uuid)
                snapshot = self._policies.snapshot(warehouse, loaded.namespace, loaded.name, uuid)
        except DBAPIError:
            log.warning("read-restrictions on %s: identity or policy lookup failed (request id %s)", what, request_id)
            raise GovernedLoadError("bind-identity-lookup-failed", request_id, "a database lookup failed") from None
        unchecked = [e for e in entries if not e.checked]
        if unchecked:
            return self._unchecked(unchecked, entries, snapshot, loaded, subject, what, request_id, show_detail)
        try:
            resolution = self._run(
                loaded, subject, snapshot, [RawEntry(str(e.subject), e.restrictions) for e in entries]
            )
        except ResolutionError as exc:
            log.warning(
                "read-restrictions on %s for principal %s cannot be served: code=%s request_id=%s",
                what,
                principal,
                exc.code,
                request_id,
            )
            raise GovernedLoadError(exc.code, request_id, exc.message, show_detail=show_detail) from None
        if resolution.wire is None:
            return None
        revision = snapshot.revision if snapshot is not None else 0
        digest = governed_digest(
            end_user=principal,
            identity_revision=_identity_revision(principal, subject.groups),
            governance_revision=revision,
            schema_id=loaded.metadata.current_schema_id,
            signature=resolution.signature,
            capability=READ_RESTRICTIONS_V1,
        )
        return ResolvedRestrictions(resolution.wire, digest, resolution.signature, resolution.report)

    def refuse_breaking_schema_change(self, warehouse: str, before: StoredTable | None, after: StoredTable) -> None:
        """SchemaChangeRefusedError when ``after`` (a commit's result, or a new table) leaves a reader's
        restrictions unresolvable where ``before`` (None: a new table) resolves them, or makes a reader's row filter
        read other columns than on ``before``. The caller skips this for a
        policy manager. Every class of reader is resolved (``schema_change``); a failure ``before`` already had
        for that reader is not the change's doing."""
        if before is not None and _same_schemas(before.metadata, after.metadata):
            return
        what = ".".join([warehouse, *after.namespace, after.name])
        try:
            readers, entries, snapshot = self._governed_readers(warehouse, after)
        except DBAPIError:
            log.warning("schema change of %s: the restrictions it affects could not be read", what)
            raise ServiceUnavailableError(
                f"the read-restrictions a schema change of {what} affects cannot be checked now; try again"
            ) from None
        for reader in readers:
            applying = _subjects_of(reader.user, reader.groups)
            raw = [RawEntry(str(e.subject), e.restrictions) for e in entries if e.subject in applying]
            self._judge_reader(what, before, after, reader, snapshot, raw)

    def _governed_readers(
        self, warehouse: str, table: StoredTable
    ) -> tuple[list[PolicySubject], list[RestrictionEntry], GovernanceSnapshot | None]:
        """The reader classes to check ``table`` for, its checked entries and its policy snapshot; no reader (and no
        read of principals) when no entry names the table and no enabled policy has a tag the table carries."""
        snapshot = None
        if self._policies is not None:
            uuid = str(table.metadata.table_uuid)
            snapshot = self._policies.snapshot(warehouse, table.namespace, table.name, uuid)
        # Only a policy one of whose tags the table or a column of it (under any name) carries can be selected.
        tagged = {a.tag for a in snapshot.assignments} if snapshot is not None else set()
        enabled = [p for p in snapshot.policies if p.enabled] if snapshot is not None else []
        selectable = [p for p in enabled if any(s.tag in tagged for s in p.selectors)]
        with self._engine.connect() as conn:
            entries = [e for e in self._table_entries(conn, warehouse, table) if e.checked]
            if not selectable and not entries:
                return [], [], snapshot
            principals: list[str] = list(conn.execute(select(_principals.c.name)).scalars())
            memberships: dict[str, set[str]] = {name: set() for name in principals}
            m = _group_members.c
            for row in conn.execute(select(m.principal_name, m.group_name)):
                memberships.setdefault(str(row.principal_name), set()).add(str(row.group_name))
            known: frozenset[str] = frozenset(conn.execute(_ALL_GROUPS).scalars())
        mentions = mentions_of(
            selectable,
            [e.subject.name for e in entries if e.subject.kind is SubjectKind.PRINCIPAL],
            [e.subject.name for e in entries if e.subject.kind is SubjectKind.GROUP],
            [e.restrictions for e in entries],
        )
        frozen = {name: frozenset(groups) for name, groups in memberships.items()}
        return reader_classes(frozen, known, mentions), entries, snapshot

    def _judge_reader(
        self,
        what: str,
        before: StoredTable | None,
        after: StoredTable,
        reader: PolicySubject,
        snapshot: GovernanceSnapshot | None,
        entries: list[RawEntry],
    ) -> None:
        """SchemaChangeRefusedError when the reader's restrictions fail to resolve on ``after`` where they resolve on
        ``before``, or resolve there to a row filter over other columns (a policy's ``col(name)`` binds by name:
        a rename handing the name to another column would filter on that one instead)."""
        previous = None
        if before is not None:
            try:
                previous = self._run(before, reader, snapshot, entries)
            except ResolutionError:
                return  # already unresolvable for this reader: not the change's doing
        try:
            resolved = self._run(after, reader, snapshot, entries)
        except ResolutionError as exc:
            raise _schema_change_refused(what, exc, after) from None
        if before is None or previous is None:
            return
        read_before, read_after = _row_filter_fields(before, previous.wire), _row_filter_fields(after, resolved.wire)
        if read_before != read_after:
            raise _row_filter_rebound(what, (before, read_before), (after, read_after))

    def preview(self, warehouse: str, loaded: StoredTable, principal: str, *, include_disabled: bool) -> dict[str, Any]:
        """The explain report of resolving ``loaded`` for ``principal`` (nothing is enabled or stored)."""
        subject, entries = self._subject_and_entries(warehouse, loaded, principal)
        snapshot = None
        if self._policies is not None:
            uuid = str(loaded.metadata.table_uuid)
            snapshot = self._policies.snapshot(warehouse, loaded.namespace, loaded.name, uuid)
        raw = [RawEntry(str(e.subject), e.restrictions) for e in entries if e.checked]
        try:
            report = self._run(loaded, subject, snapshot, raw, include_disabled=include_disabled).report
        except ResolutionError as exc:
            report = exc.report
        report["policies-enabled-on-server"] = self._policies is not None
        report["include-disabled"] = include_disabled
        report["unchecked-entries"] = [str(e.subject) for e in entries if not e.checked]
        return report

    def _run(
        self,
        loaded: StoredTable,
        subject: PolicySubject,
        snapshot: GovernanceSnapshot | None,
        entries: list[RawEntry],
        *,
        include_disabled: bool = False,
    ) -> Resolution:
        metadata = loaded.metadata
        return resolve_policies(
            table=".".join([*loaded.namespace, loaded.name]),
            schema=metadata.schema(),
            all_schemas=metadata.schemas,
            namespace=loaded.namespace,
            table_uuid=str(metadata.table_uuid),
            subject=subject,
            snapshot=snapshot,
            entries=entries,
            include_disabled=include_disabled,
        )

    def _unchecked(
        self,
        unchecked: list[RestrictionEntry],
        entries: list[RestrictionEntry],
        snapshot: GovernanceSnapshot | None,
        loaded: StoredTable,
        subject: PolicySubject,
        what: str,
        request_id: str,
        show_detail: bool,
    ) -> ResolvedRestrictions:
        """An unchecked entry is served verbatim and alone (it exists to exercise readers' fail-closed paths)."""
        alone = len(entries) == 1
        if alone and snapshot is not None:
            try:
                alone = self._run(loaded, subject, snapshot, []).wire is None
            except ResolutionError:
                alone = False
        if not alone:
            log.warning(
                "read-restrictions on %s: an unchecked entry cannot be combined (request id %s)", what, request_id
            )
            raise GovernedLoadError(
                "resolve-unchecked-combination",
                request_id,
                "an unchecked entry cannot be combined with other restrictions",
                show_detail=show_detail,
            )
        document = unchecked[0].restrictions
        digest = governed_digest(
            end_user=subject.user,
            identity_revision=_identity_revision(subject.user, subject.groups),
            governance_revision=snapshot.revision if snapshot is not None else 0,
            schema_id=loaded.metadata.current_schema_id,
            signature=signature(document),
            capability=READ_RESTRICTIONS_V1,
        )
        return ResolvedRestrictions(document, digest, signature(document))

    def _subject_and_entries(
        self, warehouse: str, loaded: StoredTable, principal: str
    ) -> tuple[PolicySubject, list[RestrictionEntry]]:
        """The end user's flat groups, every existing group and the applicable entries: one snapshot."""
        with self._engine.connect() as conn:
            groups: frozenset[str] = frozenset(conn.execute(_GROUPS_OF, {"principal": principal}).scalars())
            known: frozenset[str] = frozenset(conn.execute(_ALL_GROUPS).scalars())
            subjects = _subjects_of(principal, groups)
            entries = [e for e in self._table_entries(conn, warehouse, loaded) if e.subject in subjects]
        ordered = sorted(entries, key=lambda e: (e.subject.kind != SubjectKind.PRINCIPAL, e.subject.name))
        return PolicySubject(principal, groups, known), ordered

    # --- helpers ----------------------------------------------------------------------------------------

    @staticmethod
    def _check_document(document: Any, loaded: StoredTable) -> None:
        try:
            parse_restrictions(document, loaded.metadata.schema(), all_schemas=loaded.metadata.schemas)
        except RestrictionError as exc:
            raise BadRequestError(f"read-restrictions rejected ({type(exc).__name__}): {exc}") from None

    def _check_combination(self, entries: list[RawEntry], loaded: StoredTable, principal: str) -> None:
        """The entries that would apply to ``principal`` together must resolve (policies are checked on load)."""
        subject = PolicySubject(principal, frozenset(), frozenset())
        try:
            self._run(loaded, subject, None, entries)
        except ResolutionError as exc:
            raise RestrictionConflictError(
                f"read-restrictions for principal {principal} would not combine with its other entries on this "
                f"table [{exc.code}]: {exc.message}"
            ) from None

    @staticmethod
    def _affected_callers(conn: Connection, subject: Subject) -> list[tuple[str, frozenset[Subject]]]:
        """Each principal the subject's entry applies to now, with every subject whose entries apply to it."""
        m = _group_members.c
        if subject.kind is SubjectKind.PRINCIPAL:
            principals = [subject.name]
        else:
            principals = list(conn.execute(select(m.principal_name).where(m.group_name == subject.name)).scalars())
        callers = []
        for principal in principals:
            groups: list[str] = list(conn.execute(select(m.group_name).where(m.principal_name == principal)).scalars())
            callers.append((principal, _subjects_of(principal, groups)))
        return callers

    @staticmethod
    def _table_match(warehouse: str, loaded: StoredTable) -> tuple[Any, ...]:
        return _table_condition(**_table_values(warehouse, loaded))

    @classmethod
    def _subject_rows(cls, warehouse: str, loaded: StoredTable, subject: Subject) -> tuple[Any, ...]:
        c = _entries.c
        return (*cls._table_match(warehouse, loaded), c.subject_kind == subject.kind.value, c.subject == subject.name)

    @classmethod
    def _table_entries(cls, conn: Connection, warehouse: str, loaded: StoredTable) -> list[RestrictionEntry]:
        return [_entry(row) for row in conn.execute(_TABLE_ENTRIES, _table_values(warehouse, loaded))]

    @staticmethod
    def _require_subject(conn: Connection, subject: Subject) -> None:
        names = _principals if subject.kind is SubjectKind.PRINCIPAL else _groups
        if conn.execute(select(names.c.name).where(names.c.name == subject.name)).first() is None:
            raise NotFoundError(f"{subject} does not exist")


def _schema_change_refused(what: str, failure: ResolutionError, after: StoredTable) -> SchemaChangeRefusedError:
    """The refusal (the column and the code: a writer need not manage policies); the catalog log also names the
    tags and masks, for the policy manager who is asked to make the change or fix what it runs into."""
    names = {f.field_id: f.name for s in after.metadata.schemas for f in s.fields}
    names.update({f.field_id: f.name for f in after.metadata.schema().fields})  # current names win
    explained = explain_refusal(failure.code, failure.message, failure.report, names, governance=True)
    log.warning("schema change of %s refused: code=%s: %s", what, failure.code, explained)
    detail = explain_refusal(failure.code, failure.message, failure.report, names)
    return SchemaChangeRefusedError(
        f"this schema change would make every governed load of {what} fail for some readers, whose "
        f"read-restrictions would no longer resolve: {detail} [{failure.code}]; only a principal with "
        "CATALOG_MANAGE_POLICIES may make it"
    )


def _row_filter_fields(table: StoredTable, wire: dict[str, Any] | None) -> frozenset[int]:
    """The field ids a resolved row filter reads, nested ones included, by the engine's own parser (the wire was
    already parsed against ``table`` when it was resolved)."""
    if wire is None:
        return frozenset()
    plan = parse_restrictions(wire, table.metadata.schema(), all_schemas=table.metadata.schemas)
    return frozenset(ref.field_id for ref in referenced_fields(plan.row_filter))


def _row_filter_rebound(
    what: str, before: tuple[StoredTable, frozenset[int]], after: tuple[StoredTable, frozenset[int]]
) -> SchemaChangeRefusedError:
    """The refusal of a change that leaves a reader's row filter resolvable, but over other columns."""

    def shown(table: StoredTable, fields: frozenset[int]) -> str:
        names = {f.field_id: f.name for f in table.metadata.schema().fields}
        return ", ".join(f"{names.get(fid, '?')!r} (field {fid})" for fid in sorted(fields)) or "no column"

    log.warning("schema change of %s refused: a row filter would bind other columns", what)
    return SchemaChangeRefusedError(
        f"this schema change would make a row filter of {what} read other columns than it does now (it reads "
        f"{shown(*before)}, and would read {shown(*after)}): the row filter would bind another column, as its "
        "policy names columns by name; only a principal with CATALOG_MANAGE_POLICIES may make it"
    )


def _same_schemas(before: TableMetadata, after: TableMetadata) -> bool:
    """Whether two revisions give resolution the same schemas (the current one, and every one by id)."""
    if before.current_schema_id != after.current_schema_id:
        return False
    return [(s.schema_id, s) for s in before.schemas] == [(s.schema_id, s) for s in after.schemas]


def _subjects_of(principal: str, groups: Iterable[str]) -> frozenset[Subject]:
    return frozenset({Subject(SubjectKind.PRINCIPAL, principal), *(Subject(SubjectKind.GROUP, g) for g in groups)})


def _entry(row: Any) -> RestrictionEntry:
    namespace = tuple(row.namespace.split(vocabulary.NAMESPACE_SEPARATOR)) if row.namespace else ()
    return RestrictionEntry(
        warehouse=row.warehouse,
        namespace=namespace,
        table=row.table_name,
        table_uuid=row.table_uuid,
        subject=Subject(SubjectKind(row.subject_kind), row.subject),
        restrictions=json.loads(row.restrictions),
        checked=bool(row.checked),
    )


# ----------------------------------------------------------------------------------------------------
# The delivery gate


# The whole 403 message: it names no policy, filter, mask or group, and not even which rule applied.
THROUGH_A_TRUSTED_READER = "the catalog only serves this table through a trusted reader"


def require_capability(
    restricted: ResolvedRestrictions | None, *, declared: bool, via_trusted_reader: bool, what: str
) -> None:
    """406 without ``read-restrictions.v1``, 403 unless the caller is a delegated token whose actor is a trusted
    reader; nothing when no restriction applies."""
    if restricted is None:
        return
    if not declared:
        raise NotAcceptableError(
            f"read-restrictions apply to {what} for this principal: only a reader that enforces them may load "
            f"it, declared with the header {CAPABILITIES_HEADER_NAME}: {READ_RESTRICTIONS_V1}"
        )
    if not via_trusted_reader:
        raise ForbiddenError(THROUGH_A_TRUSTED_READER)


def refuse_restricted_write(restricted: ResolvedRestrictions | None) -> None:
    """403 for a commit by an end user with read-restrictions on the table, whoever carries it."""
    if restricted is not None:
        raise ForbiddenError("the catalog refuses writes to this table by a principal with read-restrictions on it")
