"""Principals, OAuth client-credentials tokens, principal roles, groups and grants.

Authentication
    A principal has a client id and a client secret; only a salted scrypt hash of the secret is stored.
    ``POST /v1/oauth/tokens`` (Polaris dialect) calls :meth:`AuthStore.issue_token`, which returns a
    stateless bearer token ``base64url(JSON payload) "." base64url(HMAC-SHA256(signing key, payload))``.
    The payload names the principal, its client id, its secret generation, the active roles (``null`` for
    all), and the issue and expiry times. A token is bound to the principal's current credentials:
    deleting the principal or rotating its secret invalidates every token issued before.

Readers and delegated tokens
    A *reader* is a principal an administrator marked as an engine's service identity (``create-principal
    --reader`` or ``set-trusted-reader P true``); no principal is one by default, and deleting a principal ends
    its reader status. :meth:`AuthStore.issue_delegated_token` (OAuth token exchange, see
    ``sqe_catalog.delegation``) mints a token whose subject is an end user and whose actor is a reader: the
    payload also carries ``act: {"sub": reader}`` and the reader's client id and secret generation. Such a
    token dies with either principal's credentials, never outlives the subject token it came from, and
    :class:`Principal` exposes the actor and whether it is a reader *now* (re-read on every request).

Scope
    Required. Space-separated items, each ``PRINCIPAL_ROLE:ALL`` (every role the principal holds, now and
    later) or ``PRINCIPAL_ROLE:<role>`` (a role the principal holds when the token is issued; the token
    then activates only the named roles). Anything else is ``invalid_scope`` (400).

Authorization model
    A principal holds principal roles directly and through its groups. Its effective roles are re-read
    from the database on every request and intersected with the token's active roles. A grant gives one
    privilege to one role on one securable of one warehouse:

    - catalog level (no namespace, no table): everything in the warehouse;
    - namespace level: that namespace, every nested namespace and every table in any of them;
    - table level: that table only (never its siblings).

    A request for privilege P on an object is allowed when the principal is an admin (admins hold every
    privilege), or when one of its effective roles holds a grant whose privilege implies P on a securable
    that contains the object. Grants are read from the database on every check, so a revoke stops the
    very next request. Implications (transitive; a privilege always implies itself):

    - TABLE_WRITE_DATA → TABLE_READ_DATA, TABLE_WRITE_PROPERTIES
    - TABLE_READ_DATA → TABLE_READ_PROPERTIES, TABLE_LIST
    - TABLE_FULL_METADATA → TABLE_CREATE, TABLE_LIST, TABLE_READ_PROPERTIES, TABLE_WRITE_PROPERTIES,
      TABLE_DROP (never data access)
    - VIEW_READ_PROPERTIES → VIEW_LIST; VIEW_FULL_METADATA → every other VIEW_* privilege
    - NAMESPACE_FULL_METADATA → every other NAMESPACE_* privilege
    - CATALOG_MANAGE_CONTENT → every privilege except CATALOG_MANAGE_ACCESS and CATALOG_MANAGE_POLICIES (data
      access included)
    - CATALOG_MANAGE_ACCESS → nothing else
    - CATALOG_MANAGE_POLICIES (tags and read-restriction policies) → nothing else

    Nothing else is implicit: a table grant does not let its holder list or read the enclosing namespace.
    CATALOG_* privileges can only be granted at catalog level and NAMESPACE_* privileges at catalog or
    namespace level; TABLE_* and VIEW_* privileges at any level (a view is named like a table, and a name is
    a table or a view, never both). Checks on a namespace object use that namespace
    (e.g. NAMESPACE_DROP on ``a.b``); checks for creating or listing children use the parent, with
    ``namespace=None`` meaning the warehouse root.
"""

from __future__ import annotations

import base64
import enum
import functools
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import sqlalchemy
from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Engine,
    Executable,
    ForeignKey,
    Integer,
    Row,
    String,
    Table,
    bindparam,
    delete,
    event,
    insert,
    literal_column,
    select,
    union_all,
    update,
)
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError
from sqlalchemy.sql.elements import BindParameter, ColumnClause

from sqe import vocabulary
from sqe_catalog.config import DEFAULT_SECRET_HASH_SCRYPT_N
from sqe_catalog.errors import (
    AlreadyExistsError,
    BadRequestError,
    ConfigError,
    ForbiddenError,
    NoSuchPrincipalError,
    NotAuthorizedError,
    NotFoundError,
)
from sqe_catalog.schema import METADATA, create_tables, object_key

__all__ = [
    "AuthStore",
    "Grant",
    "GrantSet",
    "Principal",
    "Privilege",
    "VerifiedToken",
    "create_engine_for",
    "describe_securable",
    "implied_privileges",
    "parse_scope",
]


class Privilege(enum.StrEnum):
    CATALOG_MANAGE_CONTENT = "CATALOG_MANAGE_CONTENT"
    CATALOG_MANAGE_ACCESS = "CATALOG_MANAGE_ACCESS"
    # Tags, row-filter and column-mask policies, previews (sqe_catalog.policies); also lets its holder see the
    # policy details of a governed load that fails. Implied by nothing: it can loosen restrictions.
    CATALOG_MANAGE_POLICIES = "CATALOG_MANAGE_POLICIES"
    NAMESPACE_CREATE = "NAMESPACE_CREATE"
    NAMESPACE_LIST = "NAMESPACE_LIST"
    NAMESPACE_READ_PROPERTIES = "NAMESPACE_READ_PROPERTIES"
    NAMESPACE_WRITE_PROPERTIES = "NAMESPACE_WRITE_PROPERTIES"
    NAMESPACE_DROP = "NAMESPACE_DROP"
    NAMESPACE_FULL_METADATA = "NAMESPACE_FULL_METADATA"
    TABLE_CREATE = "TABLE_CREATE"
    TABLE_LIST = "TABLE_LIST"
    TABLE_READ_PROPERTIES = "TABLE_READ_PROPERTIES"
    TABLE_WRITE_PROPERTIES = "TABLE_WRITE_PROPERTIES"
    TABLE_DROP = "TABLE_DROP"
    TABLE_READ_DATA = "TABLE_READ_DATA"
    TABLE_WRITE_DATA = "TABLE_WRITE_DATA"
    TABLE_FULL_METADATA = "TABLE_FULL_METADATA"
    # Views, as in Polaris: list/create on the namespace, the rest on the view (or any level above it).
    VIEW_CREATE = "VIEW_CREATE"
    VIEW_LIST = "VIEW_LIST"
    VIEW_READ_PROPERTIES = "VIEW_READ_PROPERTIES"
    VIEW_WRITE_PROPERTIES = "VIEW_WRITE_PROPERTIES"
    VIEW_DROP = "VIEW_DROP"
    VIEW_FULL_METADATA = "VIEW_FULL_METADATA"

    @classmethod
    def parse(cls, value: str) -> Privilege:
        """The privilege named ``value``; BadRequestError naming the known ones when there is none."""
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise BadRequestError(f"unknown privilege {str(value)[:80]!r}; expected one of {names}") from None


_P = Privilege
_DIRECT_IMPLICATIONS: dict[Privilege, frozenset[Privilege]] = {
    _P.TABLE_WRITE_DATA: frozenset({_P.TABLE_READ_DATA, _P.TABLE_WRITE_PROPERTIES}),
    _P.TABLE_READ_DATA: frozenset({_P.TABLE_READ_PROPERTIES, _P.TABLE_LIST}),
    _P.TABLE_FULL_METADATA: frozenset(
        {_P.TABLE_CREATE, _P.TABLE_LIST, _P.TABLE_READ_PROPERTIES, _P.TABLE_WRITE_PROPERTIES, _P.TABLE_DROP}
    ),
    _P.VIEW_READ_PROPERTIES: frozenset({_P.VIEW_LIST}),
    _P.VIEW_FULL_METADATA: frozenset(
        {_P.VIEW_CREATE, _P.VIEW_LIST, _P.VIEW_READ_PROPERTIES, _P.VIEW_WRITE_PROPERTIES, _P.VIEW_DROP}
    ),
    _P.NAMESPACE_FULL_METADATA: frozenset(
        p for p in Privilege if p.name.startswith("NAMESPACE_") and p is not _P.NAMESPACE_FULL_METADATA
    ),
    _P.CATALOG_MANAGE_CONTENT: frozenset(
        p
        for p in Privilege
        if p not in (_P.CATALOG_MANAGE_ACCESS, _P.CATALOG_MANAGE_CONTENT, _P.CATALOG_MANAGE_POLICIES)
    ),
}


def _closure(privilege: Privilege) -> frozenset[Privilege]:
    seen = {privilege}
    pending = [privilege]
    while pending:
        for implied in _DIRECT_IMPLICATIONS.get(pending.pop(), frozenset()):
            if implied not in seen:
                seen.add(implied)
                pending.append(implied)
    return frozenset(seen)


_IMPLIED: dict[Privilege, frozenset[Privilege]] = {p: _closure(p) for p in Privilege}


def implied_privileges(privilege: Privilege) -> frozenset[Privilege]:
    """Every privilege a grant of ``privilege`` gives, itself included."""
    return _IMPLIED[privilege]


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. ``roles`` are its effective, active roles; it never carries a secret.

    For a delegated token the principal is the end user (grants and restrictions use it), ``actor`` names the
    reader acting for it and ``actor_is_reader`` says whether that actor is a reader at this moment.
    """

    name: str
    client_id: str
    roles: frozenset[str]
    groups: frozenset[str]
    is_admin: bool
    is_reader: bool = False
    actor: str | None = None
    actor_is_reader: bool = False

    @property
    def via_trusted_reader(self) -> bool:
        """True only for a delegated token whose actor is a reader now."""
        return self.actor is not None and self.actor_is_reader


@dataclass(frozen=True)
class Grant:
    role: str
    privilege: Privilege
    warehouse: str
    namespace: tuple[str, ...] | None = None
    table: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "privilege": self.privilege.value,
            "warehouse": self.warehouse,
            "namespace": list(self.namespace) if self.namespace is not None else None,
            "table": self.table,
        }


# --- database schema (plain SQLAlchemy Core: SQLite and PostgreSQL) -------------------------------

_NAME_LEN = 128
_metadata = METADATA  # the catalog's one MetaData (restrictions' tables live on it too)


# The columns that name a principal, role or group in another table's rows, and the row each one names.
_REFERENCES = {
    "principal_name": "sqe_principals.name",
    "role_name": "sqe_principal_roles.name",
    "group_name": "sqe_groups.name",
}


def _key_ref(name: str) -> Column[str]:
    """A primary-key column ``name`` naming a principal, role or group; the row goes when what it names does."""
    return Column(name, String(_NAME_LEN), ForeignKey(_REFERENCES[name], ondelete="CASCADE"), primary_key=True)


def _link_table(name: str, first: str, second: str) -> Table:
    """A table of links between two named things (a principal's roles, a group's members and roles)."""
    return Table(name, _metadata, _key_ref(first), _key_ref(second))


_principals = Table(
    "sqe_principals",
    _metadata,
    Column("name", String(_NAME_LEN), primary_key=True),
    Column("client_id", String(64), nullable=False, unique=True),
    Column("secret_hash", String(256), nullable=False),
    # Bumped on every rotation; tokens carry it, so rotating a secret revokes older tokens.
    Column("secret_generation", Integer, nullable=False),
    Column("is_admin", Boolean, nullable=False),
)
# Reader principals (engine service identities). Opt-in: a principal is a reader only while it has a row here,
# and the row goes with the principal, so re-creating a deleted name never makes it a reader again.
_readers = Table(
    "sqe_readers",
    _metadata,
    _key_ref("principal_name"),
)
_roles = Table("sqe_principal_roles", _metadata, Column("name", String(_NAME_LEN), primary_key=True))
_groups = Table("sqe_groups", _metadata, Column("name", String(_NAME_LEN), primary_key=True))
_role_assignments = _link_table("sqe_principal_role_assignments", "principal_name", "role_name")
_group_members = _link_table("sqe_group_members", "principal_name", "group_name")
_group_roles = _link_table("sqe_group_role_assignments", "group_name", "role_name")
# Empty strings, not NULLs, mark "no namespace"/"no table" so the primary key stays a plain unique key.
_grants = Table(
    "sqe_grants",
    _metadata,
    _key_ref("role_name"),
    Column("privilege", String(64), primary_key=True),
    *object_key(),
)


# The kinds of row the standing statement reads.
_ROLE_ROW, _GROUP_ROW, _READER_ROW = "role", "group", "reader"


def _standing_statement() -> Executable:
    """A principal's roles (direct and through its groups), groups and reader mark in one statement: every request
    re-reads them, and one statement built once replaces four built per request (``principal_for_token`` measured
    1.1-1.6 ms before, 0.35 ms after, with the other per-request reads below also built once)."""
    name: BindParameter[str] = bindparam("name")
    assigned, member, group_role, reader = _role_assignments.c, _group_members.c, _group_roles.c, _readers.c
    via_groups = _group_roles.join(_group_members, group_role.group_name == member.group_name)

    def kind(label: str) -> ColumnClause[str]:  # an inline SQL literal: no bound parameter to type in a UNION
        return literal_column(f"'{label}'", String)

    return union_all(
        select(kind(_ROLE_ROW), assigned.role_name).where(assigned.principal_name == name),
        select(kind(_ROLE_ROW), group_role.role_name).select_from(via_groups).where(member.principal_name == name),
        select(kind(_GROUP_ROW), member.group_name).where(member.principal_name == name),
        select(kind(_READER_ROW), reader.principal_name).where(reader.principal_name == name),
    )


_STANDING = _standing_statement()
# Per-request reads, built once (building a statement costs more than running it on SQLite).
_PRINCIPAL_BY_NAME = select(_principals).where(_principals.c.name == bindparam("name"))
_READER_BY_NAME = select(_readers.c.principal_name).where(_readers.c.principal_name == bindparam("name"))
_GRANTS_OF_ROLES = select(_grants.c.privilege, _grants.c.namespace, _grants.c.table_name).where(
    _grants.c.role_name.in_(bindparam("roles", expanding=True)), _grants.c.warehouse == bindparam("warehouse")
)


@dataclass(frozen=True)
class _Named:
    """A table of named things (principals, roles, groups): how messages call one, the error for a missing name,
    and the columns of other tables that name a row (those rows go with it)."""

    table: Table
    label: str
    missing: type[NotFoundError]
    links: tuple[Column[str], ...]

    def not_found(self, name: str) -> NotFoundError:
        return self.missing(f"{self.label} {name} does not exist")

    def require(self, conn: Connection, name: str) -> None:
        if conn.execute(select(self.table.c.name).where(self.table.c.name == name)).first() is None:
            raise self.not_found(name)


@dataclass(frozen=True)
class _Link:
    """A table of (A, B) links between named things; ``missing`` formats (a, b) when a link to remove is absent."""

    table: Table
    missing: str

    def row(self, first: str, second: str) -> dict[str, str]:
        return dict(zip(self.table.primary_key.columns.keys(), (first, second), strict=True))


_PRINCIPAL = _Named(
    _principals,
    "principal",
    NoSuchPrincipalError,
    (_role_assignments.c.principal_name, _group_members.c.principal_name, _readers.c.principal_name),
)
_ROLE = _Named(
    _roles,
    "principal role",
    NotFoundError,
    (_grants.c.role_name, _role_assignments.c.role_name, _group_roles.c.role_name),
)
_GROUP = _Named(_groups, "group", NotFoundError, (_group_members.c.group_name, _group_roles.c.group_name))
_NAMED_BY_COLUMN = {"principal_name": _PRINCIPAL, "role_name": _ROLE, "group_name": _GROUP}
_ROLE_ASSIGNMENT = _Link(_role_assignments, "principal {} does not hold role {} directly")
_MEMBERSHIP = _Link(_group_members, "principal {} is not a member of group {}")
_GROUP_ROLE = _Link(_group_roles, "group {} does not hold role {}")

_NS_SEP = vocabulary.NAMESPACE_SEPARATOR  # cannot appear in a namespace part, unlike "."


def _encode_namespace(namespace: tuple[str, ...] | None) -> str:
    return _NS_SEP.join(namespace) if namespace else ""


def _decode_namespace(encoded: str) -> tuple[str, ...] | None:
    return tuple(encoded.split(_NS_SEP)) if encoded else None


def create_engine_for(url: str) -> Engine:
    """An engine for ``server.database``; SQLite gets WAL and a busy timeout so the admin CLI and the
    server can write to the same file concurrently."""
    try:
        engine = sqlalchemy.create_engine(url)
    except NoSuchModuleError as exc:  # a subclass of ArgumentError: catch it first
        raise ConfigError(f"server.database: unsupported database dialect ({exc})") from None
    except (ArgumentError, ValueError):
        # The URL itself may hold a database password: never echo it.
        raise ConfigError("server.database is not a valid SQLAlchemy database URL") from None
    except ImportError as exc:
        raise ConfigError(f"server.database: database driver {exc.name or ''} is not installed") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _configure_sqlite_connection)
    return engine


def _configure_sqlite_connection(dbapi_connection: Any, _connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA busy_timeout = 10000")  # first, so switching to WAL waits for locks too
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


# --- names, scopes, secrets and tokens ------------------------------------------------------------

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")
_ALL_ROLES = "ALL"
_SCOPE_PREFIX = "PRINCIPAL_ROLE:"
# pyiceberg's default scope; it asks for no particular role, so it means PRINCIPAL_ROLE:ALL.
_CATALOG_SCOPE = "catalog"
_INVALID_CLIENT = "invalid_client: client authentication failed (unknown client id or wrong secret)"
_INVALID_TOKEN = "invalid bearer token"
_MAX_TOKEN_LEN = 8192


def _validate_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise BadRequestError(
            f"invalid {kind} name {name!r}: use 1-128 letters, digits, '_', '.', '@' or '-', "
            "starting with a letter or digit"
        )


def parse_scope(scope: str) -> frozenset[str] | None:
    """The roles a scope asks for; ``None`` means every role (``PRINCIPAL_ROLE:ALL``)."""
    items = scope.split() if isinstance(scope, str) else []
    if not items:
        raise BadRequestError("invalid_scope: scope is required, e.g. PRINCIPAL_ROLE:ALL")
    roles: set[str] = set()
    for item in items:
        if item == _CATALOG_SCOPE:
            roles.add(_ALL_ROLES)
            continue
        role = item[len(_SCOPE_PREFIX) :] if item.startswith(_SCOPE_PREFIX) else ""
        if role != _ALL_ROLES and not _NAME_RE.fullmatch(role):
            raise BadRequestError(
                f"invalid_scope: scope item {item[:80]!r} must be PRINCIPAL_ROLE:ALL or PRINCIPAL_ROLE:<role>"
            )
        roles.add(role)
    return None if _ALL_ROLES in roles else frozenset(roles)


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_SCRYPT_R = 8
_SCRYPT_P = 1
_SCRYPT_MAXMEM = 256 * 1024 * 1024


def _scrypt(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(secret.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=_SCRYPT_MAXMEM, dklen=32)


def _hash_secret(secret: str, n: int) -> str:
    """``scrypt$n$r$p$salt$hash``: the cost parameters travel with the hash so they can change later."""
    salt = secrets.token_bytes(16)
    digest = _scrypt(secret, salt, n, _SCRYPT_R, _SCRYPT_P)
    return f"scrypt${n}${_SCRYPT_R}${_SCRYPT_P}${_b64encode(salt)}${_b64encode(digest)}"


def _verify_secret(secret: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        computed = _scrypt(secret, _b64decode(salt), int(n), int(r), int(p))
        expected = _b64decode(digest)
    except ValueError:  # a malformed stored hash matches nothing
        return False
    return hmac.compare_digest(computed, expected)


@dataclass(frozen=True)
class _Binding:
    """A principal as a token names it: bound to its client id and secret generation, so that deleting the
    principal or rotating its secret revokes every token naming it."""

    name: str
    client_id: str
    generation: int

    def is_well_typed(self) -> bool:
        return isinstance(self.name, str) and isinstance(self.client_id, str) and type(self.generation) is int


@dataclass(frozen=True)
class _Standing:
    """What a principal holds as of now: every role (direct and through its groups), its groups, whether it is a
    reader."""

    roles: frozenset[str]
    groups: frozenset[str]
    reader: bool


@dataclass(frozen=True)
class _TokenClaims:
    subject: _Binding
    roles: frozenset[str] | None  # None: every role the principal holds
    issued_at: int
    expires_at: int
    actor: _Binding | None = None  # delegated tokens only: the reader acting for the subject


@dataclass(frozen=True)
class VerifiedToken:
    """A bearer token whose signature, expiry and principals' current credentials were checked just now."""

    name: str
    roles: frozenset[str] | None  # the token's active roles (None: every role)
    expires_at: int
    actor: str | None
    is_reader: bool  # whether ``name`` is a reader now
    _claims: _TokenClaims = field(repr=False)

    @property
    def is_delegated(self) -> bool:
        return self.actor is not None


def _sign(signing_key: bytes, payload: str) -> str:
    return _b64encode(hmac.new(signing_key, payload.encode("ascii"), hashlib.sha256).digest())


def _encode_token(signing_key: bytes, claims: _TokenClaims) -> str:
    subject, actor = claims.subject, claims.actor
    body = {
        "v": 1,
        "sub": subject.name,
        "cid": subject.client_id,
        "gen": subject.generation,
        "roles": sorted(claims.roles) if claims.roles is not None else None,
        "iat": claims.issued_at,
        "exp": claims.expires_at,
    }
    if actor is not None:
        body["act"] = {"sub": actor.name}
        body["acid"] = actor.client_id
        body["agen"] = actor.generation
    payload = _b64encode(json.dumps(body, separators=(",", ":"), sort_keys=True).encode("utf-8"))
    return f"{payload}.{_sign(signing_key, payload)}"


def _decode_token(signing_key: bytes, token: str, now: float) -> _TokenClaims:
    """Verified claims of ``token``; NotAuthorizedError if it is malformed, forged or expired."""
    if not isinstance(token, str) or len(token) > _MAX_TOKEN_LEN or not token.isascii():
        raise NotAuthorizedError(_INVALID_TOKEN)
    payload, _, signature = token.partition(".")
    # Compare the canonical encodings so no alternative spelling of a signature is accepted.
    if not signature or not hmac.compare_digest(_sign(signing_key, payload), signature):
        raise NotAuthorizedError(_INVALID_TOKEN)
    try:
        claims = _claims_from_json(json.loads(_b64decode(payload)))
    except (ValueError, TypeError, KeyError):
        raise NotAuthorizedError(_INVALID_TOKEN) from None
    if now >= claims.expires_at:
        raise NotAuthorizedError("bearer token expired")
    return claims


def _claims_from_json(body: Any) -> _TokenClaims:
    if not isinstance(body, dict) or body.get("v") != 1:
        raise ValueError("unsupported token version")
    roles = body["roles"]
    if roles is not None and not (isinstance(roles, list) and all(isinstance(r, str) for r in roles)):
        raise ValueError("roles")
    actor = body.get("act")
    claims = _TokenClaims(
        subject=_Binding(body["sub"], body["cid"], body["gen"]),
        roles=frozenset(roles) if roles is not None else None,
        issued_at=body["iat"],
        expires_at=body["exp"],
        actor=_Binding(actor["sub"], body["acid"], body["agen"]) if actor is not None else None,
    )
    if not claims.subject.is_well_typed():
        raise ValueError("subject")
    if not all(type(v) is int for v in (claims.issued_at, claims.expires_at)):
        raise ValueError("numbers")
    if claims.actor is not None and not claims.actor.is_well_typed():
        raise ValueError("actor")
    return claims


# --- securables -----------------------------------------------------------------------------------


def _normalize_target(namespace: Sequence[str] | None, table: str | None) -> tuple[str, ...] | None:
    ns = tuple(namespace) if namespace else None
    if table is not None and ns is None:
        raise BadRequestError(f"table {table!r} needs a namespace")
    return ns


def _validate_securable(warehouse: str, namespace: tuple[str, ...] | None, table: str | None) -> None:
    if not isinstance(warehouse, str) or not warehouse.strip():
        raise BadRequestError("a grant needs a warehouse name")
    for part in namespace or ():
        if not isinstance(part, str) or not part or _NS_SEP in part or "\x00" in part:
            raise BadRequestError(f"invalid namespace {namespace!r}: empty or invalid part")
    if table is not None and (not isinstance(table, str) or not table or "\x00" in table):
        raise BadRequestError(f"invalid table name {table!r}")


def _check_grant_level(privilege: Privilege, namespace: tuple[str, ...] | None, table: str | None) -> None:
    if privilege.name.startswith("CATALOG_") and namespace is not None:
        raise BadRequestError(f"{privilege.value} can only be granted on a whole warehouse")
    if privilege.name.startswith("NAMESPACE_") and table is not None:
        raise BadRequestError(f"{privilege.value} can be granted on a warehouse or namespace, not a table")


@dataclass(frozen=True)
class GrantSet:
    """One principal's grants in one warehouse, read once: a request checks several privileges against them."""

    principal: str
    warehouse: str
    is_admin: bool
    rows: tuple[tuple[str, str, str], ...] = ()  # (privilege, encoded namespace, table) per grant of its roles

    def covers(self, privilege: Privilege, namespace: tuple[str, ...] | None, table: str | None = None) -> bool:
        privilege = Privilege(privilege)
        ns = _normalize_target(namespace, table)
        if self.is_admin:
            return True
        return any(_grant_covers(granted, scope, on, privilege, ns, table) for granted, scope, on in self.rows)

    def require(self, privilege: Privilege, namespace: tuple[str, ...] | None = None, table: str | None = None) -> None:
        if not self.covers(privilege, namespace, table):
            target = describe_securable(self.warehouse, namespace, table)
            raise ForbiddenError(f"principal {self.principal} lacks {Privilege(privilege).value} on {target}")


def describe_securable(warehouse: str, namespace: Sequence[str] | None, table: str | None = None) -> str:
    return ".".join([warehouse, *(namespace or ()), *([table] if table is not None else [])])


def _grant_covers(
    grant_privilege: str,
    grant_namespace: str,
    grant_table: str,
    privilege: Privilege,
    namespace: tuple[str, ...] | None,
    table: str | None,
) -> bool:
    granted = Privilege.__members__.get(grant_privilege)
    if granted is None or privilege not in implied_privileges(granted):
        return False  # unknown privilege names in the table grant nothing (fail closed)
    scope = _decode_namespace(grant_namespace)
    if scope is None:
        return not grant_table  # catalog level: the whole warehouse
    if namespace is None or namespace[: len(scope)] != scope:
        return False
    if not grant_table:
        return True  # namespace level: nested namespaces and their tables too
    return namespace == scope and table == grant_table


# --- the store ------------------------------------------------------------------------------------

_R = TypeVar("_R")


class AuthStore:
    """Principals, roles, groups and grants in the catalog database, plus bearer tokens.

    Thread-safe: it keeps no state besides the engine and the signing key.
    """

    def __init__(
        self,
        engine: Engine,
        signing_key: bytes,
        token_lifetime_seconds: int,
        *,
        clock: Callable[[], float] = time.time,
        scrypt_n: int = DEFAULT_SECRET_HASH_SCRYPT_N,
    ) -> None:
        if not signing_key:
            raise ConfigError("the token signing key must not be empty")
        if token_lifetime_seconds <= 0:
            raise ConfigError("server.token_lifetime_seconds must be positive")
        if scrypt_n < 2 or scrypt_n & (scrypt_n - 1):
            raise ConfigError("scrypt_n must be a power of two greater than 1")
        self._engine = engine
        self._signing_key = signing_key
        self._token_lifetime_seconds = token_lifetime_seconds
        self._clock = clock
        self._scrypt_n = scrypt_n

    @functools.cached_property
    def _decoy_hash(self) -> str:
        """Checked for unknown client ids so that a miss costs as much time as a wrong secret."""
        return _hash_secret(secrets.token_urlsafe(32), self._scrypt_n)

    def __repr__(self) -> str:
        return f"AuthStore(engine={self._engine!r}, token_lifetime_seconds={self._token_lifetime_seconds})"

    def __getstate__(self) -> NoReturn:
        raise TypeError("AuthStore holds the token signing key and cannot be pickled")

    def create_schema(self) -> None:
        """Create the ``sqe_*`` tables if missing; safe to call from several processes at once."""
        create_tables(self._engine)

    # --- tokens -----------------------------------------------------------------------------------

    def issue_token(self, client_id: str, client_secret: str, scope: str) -> tuple[str, int]:
        """A bearer token and its lifetime in seconds, for the OAuth client-credentials grant."""
        requested = parse_scope(scope)
        with self._engine.connect() as conn:
            row = self._authenticate(conn, client_id, client_secret)
            if requested is not None:
                self._require_held(conn, row.name, requested)
        issued_at = int(self._clock())
        subject = _Binding(row.name, row.client_id, row.secret_generation)
        claims = _TokenClaims(subject, requested, issued_at, issued_at + self._token_lifetime_seconds)
        return _encode_token(self._signing_key, claims), self._token_lifetime_seconds

    def require_roles_held(self, name: str, roles: frozenset[str]) -> None:
        """``invalid_scope`` (BadRequestError) unless principal ``name`` holds every one of ``roles`` now: a scope
        asks only for roles held, whichever grant asks (client credentials or a token exchange)."""
        with self._engine.connect() as conn:
            self._require_held(conn, name, roles)

    def _require_held(self, conn: Connection, name: str, roles: frozenset[str]) -> None:
        missing = sorted(roles - self._standing(conn, name).roles)
        if missing:
            raise BadRequestError(f"invalid_scope: principal does not hold role {missing[0]}")

    def _authenticate(self, conn: Connection, client_id: str, client_secret: str) -> Row[Any]:
        """The principal's row; one message for unknown ids and wrong secrets, and the same scrypt cost."""
        row = None
        if isinstance(client_id, str) and client_id:
            row = conn.execute(select(_principals).where(_principals.c.client_id == client_id)).first()
        stored_hash = row.secret_hash if row is not None else self._decoy_hash
        secret_ok = isinstance(client_secret, str) and _verify_secret(client_secret, stored_hash)
        if row is None or not secret_ok:
            raise NotAuthorizedError(_INVALID_CLIENT)
        return row

    def principal_for_token(self, token: str) -> Principal:
        """The caller behind a bearer token, with roles (and a delegated token's reader) re-read now."""
        claims = _decode_token(self._signing_key, token, self._clock())
        with self._engine.connect() as conn:
            row = self._current_row(conn, claims.subject)
            standing = self._standing(conn, row.name)
            actor_is_reader = False
            if claims.actor is not None:
                self._current_row(conn, claims.actor)
                actor_is_reader = self._is_reader(conn, claims.actor.name)
        roles = standing.roles if claims.roles is None else standing.roles & claims.roles
        actor = claims.actor.name if claims.actor is not None else None
        return Principal(
            row.name, row.client_id, roles, standing.groups, bool(row.is_admin), standing.reader, actor, actor_is_reader
        )

    def anonymous_principal(self, name: str) -> Principal:
        """Sandbox mode (``[server] anonymous_principal``): ``name`` with its current roles, no token at all."""
        with self._engine.connect() as conn:
            row = conn.execute(_PRINCIPAL_BY_NAME, {"name": name}).first()
            if row is None:
                raise NotAuthorizedError("the sandbox's anonymous principal does not exist")
            standing = self._standing(conn, row.name)
        # Never a reader for anyone: an anonymous request carries no delegated subject.
        return Principal(row.name, row.client_id, standing.roles, standing.groups, bool(row.is_admin), standing.reader)

    def verify_token(self, token: str) -> VerifiedToken:
        """Signature, expiry and both principals' current credentials of ``token``; NotAuthorizedError if not."""
        claims = _decode_token(self._signing_key, token, self._clock())
        with self._engine.connect() as conn:
            self._current_row(conn, claims.subject)
            if claims.actor is not None:
                self._current_row(conn, claims.actor)
            is_reader = self._is_reader(conn, claims.subject.name)
        actor = claims.actor.name if claims.actor is not None else None
        return VerifiedToken(claims.subject.name, claims.roles, claims.expires_at, actor, is_reader, claims)

    def issue_delegated_token(
        self, subject: VerifiedToken, actor: VerifiedToken, roles: frozenset[str] | None
    ) -> tuple[str, int]:
        """A token for ``subject`` acted on by ``actor``, expiring no later than the subject token.

        The caller (``sqe_catalog.delegation``) has checked the exchange rules; ``roles`` must be within the
        subject token's roles. Returns the token and its lifetime in seconds (at least 1).
        """
        now = int(self._clock())
        expires_at = min(subject.expires_at, now + self._token_lifetime_seconds)
        if expires_at <= now:
            raise NotAuthorizedError("bearer token expired")
        claims = _TokenClaims(subject._claims.subject, roles, now, expires_at, actor=actor._claims.subject)
        return _encode_token(self._signing_key, claims), expires_at - now

    @staticmethod
    def _current_row(conn: Connection, bound: _Binding) -> Row[Any]:
        row = conn.execute(_PRINCIPAL_BY_NAME, {"name": bound.name}).first()
        if row is None or row.client_id != bound.client_id or row.secret_generation != bound.generation:
            raise NotAuthorizedError("bearer token revoked (principal deleted or secret rotated)")
        return row

    @staticmethod
    def _is_reader(conn: Connection, name: str) -> bool:
        return conn.execute(_READER_BY_NAME, {"name": name}).first() is not None

    # --- readers ----------------------------------------------------------------------------------

    def set_reader(self, name: str, reader: bool) -> None:
        """Make ``name`` a reader (an engine service identity trusted to enforce restrictions) or end that."""

        def run(conn: Connection) -> None:
            _PRINCIPAL.require(conn, name)
            if reader:
                self._insert_missing(conn, _readers, {"principal_name": name})
            else:
                conn.execute(delete(_readers).where(_readers.c.principal_name == name))

        self._write(run)

    def is_reader(self, name: str) -> bool:
        with self._engine.connect() as conn:
            return self._is_reader(conn, name)

    def list_readers(self) -> list[str]:
        with self._engine.connect() as conn:
            return list(conn.execute(select(_readers.c.principal_name).order_by(_readers.c.principal_name)).scalars())

    # --- authorization ----------------------------------------------------------------------------

    def grants(self, p: Principal, warehouse: str) -> GrantSet:
        """``p``'s grants in ``warehouse`` as of now (one query; none for an admin or a principal without roles)."""
        if p.is_admin or not p.roles:
            return GrantSet(p.name, warehouse, p.is_admin)
        with self._engine.connect() as conn:
            rows = conn.execute(_GRANTS_OF_ROLES, {"roles": sorted(p.roles), "warehouse": warehouse}).all()
        return GrantSet(p.name, warehouse, False, tuple((r.privilege, r.namespace, r.table_name) for r in rows))

    def has_privilege(
        self,
        p: Principal,
        privilege: Privilege,
        warehouse: str,
        namespace: tuple[str, ...] | None,
        table: str | None = None,
    ) -> bool:
        return self.grants(p, warehouse).covers(privilege, namespace, table)

    def require(
        self,
        p: Principal,
        privilege: Privilege,
        warehouse: str,
        namespace: tuple[str, ...] | None = None,
        table: str | None = None,
    ) -> None:
        self.grants(p, warehouse).require(privilege, namespace, table)

    # --- principals -------------------------------------------------------------------------------

    def create_principal(self, name: str, is_admin: bool = False, *, reader: bool = False) -> tuple[str, str]:
        """Create a principal (a reader with ``reader``); returns ``(client_id, client_secret)``.

        The secret is not stored anywhere."""
        _validate_name("principal", name)
        client_id = secrets.token_hex(8)
        client_secret = secrets.token_urlsafe(32)
        row = {
            "name": name,
            "client_id": client_id,
            "secret_hash": _hash_secret(client_secret, self._scrypt_n),
            "secret_generation": 1,
            "is_admin": bool(is_admin),
        }
        self._insert_new(_principals, row, f"principal {name} already exists")
        if reader:
            self.set_reader(name, True)
        return client_id, client_secret

    def rotate_secret(self, name: str) -> tuple[str, str]:
        """A new secret for ``name``; tokens issued with the old one stop working."""
        client_secret = secrets.token_urlsafe(32)
        with self._engine.begin() as conn:
            result = conn.execute(
                update(_principals)
                .where(_principals.c.name == name)
                .values(
                    secret_hash=_hash_secret(client_secret, self._scrypt_n),
                    secret_generation=_principals.c.secret_generation + 1,
                )
            )
            if result.rowcount == 0:
                raise _PRINCIPAL.not_found(name)
            client_id: str = conn.execute(
                select(_principals.c.client_id).where(_principals.c.name == name)
            ).scalar_one()
        return client_id, client_secret

    def delete_principal(self, name: str) -> None:
        self._delete_named(_PRINCIPAL, name)

    def list_principals(self) -> list[Principal]:
        """Every principal with all its effective roles (direct and through groups); no secrets."""
        with self._engine.connect() as conn:
            rows = conn.execute(select(_principals).order_by(_principals.c.name)).all()
            result = []
            for row in rows:
                standing = self._standing(conn, row.name)
                principal = Principal(
                    row.name, row.client_id, standing.roles, standing.groups, bool(row.is_admin), standing.reader
                )
                result.append(principal)
        return result

    # --- roles ------------------------------------------------------------------------------------

    def create_role(self, role: str) -> None:
        if role == _ALL_ROLES:
            raise BadRequestError("ALL is reserved (scope PRINCIPAL_ROLE:ALL) and cannot name a role")
        self._create_named(_ROLE, role)

    def assign_role(self, principal: str, role: str) -> None:
        """Give ``principal`` the role; assigning a role it already holds is a no-op."""
        self._link(_ROLE_ASSIGNMENT, principal, role)

    def unassign_role(self, principal: str, role: str) -> None:
        """Take the role from ``principal``; NotFoundError when it does not hold it directly."""
        self._unlink(_ROLE_ASSIGNMENT, principal, role)

    def delete_role(self, role: str) -> None:
        """Delete the role with its grants and every principal's and group's hold of it."""
        self._delete_named(_ROLE, role)

    # --- groups -----------------------------------------------------------------------------------

    def create_group(self, group: str) -> None:
        """Add an empty group (no members, no roles); AlreadyExistsError when it is there."""
        self._create_named(_GROUP, group)

    def delete_group(self, group: str) -> None:
        """Delete the group: its members lose the roles they held only through it."""
        self._delete_named(_GROUP, group)

    def add_to_group(self, principal: str, group: str) -> None:
        """Make ``principal`` a member (a no-op when it is one); its next request holds the group's roles."""
        self._link(_MEMBERSHIP, principal, group)

    def remove_from_group(self, principal: str, group: str) -> None:
        """End a membership; NotFoundError when ``principal`` is not a member."""
        self._unlink(_MEMBERSHIP, principal, group)

    def assign_group_role(self, group: str, role: str) -> None:
        """Give every member of ``group`` the role (a no-op when the group has it)."""
        self._link(_GROUP_ROLE, group, role)

    def unassign_group_role(self, group: str, role: str) -> None:
        """Take the role from the group; NotFoundError when the group does not have it."""
        self._unlink(_GROUP_ROLE, group, role)

    # --- grants -----------------------------------------------------------------------------------

    def grant(
        self,
        role: str,
        privilege: Privilege | str,
        warehouse: str,
        namespace: Sequence[str] | None = None,
        table: str | None = None,
    ) -> None:
        """Grant ``privilege`` to ``role``; granting an existing grant again is a no-op."""
        row = self._grant_row(role, privilege, warehouse, namespace, table)

        def run(conn: Connection) -> None:
            _ROLE.require(conn, role)
            self._insert_missing(conn, _grants, row)

        self._write(run)

    def revoke(self, grant: Grant) -> None:
        """Remove ``grant`` (as ``list_grants`` gives it); NotFoundError when the role has no such grant."""
        role, table = grant.role, grant.table
        row = self._grant_row(role, grant.privilege, grant.warehouse, grant.namespace, table)
        with self._engine.begin() as conn:
            _ROLE.require(conn, role)
            stmt = delete(_grants).where(*(_grants.c[key] == value for key, value in row.items()))
            if conn.execute(stmt).rowcount == 0:
                target = describe_securable(grant.warehouse, _decode_namespace(row["namespace"]), table)
                raise NotFoundError(f"principal role {role} has no grant of {row['privilege']} on {target}")

    def list_grants(self, role: str | None = None) -> list[Grant]:
        g = _grants.c
        query = select(_grants).order_by(g.role_name, g.warehouse, g.namespace, g.table_name, g.privilege)
        with self._engine.connect() as conn:
            if role is not None:
                _ROLE.require(conn, role)
                query = query.where(_grants.c.role_name == role)
            rows = conn.execute(query).all()
        return [
            Grant(
                role=r.role_name,
                privilege=Privilege(r.privilege),
                warehouse=r.warehouse,
                namespace=_decode_namespace(r.namespace),
                table=r.table_name or None,
            )
            for r in rows
            if r.privilege in Privilege.__members__
        ]

    # --- helpers ----------------------------------------------------------------------------------

    @staticmethod
    def _grant_row(
        role: str,
        privilege: Privilege | str,
        warehouse: str,
        namespace: Sequence[str] | None,
        table: str | None,
    ) -> dict[str, str]:
        parsed = Privilege.parse(privilege)
        ns = _normalize_target(namespace, table)
        _validate_securable(warehouse, ns, table)
        _check_grant_level(parsed, ns, table)
        return {
            "role_name": role,
            "privilege": parsed.value,
            "warehouse": warehouse,
            "namespace": _encode_namespace(ns),
            "table_name": table or "",
        }

    @staticmethod
    def _standing(conn: Connection, name: str) -> _Standing:
        """Principal ``name``'s roles (direct and through its groups), groups and reader mark, as of now."""
        rows = [(str(kind), str(value)) for kind, value in conn.execute(_STANDING, {"name": name})]
        roles = frozenset(value for kind, value in rows if kind == _ROLE_ROW)
        groups = frozenset(value for kind, value in rows if kind == _GROUP_ROW)
        return _Standing(roles, groups, any(kind == _READER_ROW for kind, _ in rows))

    def _insert_new(self, table: Table, row: dict[str, Any], duplicate_message: str) -> None:
        try:
            with self._engine.begin() as conn:
                conn.execute(insert(table).values(**row))
        except IntegrityError:
            raise AlreadyExistsError(duplicate_message) from None

    def _link(self, link: _Link, first: str, second: str) -> None:
        """Add a link row once both ends exist; adding one that is already there is a no-op."""
        row = link.row(first, second)

        def run(conn: Connection) -> None:
            self._require_ends(conn, row)
            self._insert_missing(conn, link.table, row)

        self._write(run)

    def _unlink(self, link: _Link, first: str, second: str) -> None:
        """Remove a link row once both ends exist; NotFoundError when it is not there."""
        row = link.row(first, second)

        def run(conn: Connection) -> None:
            self._require_ends(conn, row)
            stmt = delete(link.table).where(*(link.table.c[key] == value for key, value in row.items()))
            if conn.execute(stmt).rowcount == 0:
                raise NotFoundError(link.missing.format(first, second))

        self._write(run)

    def _create_named(self, kind: _Named, name: str) -> None:
        """Add the row ``name`` to a table of names (roles, groups); AlreadyExistsError when it is there."""
        _validate_name(kind.label, name)
        self._insert_new(kind.table, {"name": name}, f"{kind.label} {name} already exists")

    def _delete_named(self, kind: _Named, name: str) -> None:
        """Delete the row ``name`` and every row of other tables whose link column names it."""
        with self._engine.begin() as conn:
            for column in kind.links:
                conn.execute(delete(column.table).where(column == name))
            if conn.execute(delete(kind.table).where(kind.table.c.name == name)).rowcount == 0:
                raise kind.not_found(name)

    def _require_ends(self, conn: Connection, row: dict[str, str]) -> None:
        """Check, in the row's order, that the principal, group or role each column names exists."""
        for column, name in row.items():
            _NAMED_BY_COLUMN[column].require(conn, name)

    @staticmethod
    def _insert_missing(conn: Connection, table: Table, row: dict[str, str]) -> None:
        present = conn.execute(
            select(*table.primary_key.columns).where(*(table.c[k] == v for k, v in row.items()))
        ).first()
        if present is None:
            conn.execute(insert(table).values(**row))

    def _write(self, operation: Callable[[Connection], _R]) -> _R:
        """Run ``operation`` in a transaction, once more if a concurrent writer made it hit a constraint:
        the second run sees that writer's rows and either finds nothing to do or names what vanished."""
        try:
            with self._engine.begin() as conn:
                return operation(conn)
        except IntegrityError:
            with self._engine.begin() as conn:
                return operation(conn)
