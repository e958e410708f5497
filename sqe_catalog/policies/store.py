"""Tags, policies and policy-on-tag associations in the catalog database (one MetaData, ``sqe_catalog.schema``).

Tags
    A tag is a key with an optional value, assigned to the warehouse, a namespace, a table or a top-level column.
    Effective tags of an object are its own plus every ancestor's; for one key the nearest assignment wins
    (column over table over deeper namespace over shallower over warehouse), value included. Table tags match the
    table by UUID or by current name, column tags by field id or by any name the field has had, so neither a
    rename nor a drop and re-create (nor both) sheds a tag (a restriction is never lost by renaming). A renamed
    column's tags matched by name only add their values to its own (a column has every value so found): a rename
    never replaces a value, so a rename onto a name tagged ``pii=none`` exempts nothing.

Policies
    ``system_row_filter`` or ``system_column_mask`` with content of exactly one of ``expression`` (restricted
    Rego, validated on save) and ``function`` (reserved: refused in this version, ``policy-function-unsupported``).
    New policies start disabled. Every change bumps the policy's revision and keeps the previous revision in the
    history table with who changed it and when.

Associations
    A policy is attached to a tag with selector ``ALL_VALUES`` (the tag is present, any value) or
    ``TAG_VALUE(v)`` (its effective value is exactly ``v``).

Every mutation bumps the warehouse's governance revision (``revision()``), which restricted responses' ETags
digest: a changed tag or policy never revalidates a cached response.
"""

from __future__ import annotations

import enum
import json
import re
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pyiceberg.types import NestedField
from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Engine,
    Integer,
    String,
    Text,
    and_,
    delete,
    insert,
    or_,
    select,
    update,
)

from sqe import vocabulary
from sqe._text import iso_utc
from sqe_catalog.errors import AlreadyExistsError, BadRequestError, NotFoundError
from sqe_catalog.policies import rego
from sqe_catalog.policies.errors import PolicyError
from sqe_catalog.schema import create_tables, warehouse_table

__all__ = [
    "ColumnTagValue",
    "ObjectKind",
    "Policy",
    "PolicyStore",
    "PolicyType",
    "Selector",
    "TagAssignment",
    "TagTarget",
    "parse_content",
]

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_MAX_VALUE = 256


class PolicyType(enum.StrEnum):
    ROW_FILTER = "system_row_filter"
    COLUMN_MASK = "system_column_mask"

    @property
    def rule_kind(self) -> rego.RuleKind:
        return "filter" if self is PolicyType.ROW_FILTER else "mask"


class ObjectKind(enum.StrEnum):
    WAREHOUSE = "warehouse"
    NAMESPACE = "namespace"
    TABLE = "table"
    COLUMN = "column"


@dataclass(frozen=True)
class TagTarget:
    """What a tag is assigned to; ``field_id`` is resolved from ``column`` when a column is tagged."""

    kind: ObjectKind
    namespace: tuple[str, ...] = ()
    table: str = ""
    column: str = ""
    table_uuid: str = ""
    field_id: int = 0

    def describe(self) -> str:
        parts = [*self.namespace, *([self.table] if self.table else []), *([self.column] if self.column else [])]
        return f"{self.kind.value} {'.'.join(parts)}" if parts else self.kind.value


@dataclass(frozen=True)
class TagAssignment:
    target: TagTarget
    tag: str
    value: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "object": self.target.kind.value,
            "namespace": list(self.target.namespace),
            "table": self.target.table or None,
            "column": self.target.column or None,
            "field-id": self.target.field_id or None,
            "tag": self.tag,
            "value": self.value,
        }


@dataclass(frozen=True)
class Selector:
    tag: str
    value: str | None  # None: ALL_VALUES

    def matches(self, effective: dict[str, str | None]) -> bool:
        if self.tag not in effective:
            return False
        return self.value is None or effective[self.tag] == self.value

    def to_json(self) -> dict[str, Any]:
        if self.value is None:
            return {"tag": self.tag, "selector": "ALL_VALUES"}
        return {"tag": self.tag, "selector": "TAG_VALUE", "value": self.value}


@dataclass(frozen=True)
class Policy:
    warehouse: str
    name: str
    policy_type: PolicyType
    comment: str
    content: dict[str, Any]
    enabled: bool
    revision: int
    created_by: str
    created_at: float
    updated_by: str
    updated_at: float
    selectors: tuple[Selector, ...] = ()

    @property
    def expression(self) -> str:
        return str(self.content["expression"])

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "comment": self.comment,
            "policyType": self.policy_type.value,
            "enabled": self.enabled,
            "content": self.content,
            "revision": self.revision,
            "audit": {
                "creator": self.created_by,
                "createTime": iso_utc(self.created_at, zulu=True),
                "lastModifier": self.updated_by,
                "lastModifiedTime": iso_utc(self.updated_at, zulu=True),
            },
            "tags": [s.to_json() for s in self.selectors],
        }


# ----------------------------------------------------------------------------------------------------
# Validation


def validate_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadRequestError(f"invalid {kind} name: use up to 128 letters, digits, '_', '.' or '-'")
    return name


def _validate_value(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > _MAX_VALUE:
        raise BadRequestError(f"a tag value must be a non-empty string of at most {_MAX_VALUE} characters")
    return value


def parse_content(policy_type: PolicyType, content: object) -> dict[str, Any]:
    """Exactly one of ``expression`` | ``function``; the expression must parse and type-check for the type."""
    if not isinstance(content, dict):
        raise PolicyError("policy-invalid-content", "content must be an object with 'expression'")
    keys = set(content)
    if keys == {"function"}:
        raise PolicyError(
            "policy-function-unsupported",
            "function references are reserved: this version accepts only an 'expression'",
        )
    if keys != {"expression"}:
        raise PolicyError("policy-invalid-content", "content must have exactly one of 'expression' and 'function'")
    expression = content["expression"]
    if not isinstance(expression, str):
        raise PolicyError("policy-invalid-content", "'expression' must be a string")
    rego.parse(expression, policy_type.rule_kind)  # RegoError (a PolicyError) with code and position
    return {"expression": expression}


def _policy_type(value: object) -> PolicyType:
    try:
        return PolicyType(str(value))
    except ValueError:
        raise PolicyError("policy-invalid-type", "policyType must be system_row_filter or system_column_mask") from None


# ----------------------------------------------------------------------------------------------------
# Database schema


def _policy_body() -> tuple[Column[Any], ...]:
    """What one revision of a policy says: the current row and every revision row hold it."""
    return (
        Column("comment", Text, nullable=False),
        Column("content", Text, nullable=False),
        Column("enabled", Boolean, nullable=False),
    )


def _stamp(event: str) -> tuple[Column[Any], ...]:
    """Who made a change (``<event>_by``) and when (``<event>_at``)."""
    return Column(f"{event}_by", String(128), nullable=False), Column(f"{event}_at", Integer, nullable=False)


_policies = warehouse_table(
    "sqe_policies",
    Column("name", String(128), primary_key=True),
    Column("policy_type", String(32), nullable=False),
    *_policy_body(),
    Column("revision", Integer, nullable=False),
    *_stamp("created"),
    *_stamp("updated"),
)
_policy_history = warehouse_table(
    "sqe_policy_revisions",
    Column("name", String(128), primary_key=True),
    Column("revision", Integer, primary_key=True),
    *_policy_body(),
    *_stamp("changed"),
)
_associations = warehouse_table(
    "sqe_policy_tags",
    Column("policy_name", String(128), primary_key=True),
    Column("tag", String(128), primary_key=True),
    Column("selector_value", String(_MAX_VALUE), primary_key=True),  # "" for ALL_VALUES
    Column("all_values", Boolean, nullable=False),
)
_tags = warehouse_table(
    "sqe_tag_assignments",
    Column("object_kind", String(16), primary_key=True),
    Column("namespace", String(1024), primary_key=True),  # "" for the warehouse
    Column("table_name", String(255), primary_key=True),  # "" above table level
    Column("column_name", String(255), primary_key=True),  # "" above column level
    Column("tag", String(128), primary_key=True),
    Column("table_uuid", String(64), nullable=False),
    Column("field_id", Integer, nullable=False),
    Column("value", String(_MAX_VALUE), nullable=True),
)
_revisions = warehouse_table(
    "sqe_governance_revisions",
    Column("revision", Integer, nullable=False),
)


def _ns(namespace: Iterable[str]) -> str:
    return vocabulary.NAMESPACE_SEPARATOR.join(namespace)


def _unns(encoded: str) -> tuple[str, ...]:
    return tuple(encoded.split(vocabulary.NAMESPACE_SEPARATOR)) if encoded else ()


# ----------------------------------------------------------------------------------------------------
# The store


class PolicyStore:
    """Tags, policies and associations; thread-safe (every call opens its own transaction)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __repr__(self) -> str:
        return f"PolicyStore(engine={self._engine!r})"

    def create_schema(self) -> None:
        create_tables(self._engine)

    # --- revisions --------------------------------------------------------------------------------------

    def revision(self, warehouse: str) -> int:
        with self._engine.connect() as conn:
            return self._revision(conn, warehouse)

    @staticmethod
    def _revision(conn: Connection, warehouse: str) -> int:
        value = conn.execute(select(_revisions.c.revision).where(_revisions.c.warehouse == warehouse)).scalar()
        return int(value or 0)

    def _bump(self, conn: Connection, warehouse: str) -> None:
        current = conn.execute(select(_revisions.c.revision).where(_revisions.c.warehouse == warehouse)).scalar()
        if current is None:
            conn.execute(insert(_revisions).values(warehouse=warehouse, revision=1))
        else:
            conn.execute(
                update(_revisions).where(_revisions.c.warehouse == warehouse).values(revision=int(current) + 1)
            )

    # --- policies ---------------------------------------------------------------------------------------

    def create_policy(self, warehouse: str, body: dict[str, Any], actor: str) -> Policy:
        """Create a policy from its JSON form; it starts disabled (``enabled: true`` is refused)."""
        unknown = set(body) - {"name", "comment", "policyType", "enabled", "content"}
        if unknown:
            raise BadRequestError(f"unknown policy fields: {sorted(unknown)}")
        name = validate_name("policy", body.get("name"))
        if body.get("enabled", False) is not False:
            raise PolicyError("policy-created-enabled", "a new policy starts disabled: enable it after a preview")
        comment = body.get("comment", "")
        if not isinstance(comment, str):
            raise BadRequestError("comment must be a string")
        policy_type = _policy_type(body.get("policyType"))
        content = parse_content(policy_type, body.get("content"))
        now = int(time.time())
        row = {
            "warehouse": warehouse,
            "name": name,
            "policy_type": policy_type.value,
            "comment": comment,
            "content": json.dumps(content, sort_keys=True),
            "enabled": False,
            "revision": 1,
            "created_by": actor,
            "created_at": now,
            "updated_by": actor,
            "updated_at": now,
        }
        with self._engine.begin() as conn:
            if self._policy_row(conn, warehouse, name) is not None:
                raise AlreadyExistsError(f"policy {name} already exists")
            conn.execute(insert(_policies).values(**row))
            self._history(conn, row, actor, now)
            self._bump(conn, warehouse)
        return self.policy(warehouse, name)

    def update_policy(self, warehouse: str, name: str, changes: dict[str, Any], actor: str) -> Policy:
        """Change comment, content and/or enabled; a new revision (the old one stays in the history)."""
        unknown = set(changes) - {"comment", "content", "enabled"}
        if unknown:
            raise BadRequestError(f"policy fields that cannot change: {sorted(unknown)}")
        with self._engine.begin() as conn:
            row = self._policy_row(conn, warehouse, name)
            if row is None:
                raise NotFoundError(f"policy {name} does not exist")
            values: dict[str, Any] = {}
            if "comment" in changes:
                if not isinstance(changes["comment"], str):
                    raise BadRequestError("comment must be a string")
                values["comment"] = changes["comment"]
            if "content" in changes:
                content = parse_content(PolicyType(row.policy_type), changes["content"])
                values["content"] = json.dumps(content, sort_keys=True)
            if "enabled" in changes:
                if not isinstance(changes["enabled"], bool):
                    raise BadRequestError("enabled must be true or false")
                values["enabled"] = changes["enabled"]
            now = int(time.time())
            values |= {"revision": row.revision + 1, "updated_by": actor, "updated_at": now}
            conn.execute(update(_policies).where(*self._policy_key(warehouse, name)).values(**values))
            merged = {**row._asdict(), **values}
            self._history(conn, merged, actor, now)
            self._bump(conn, warehouse)
        return self.policy(warehouse, name)

    def delete_policy(self, warehouse: str, name: str) -> None:
        with self._engine.begin() as conn:
            if conn.execute(delete(_policies).where(*self._policy_key(warehouse, name))).rowcount == 0:
                raise NotFoundError(f"policy {name} does not exist")
            a = _associations.c
            conn.execute(delete(_associations).where(a.warehouse == warehouse, a.policy_name == name))
            self._bump(conn, warehouse)

    def policy(self, warehouse: str, name: str) -> Policy:
        with self._engine.connect() as conn:
            row = self._policy_row(conn, warehouse, name)
            if row is None:
                raise NotFoundError(f"policy {name} does not exist")
            return self._policy(conn, row)

    def policies(self, warehouse: str) -> list[Policy]:
        c = _policies.c
        with self._engine.connect() as conn:
            rows = conn.execute(select(_policies).where(c.warehouse == warehouse).order_by(c.name)).all()
            return [self._policy(conn, row) for row in rows]

    def history(self, warehouse: str, name: str) -> list[dict[str, Any]]:
        h = _policy_history.c
        query = select(_policy_history).where(h.warehouse == warehouse, h.name == name).order_by(h.revision)
        with self._engine.connect() as conn:
            return [
                {
                    "revision": r.revision,
                    "comment": r.comment,
                    "content": json.loads(r.content),
                    "enabled": bool(r.enabled),
                    "changedBy": r.changed_by,
                    "changedTime": iso_utc(r.changed_at, zulu=True),
                }
                for r in conn.execute(query)
            ]

    # --- associations -----------------------------------------------------------------------------------

    def attach(self, warehouse: str, policy: str, selector: Selector) -> None:
        validate_name("tag", selector.tag)
        value = _validate_value(selector.value)
        with self._engine.begin() as conn:
            if self._policy_row(conn, warehouse, policy) is None:
                raise NotFoundError(f"policy {policy} does not exist")
            row = {
                "warehouse": warehouse,
                "policy_name": policy,
                "tag": selector.tag,
                "selector_value": value or "",
                "all_values": value is None,
            }
            a = _associations.c
            conn.execute(
                delete(_associations).where(
                    a.warehouse == warehouse,
                    a.policy_name == policy,
                    a.tag == selector.tag,
                    a.selector_value == (value or ""),
                )
            )
            conn.execute(insert(_associations).values(**row))
            self._bump(conn, warehouse)

    def detach(self, warehouse: str, policy: str, selector: Selector) -> None:
        a = _associations.c
        stmt = delete(_associations).where(
            a.warehouse == warehouse,
            a.policy_name == policy,
            a.tag == selector.tag,
            a.selector_value == (selector.value or ""),
            a.all_values == (selector.value is None),
        )
        with self._engine.begin() as conn:
            if conn.execute(stmt).rowcount == 0:
                raise NotFoundError(f"policy {policy} is not attached to that tag selector")
            self._bump(conn, warehouse)

    # --- tags -------------------------------------------------------------------------------------------

    def set_tag(self, warehouse: str, target: TagTarget, tag: str, value: str | None) -> None:
        """Assign ``tag`` (with ``value``) to ``target``, replacing the same key's assignment there."""
        validate_name("tag", tag)
        value = _validate_value(value)
        row = {
            "warehouse": warehouse,
            "object_kind": target.kind.value,
            "namespace": _ns(target.namespace),
            "table_name": target.table,
            "column_name": target.column,
            "tag": tag,
            "table_uuid": target.table_uuid,
            "field_id": target.field_id,
            "value": value,
        }
        with self._engine.begin() as conn:
            conn.execute(delete(_tags).where(*self._tag_key(warehouse, target, tag)))
            conn.execute(insert(_tags).values(**row))
            self._bump(conn, warehouse)

    def remove_tag(self, warehouse: str, target: TagTarget, tag: str) -> None:
        with self._engine.begin() as conn:
            if conn.execute(delete(_tags).where(*self._tag_key(warehouse, target, tag))).rowcount == 0:
                raise NotFoundError(f"{target.describe()} has no tag {tag}")
            self._bump(conn, warehouse)

    def tags(self, warehouse: str, namespace: tuple[str, ...] | None = None) -> list[TagAssignment]:
        t = _tags.c
        query = select(_tags).where(t.warehouse == warehouse)
        if namespace is not None:
            query = query.where(t.namespace == _ns(namespace))
        query = query.order_by(t.object_kind, t.namespace, t.table_name, t.column_name, t.tag)
        with self._engine.connect() as conn:
            return [_assignment(row) for row in conn.execute(query)]

    def renamed(self, warehouse: str, source: tuple[tuple[str, ...], str], target: tuple[tuple[str, ...], str]) -> None:
        """Keep table and column tags' names current after a table rename (UUID matching does not need it).

        Tags a dropped table left on the target name stay, except where the renamed table has its own assignment
        of the same key on the same object: that one replaces it (both cannot be kept under one name)."""
        t = _tags.c
        at_source = (t.warehouse == warehouse, t.namespace == _ns(source[0]), t.table_name == source[1])
        at_target = (t.warehouse == warehouse, t.namespace == _ns(target[0]), t.table_name == target[1])
        with self._engine.begin() as conn:
            moving = conn.execute(select(t.object_kind, t.column_name, t.tag).where(*at_source)).all()
            for kind, column, tag in moving:
                same_key = (t.object_kind == kind, t.column_name == column, t.tag == tag)
                conn.execute(delete(_tags).where(*at_target, *same_key))
            conn.execute(update(_tags).where(*at_source).values(namespace=_ns(target[0]), table_name=target[1]))
            self._bump(conn, warehouse)

    def tags_on_name(self, warehouse: str, namespace: tuple[str, ...], table: str) -> list[TagAssignment]:
        """The table and column tags assigned under the name ``namespace.table`` (a dropped table's stay there)."""
        t = _tags.c
        query = select(_tags).where(t.warehouse == warehouse, t.namespace == _ns(namespace), t.table_name == table)
        with self._engine.connect() as conn:
            return [_assignment(row) for row in conn.execute(query)]

    # --- resolution inputs ------------------------------------------------------------------------------

    def inherited_tags(self, warehouse: str, namespace: tuple[str, ...]) -> dict[str, str | None]:
        """The tags a table in ``namespace`` inherits (warehouse and enclosing namespaces; nearest wins)."""
        snapshot = self.snapshot(warehouse, namespace, "", "")  # no table: its own tags stay out
        return {tag: value for tag, (value, _origin) in snapshot.table_tags(namespace).items()}

    def snapshot(self, warehouse: str, namespace: tuple[str, ...], table: str, table_uuid: str) -> GovernanceSnapshot:
        """Everything resolution needs for one table, read in one transaction."""
        t = _tags.c
        ancestors = [_ns(namespace[:i]) for i in range(1, len(namespace) + 1)]
        same_table = or_(
            and_(t.namespace == _ns(namespace), t.table_name == table),
            and_(t.table_uuid == table_uuid, t.table_uuid != ""),
        )
        query = select(_tags).where(
            t.warehouse == warehouse,
            or_(
                t.object_kind == ObjectKind.WAREHOUSE.value,
                and_(t.object_kind == ObjectKind.NAMESPACE.value, t.namespace.in_(ancestors)),
                and_(t.object_kind.in_([ObjectKind.TABLE.value, ObjectKind.COLUMN.value]), same_table),
            ),
        )
        with self._engine.connect() as conn:
            assignments = [_assignment(row) for row in conn.execute(query)]
            rows = conn.execute(select(_policies).where(_policies.c.warehouse == warehouse)).all()
            policies = [self._policy(conn, row) for row in rows]
            revision = self._revision(conn, warehouse)
        return GovernanceSnapshot(tuple(assignments), tuple(policies), revision)

    # --- helpers ----------------------------------------------------------------------------------------

    @staticmethod
    def _policy_key(warehouse: str, name: str) -> tuple[Any, ...]:
        return _policies.c.warehouse == warehouse, _policies.c.name == name

    def _policy_row(self, conn: Connection, warehouse: str, name: str) -> Any:
        return conn.execute(select(_policies).where(*self._policy_key(warehouse, name))).first()

    @staticmethod
    def _policy(conn: Connection, row: Any) -> Policy:
        a = _associations.c
        query = (
            select(_associations)
            .where(a.warehouse == row.warehouse, a.policy_name == row.name)
            .order_by(a.tag, a.all_values.desc(), a.selector_value)
        )
        selectors = tuple(Selector(r.tag, None if r.all_values else r.selector_value) for r in conn.execute(query))
        return Policy(
            warehouse=row.warehouse,
            name=row.name,
            policy_type=PolicyType(row.policy_type),
            comment=row.comment,
            content=json.loads(row.content),
            enabled=bool(row.enabled),
            revision=int(row.revision),
            created_by=row.created_by,
            created_at=float(row.created_at),
            updated_by=row.updated_by,
            updated_at=float(row.updated_at),
            selectors=selectors,
        )

    @staticmethod
    def _history(conn: Connection, row: dict[str, Any], actor: str, now: int) -> None:
        conn.execute(
            insert(_policy_history).values(
                warehouse=row["warehouse"],
                name=row["name"],
                revision=row["revision"],
                comment=row["comment"],
                content=row["content"],
                enabled=row["enabled"],
                changed_by=actor,
                changed_at=now,
            )
        )

    @staticmethod
    def _tag_key(warehouse: str, target: TagTarget, tag: str) -> tuple[Any, ...]:
        t = _tags.c
        return (
            t.warehouse == warehouse,
            t.object_kind == target.kind.value,
            t.namespace == _ns(target.namespace),
            t.table_name == target.table,
            t.column_name == target.column,
            t.tag == tag,
        )


class ColumnTagValue(NamedTuple):
    """One value of a column's tag key and where it came from; ``by_former_name``: found only by a name the
    column no longer has (it carried the name once; older snapshots show it under that name)."""

    value: str | None
    origin: str
    by_former_name: bool = False


@dataclass(frozen=True)
class GovernanceSnapshot:
    assignments: tuple[TagAssignment, ...]
    policies: tuple[Policy, ...]
    revision: int

    def table_tags(self, namespace: tuple[str, ...]) -> dict[str, tuple[str | None, str]]:
        """Effective tags of the table: key -> (value, where it came from); nearest assignment wins."""
        ranked: list[tuple[int, TagAssignment]] = []
        for a in self.assignments:
            kind = a.target.kind
            if kind is ObjectKind.WAREHOUSE:
                ranked.append((0, a))
            elif kind is ObjectKind.NAMESPACE:
                ranked.append((len(a.target.namespace), a))
            elif kind is ObjectKind.TABLE:
                ranked.append((len(namespace) + 1, a))
        return _nearest(ranked)

    def column_tags(
        self,
        namespace: tuple[str, ...],
        columns: Sequence[NestedField],
        table_uuid: str,
        former_names: Mapping[int, Collection[str]] | None = None,
    ) -> dict[int, dict[str, list[ColumnTagValue]]]:
        """Effective tags of the given top-level columns: field id -> key -> every (value, origin) that applies.

        A column tag matches the field with its field id in the same table (a renamed column keeps it) and any
        field with its name (a dropped and re-added column, or a re-created table, keeps it too). ``former_names``
        are more names a field answers to: the names it had in older schemas (older snapshots show a dropped
        column under them, and a column renamed since keeps a tag that matched it by name only).

        A tag matched by its field id, or by the name of a column that never had another, replaces the value the
        column inherits, as the nearest assignment; a renamed column's tags matched by a name only add their values
        to its own (or inherited) one. Names are what anyone who may change the schema chooses: renaming a column
        onto a name tagged ``pii=none`` must not exempt it, nor out of a tagged name and back make a stale value
        the one that counts. Policies select on any value."""
        former = former_names or {}
        table_level = self.table_tags(namespace)
        result: dict[int, dict[str, list[ColumnTagValue]]] = {}
        for field in columns:
            names = {field.name, *former.get(field.field_id, ())}
            own: list[TagAssignment] = []
            named: list[TagAssignment] = []
            for a in self.assignments:
                if a.target.kind is not ObjectKind.COLUMN:
                    continue
                if a.target.field_id == field.field_id and a.target.table_uuid == table_uuid:
                    own.append(a)
                elif a.target.column in names:
                    # A column that only ever had this name (re-added, or of a re-created table) is what it names.
                    (named if len(names) > 1 else own).append(a)
            result[field.field_id] = _column_values(table_level, own, named, field.name)
        return result


def _column_values(
    table_level: dict[str, tuple[str | None, str]], own: list[TagAssignment], named: list[TagAssignment], name: str
) -> dict[str, list[ColumnTagValue]]:
    """Per key, the column's own values (else the inherited one), then each other value a name adds."""
    values = {tag: [ColumnTagValue(*value)] for tag, value in table_level.items()}
    for tag in {a.tag for a in own}:
        values[tag] = []  # the nearest assignment: the inherited value no longer applies
    for a in [*sorted(own, key=_described), *sorted(named, key=_described)]:
        if all(v.value != a.value for v in values.setdefault(a.tag, [])):
            by_former_name = a in named and a.target.column != name
            values[a.tag].append(ColumnTagValue(a.value, a.target.describe(), by_former_name))
    return values


def _described(a: TagAssignment) -> tuple[str, str]:
    return a.tag, a.target.describe()


def _nearest(ranked: list[tuple[int, TagAssignment]]) -> dict[str, tuple[str | None, str]]:
    """Per key, the nearest assignment's value. Two equally near ones with different values (the table's own,
    matched by UUID, and another under its current name) have no nearest: which one wins would decide the
    restrictions by the order of names, so it is an error (the load fails closed)."""
    effective: dict[str, tuple[int, str | None, str]] = {}
    for rank, a in sorted(ranked, key=lambda item: (item[0], item[1].target.describe())):
        previous = effective.get(a.tag)
        if previous is not None and rank == previous[0] and a.value != previous[1]:
            raise PolicyError(
                "resolve-tag-conflict",
                f"tag {a.tag} has different values on {previous[2]} and {a.target.describe()}, both the table's",
            )
        if previous is None or rank >= previous[0]:
            effective[a.tag] = (rank, a.value, a.target.describe())
    return {tag: (value, origin) for tag, (_rank, value, origin) in effective.items()}


def _assignment(row: Any) -> TagAssignment:
    target = TagTarget(
        kind=ObjectKind(row.object_kind),
        namespace=_unns(row.namespace),
        table=row.table_name,
        column=row.column_name,
        table_uuid=row.table_uuid,
        field_id=int(row.field_id),
    )
    return TagAssignment(target, row.tag, row.value)
