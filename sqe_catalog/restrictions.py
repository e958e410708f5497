"""Read-restrictions attached to tables for a principal or a group, served in loadTable (Iceberg REST).

An administrator attaches a raw ``read-restrictions`` object (the REST spec's wire shape) to one table for one
principal or one group (``sqe-catalog admin set-restrictions``). It is validated on save with the engine's own
parser (``sqe.restrictions.parse_restrictions``) against the table's current schema and history, so the catalog
and SQE agree on what is valid.

Which entries apply, and how several combine (fail closed)
    The caller's own principal entry plus the entries of every group it belongs to. Their row filters are
    AND-ed and their column projections unioned (identical duplicates collapse). Two entries that apply to one
    caller and mask the same column with different actions conflict: ``set-restrictions`` refuses an entry that
    conflicts for any principal it applies to now (a principal entry against that principal's group entries; a
    group entry against each member's other entries), and a conflict that arises later (membership changed)
    refuses that caller's loads with 403 until an administrator resolves it. No entry ever loosens another.

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
load with 403 rather than serve something unenforceable. ``--unchecked`` stores an object without validation;
it exists to exercise readers' fail-closed paths (conformance tests) and is served verbatim, and alone.
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

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Engine,
    Index,
    String,
    Table,
    Text,
    and_,
    delete,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError

from sqe import vocabulary
from sqe.errors import RestrictionError
from sqe.restrictions import RestrictionPlan, parse_restrictions, strict_json_loads
from sqe_catalog.auth import _group_members, _groups, _principals  # AuthStore's tables, read-only here
from sqe_catalog.errors import BadRequestError, ForbiddenError, NotAcceptableError, NotFoundError
from sqe_catalog.schema import METADATA
from sqe_catalog.tables import Namespace, StoredTable

__all__ = [
    "CAPABILITIES_HEADER",
    "READ_RESTRICTIONS_V1",
    "THROUGH_A_TRUSTED_READER",
    "ResolvedRestrictions",
    "RestrictionEntry",
    "RestrictionStore",
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
_FILTER = "required-row-filter"
_PROJECTIONS = "required-column-projections"
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
            "read-restrictions": self.restrictions,
        }


@dataclass(frozen=True)
class ResolvedRestrictions:
    """What one caller must be served for one table: the combined wire object and its ETag digest."""

    wire: Any  # the ``read-restrictions`` value to return
    digest: str


# ----------------------------------------------------------------------------------------------------
# Database schema (on the catalog's one MetaData, beside the AuthStore tables)

_entries = Table(
    "sqe_read_restrictions",
    METADATA,
    Column("warehouse", String(255), primary_key=True),
    Column("table_uuid", String(64), primary_key=True),
    Column("subject_kind", String(16), primary_key=True),
    Column("subject", String(128), primary_key=True),
    Column("namespace", String(1024), nullable=False),
    Column("table_name", String(255), nullable=False),
    Column("restrictions", Text, nullable=False),
    Column("checked", Boolean, nullable=False),
    Index("sqe_read_restrictions_by_name", "warehouse", "namespace", "table_name"),
)
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


def _is_true(value: Any) -> bool:
    return value is None or value is True or value == {"type": "true"}


class RestrictionConflictError(BadRequestError):
    """Two entries that apply to one caller mask the same column differently."""


def _combine(documents: Iterable[Any]) -> dict[str, Any]:
    """AND the row filters, union the projections; raises RestrictionConflictError on a conflicting mask."""
    filters: list[Any] = []
    projections: dict[int, dict[str, Any]] = {}
    for document in documents:
        if document is None:
            continue  # an absent object: no restriction
        if not isinstance(document, dict):
            raise BadRequestError("read-restrictions must be a JSON object")
        row_filter = document.get(_FILTER)
        if not _is_true(row_filter):
            filters.append(row_filter)
        for projection in document.get(_PROJECTIONS) or []:
            field_id = projection.get("field-id") if isinstance(projection, dict) else None
            if not isinstance(field_id, int):
                raise BadRequestError("read-restrictions: malformed column projection")
            previous = projections.setdefault(field_id, projection)
            if previous != projection:
                raise RestrictionConflictError(
                    f"read-restrictions conflict: field id {field_id} is masked with "
                    f"{previous.get('action')!r} and {projection.get('action')!r} by entries that apply together"
                )
    combined: dict[str, Any] = {}
    if projections:
        combined[_PROJECTIONS] = [projections[field_id] for field_id in sorted(projections)]
    if filters:
        tree = filters[0]
        for other in filters[1:]:
            tree = {"type": "and", "left": tree, "right": other}
        combined[_FILTER] = tree
    return combined


def _validate(document: Any, loaded: StoredTable) -> RestrictionPlan:
    metadata = loaded.metadata
    return parse_restrictions(document, metadata.schema(), all_schemas=metadata.schemas)


def _digest(principal: str, wire: Any) -> str:
    text = _canonical([principal, vocabulary.READ_RESTRICTIONS_V1, wire])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------------------
# The store


class RestrictionStore:
    """Restriction entries in the catalog database (reader trust lives in ``AuthStore``). Thread-safe."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __repr__(self) -> str:
        return f"RestrictionStore(engine={self._engine!r})"

    def create_schema(self) -> None:
        """Create the tables if missing; safe to call from several processes at once."""
        try:
            METADATA.create_all(self._engine, checkfirst=True)
        except DBAPIError:
            METADATA.create_all(self._engine, checkfirst=True)

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
                    others = [e.restrictions for e in stored if e.checked and e.subject in subjects - {subject}]
                    self._check_combination([*others, document], loaded, principal)
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

    # --- serving ----------------------------------------------------------------------------------------

    def resolve(
        self, warehouse: str, loaded: StoredTable, principal: str, groups: Iterable[str]
    ) -> ResolvedRestrictions | None:
        """The restrictions that apply to the caller, or None when none do (absent, empty or always true).

        Raises ForbiddenError when the applicable entries cannot be combined or no longer fit the table.
        """
        subjects = _subjects_of(principal, groups)
        with self._engine.connect() as conn:
            entries = [e for e in self._table_entries(conn, warehouse, loaded) if e.subject in subjects]
        if not entries:
            return None
        what = ".".join([warehouse, *loaded.namespace, loaded.name])
        if any(not e.checked for e in entries):
            if len(entries) > 1:
                raise ForbiddenError(self._unusable(what, principal, "an unchecked entry cannot be combined"))
            return ResolvedRestrictions(entries[0].restrictions, _digest(principal, entries[0].restrictions))
        ordered = sorted(entries, key=lambda e: (e.subject.kind != SubjectKind.PRINCIPAL, e.subject.name))
        try:
            wire = _combine(e.restrictions for e in ordered)
            plan = _validate(wire, loaded)
        except (BadRequestError, RestrictionError) as exc:
            log.warning("read-restrictions on %s for principal %s cannot be served: %s", what, principal, exc)
            why = "entries that apply to it conflict" if isinstance(exc, RestrictionConflictError) else None
            raise ForbiddenError(self._unusable(what, principal, why or "they no longer fit the table")) from None
        if not plan.is_restricted:
            return None
        return ResolvedRestrictions(wire, _digest(principal, wire))

    @staticmethod
    def _unusable(what: str, principal: str, why: str) -> str:
        return (
            f"read-restrictions for principal {principal} on {what} cannot be applied ({why}); "
            "access is refused until an administrator fixes them"
        )

    # --- helpers ----------------------------------------------------------------------------------------

    @staticmethod
    def _check_document(document: Any, loaded: StoredTable) -> None:
        try:
            _validate(document, loaded)
        except RestrictionError as exc:
            raise BadRequestError(f"read-restrictions rejected ({type(exc).__name__}): {exc}") from None

    @staticmethod
    def _check_combination(documents: list[Any], loaded: StoredTable, principal: str) -> None:
        try:
            _validate(_combine(documents), loaded)
        except (BadRequestError, RestrictionError) as exc:
            detail = exc.message if isinstance(exc, BadRequestError) else f"({type(exc).__name__}) {exc}"
            raise BadRequestError(
                f"read-restrictions for principal {principal} would not combine with its other entries on this "
                f"table: {detail}"
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
        """The table's UUID or its current name: a rename or a re-creation never sheds an entry."""
        c = _entries.c
        by_name = and_(c.namespace == _encode_namespace(loaded.namespace), c.table_name == loaded.name)
        return c.warehouse == warehouse, or_(c.table_uuid == str(loaded.metadata.table_uuid), by_name)

    @classmethod
    def _subject_rows(cls, warehouse: str, loaded: StoredTable, subject: Subject) -> tuple[Any, ...]:
        c = _entries.c
        return (*cls._table_match(warehouse, loaded), c.subject_kind == subject.kind.value, c.subject == subject.name)

    @classmethod
    def _table_entries(cls, conn: Connection, warehouse: str, loaded: StoredTable) -> list[RestrictionEntry]:
        query = select(_entries).where(*cls._table_match(warehouse, loaded))
        return [_entry(row) for row in conn.execute(query)]

    @staticmethod
    def _require_subject(conn: Connection, subject: Subject) -> None:
        names = _principals if subject.kind is SubjectKind.PRINCIPAL else _groups
        if conn.execute(select(names.c.name).where(names.c.name == subject.name)).first() is None:
            raise NotFoundError(f"{subject} does not exist")


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
