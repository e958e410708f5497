"""The Iceberg REST API of ``sqe-catalog`` (Polaris dialect) as a Starlette application.

Every route but ``POST /v1/oauth/tokens`` needs a bearer token, and every error is the spec's ErrorModel
``{"error": {"message", "type", "code"}}`` (the token endpoint answers in OAuth's error shape instead).
Handlers are synchronous and run in Starlette's thread pool: pyiceberg, SQLAlchemy, scrypt and STS all block.

Authorisation (``AuthStore.require``), Polaris-like:

- namespaces: list ``NAMESPACE_LIST`` on the parent, create ``NAMESPACE_CREATE`` on the parent, load
  ``NAMESPACE_READ_PROPERTIES``, exists ``NAMESPACE_LIST`` or ``NAMESPACE_READ_PROPERTIES``, drop
  ``NAMESPACE_DROP``, update properties ``NAMESPACE_WRITE_PROPERTIES``;
- tables: list ``TABLE_LIST`` on the namespace, exists ``TABLE_LIST`` on the namespace or
  ``TABLE_READ_PROPERTIES`` on the table, load ``TABLE_READ_PROPERTIES``, create and register
  ``TABLE_CREATE`` on the namespace, commit ``TABLE_WRITE_PROPERTIES`` (``TABLE_CREATE`` for a create
  transaction), drop and purge ``TABLE_DROP``, rename ``TABLE_DROP`` on the source and ``TABLE_CREATE`` on
  the target namespace;
- data access: with ``X-Iceberg-Access-Delegation: vended-credentials`` (load, create, register) and on the
  credentials endpoint, ``TABLE_READ_DATA`` is required and the credential can write iff the caller holds
  ``TABLE_WRITE_DATA``. Without the header a response carries no key at all.

Read-restrictions (``sqe_catalog.restrictions``): every response that carries a restricted table's metadata or
storage credentials (load, create, register, commit, credentials) first resolves the end user's restrictions and
answers 406 to a client that did not declare ``read-restrictions.v1`` and 403 to anything but a delegated token
whose actor is a trusted reader (``sqe_catalog.delegation``); a load then returns them as ``read-restrictions``,
with read-only credentials. Commits by a restricted end user are refused. This happens before the ETag
comparison; the ETag of a restricted response digests the principal and its restrictions, and every ETag
digests the actor. Each governed response leaves one ``sqe_catalog.audit`` line. A schema change (commit, create,
create transaction, register, notification UPDATE or CREATE) that would leave some reader's restrictions
unresolvable, or make a reader's row filter read other columns, needs ``CATALOG_MANAGE_POLICIES``
(``sqe_catalog.policies.schema_change``).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import json
import logging
import secrets
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import anyio
import anyio.to_thread
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.table.metadata import TableMetadata
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sqe import vocabulary
from sqe._net import is_loopback
from sqe.locations import is_object_store
from sqe.vocabulary import ACCESS_TOKEN_TYPE, NAMESPACE_SEPARATOR_PROPERTY, REQUEST_ID_HEADER, TOKEN_EXCHANGE_GRANT
from sqe_catalog import audit
from sqe_catalog.auth import AuthStore, GrantSet, Principal, Privilege, create_engine_for
from sqe_catalog.config import CatalogServerConfig, WarehouseConfig, overlap_message, overlapping_warehouses
from sqe_catalog.contention import CLIENT_LEFT
from sqe_catalog.delegation import TokenExchangeError, exchange_token
from sqe_catalog.errors import (
    AlreadyExistsError,
    BadRequestError,
    CatalogError,
    ConfigError,
    ForbiddenError,
    NotAcceptableError,
    NotAuthorizedError,
    NotFoundError,
    UnprocessableEntityError,
    describe_database_error,
)
from sqe_catalog.etag import if_none_match_matches, table_etag
from sqe_catalog.identifiers import parse_namespace_path
from sqe_catalog.integrity.cleaner import BackgroundCleaner
from sqe_catalog.integrity.guard import Judge
from sqe_catalog.integrity.notifications import metadata_response_json, parse_notification
from sqe_catalog.planning import PlanOwner, PlanStore, parse_plan_request, plan_files, response_tasks
from sqe_catalog.policies.service import policy_errors, selector_from_json, target_from_json
from sqe_catalog.policies.store import PolicyStore
from sqe_catalog.restrictions import (
    DroppedGovernance,
    GovernedLoadError,
    ResolvedRestrictions,
    RestrictionStore,
    declared_capabilities,
    refuse_restricted_write,
    require_capability,
)
from sqe_catalog.tables import (
    CommitBody,
    Namespace,
    PendingTable,
    StoredTable,
    WarehouseTables,
    catalog_io_properties,
    dropped_location_reuse,
    foreign_file_reads,
    is_create_transaction,
    namespace_area_claims,
    parse_commit_body,
    parse_create_body,
    validate_namespace,
    validate_table_name,
    with_default_properties,
)
from sqe_catalog.vending import CredentialVendor
from sqe_catalog.views import StoredView, ViewStore, validate_view_name

__all__ = ["ENDPOINTS", "create_app"]

log = logging.getLogger("sqe_catalog")

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_PAGE_SIZE = 1000
# Table and view commits apply their updates one by one, each over the metadata built so far: the cost grows with
# the square of their count (16,000 updates held a core for close to a minute), so one commit carries at most this.
MAX_COMMIT_UPDATES = 1000
# Namespace properties are rows of the catalog's database, written in one transaction: 150,000 of them in one
# request held the (SQLite) write lock for 25 s, and every other caller's write failed meanwhile. One request sets,
# or removes, at most this many.
MAX_NAMESPACE_PROPERTIES = 1000
POLARIS_BASE_PATH = "/api/catalog"  # Polaris mode: where Polaris serves the Iceberg REST API
_JSON = "application/json"


# ----------------------------------------------------------------------------------------------------
# Application state and the per-request call


@dataclass(frozen=True)
class _Warehouse:
    """The stores and I/O of one configured warehouse, built once at start-up."""

    config: WarehouseConfig
    tables: WarehouseTables
    vendor: CredentialVendor
    views: ViewStore
    io: FileIO  # the catalog's own FileIO for server-side planning (manifests never leave the catalog)


# Requests that change the catalog (all but GET/HEAD and the few _Op.reads: scan planning, a restrictions preview)
# run on at most WRITE_THREADS threads at once, apart from the threads reads and token requests take (Starlette's
# pool of 40). A claim that keeps losing to other catalog processes' claims waits out its backoff in its thread (up
# to contention.PATIENCE_SECONDS): a burst of those took every thread, and loads, listings and tokens queued behind
# them; now such writes queue behind each other only.
WRITE_THREADS = 16
_READS = frozenset({"GET", "HEAD"})


class _WriteThreads:
    """The writes' limiter, made on first use in the server's event loop (older anyio binds it on creation)."""

    def __init__(self) -> None:
        self._limiter: anyio.CapacityLimiter | None = None

    def limiter(self) -> anyio.CapacityLimiter:
        if self._limiter is None:  # only the event loop's one thread gets here
            self._limiter = anyio.CapacityLimiter(WRITE_THREADS)
        return self._limiter


@dataclass(frozen=True)
class _State:
    """Everything the handlers share for the server's lifetime (the app's one state object)."""

    engine: Engine
    auth: AuthStore
    restrictions: RestrictionStore
    warehouses: dict[str, _Warehouse]
    config: CatalogServerConfig
    plans: PlanStore
    anonymous_principal: str | None = None
    policies: PolicyStore | None = None  # None: [server] read_restriction_policies is off
    polaris_compat: bool = False  # Polaris mode (see ServerConfig.polaris_compat)
    writes: _WriteThreads = field(default_factory=_WriteThreads)


@dataclass
class _Call:
    """One authenticated request as the synchronous handlers see it."""

    request: Request
    state: _State
    raw_body: bytes | None
    principal: Principal = field(init=False)
    grant_set: GrantSet | None = field(default=None, init=False, repr=False)

    @property
    def prefix(self) -> str:
        return str(self.request.path_params["prefix"])

    @property
    def warehouse(self) -> _Warehouse:
        found = self.state.warehouses.get(self.prefix)
        if found is None:
            raise NotFoundError(f"unknown warehouse: {self.prefix}")
        return found

    @property
    def namespace(self) -> Namespace:
        return parse_namespace_path(str(self.request.path_params["namespace"]))

    @property
    def table(self) -> str:
        return validate_table_name(str(self.request.path_params["table"]))

    def json(self) -> dict[str, Any]:
        if not self.raw_body:
            raise BadRequestError("request body must be a JSON object")
        try:
            body = json.loads(self.raw_body)
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested deeper than json can parse
            raise BadRequestError("malformed JSON in request body") from None
        if not isinstance(body, dict):
            raise BadRequestError("request body must be a JSON object")
        return body

    def require(self, privilege: Privilege, namespace: Namespace | None = None, table: str | None = None) -> None:
        self._grants().require(privilege, namespace, table)

    def allowed(self, privilege: Privilege, namespace: Namespace | None = None, table: str | None = None) -> bool:
        return self._grants().covers(privilege, namespace, table)

    def _grants(self) -> GrantSet:
        """The caller's grants in this warehouse, read once per request (a load checks up to four privileges)."""
        prefix = self.prefix
        if self.grant_set is None or self.grant_set.warehouse != prefix:
            self.grant_set = self.state.auth.grants(self.principal, prefix)
        return self.grant_set

    def query(self, name: str) -> str | None:
        return self.request.query_params.get(name)


Handler = Callable[[_Call], Response]


# ----------------------------------------------------------------------------------------------------
# Responses


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status, headers, media_type=_JSON)


def _no_content() -> Response:
    return Response(status_code=204)


def _error(exc: CatalogError) -> Response:
    return _json(exc.to_json(), exc.status, exc.headers() or None)


def _internal_error(request_id: str) -> Response:
    """A clean 500: the ErrorModel names the request id under which the failure was logged, nothing more."""
    response = _error(CatalogError(f"internal server error (request id {request_id})"))
    response.headers[REQUEST_ID_HEADER] = request_id
    return response


def _new_request_id() -> str:
    return uuid.uuid4().hex[:16]


# ----------------------------------------------------------------------------------------------------
# Parsing helpers


def _property_map(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadRequestError(f"{what} must be an object of string values")
    _check_property_count(len(value), what)
    return dict(value)


def _property_list(value: object, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequestError(f"{what} must be a list of strings")
    _check_property_count(len(value), what)
    return list(value)


def _check_property_count(count: int, what: str) -> None:
    if count > MAX_NAMESPACE_PROPERTIES:
        raise BadRequestError(
            f"{what} holds {count} namespace properties, more than {MAX_NAMESPACE_PROPERTIES} in one request "
            "(MAX_NAMESPACE_PROPERTIES); send them in several"
        )


@dataclass(frozen=True)
class _ObjectKind:
    """Tables or views, as far as identifiers in request bodies and renames treat them alike."""

    label: str
    validate_name: Callable[[object], str]
    drop: Privilege
    create: Privilege


_TABLE_KIND = _ObjectKind("table", validate_table_name, Privilege.TABLE_DROP, Privilege.TABLE_CREATE)
_VIEW_KIND = _ObjectKind("view", validate_view_name, Privilege.VIEW_DROP, Privilege.VIEW_CREATE)


def _identifier(value: object, what: str, kind: _ObjectKind) -> tuple[Namespace, str]:
    if not isinstance(value, dict):
        raise BadRequestError(f"{what} must be a {kind.label} identifier object")
    return validate_namespace(value.get("namespace")), kind.validate_name(value.get("name"))


def _rename_endpoints(call: _Call, kind: _ObjectKind) -> tuple[tuple[Namespace, str], tuple[Namespace, str]]:
    """A rename body's source and destination, once the caller may drop the source and create in the
    destination's namespace."""
    body = call.json()
    source = _identifier(body.get("source"), "source", kind)
    target = _identifier(body.get("destination"), "destination", kind)
    call.require(kind.drop, *source)
    call.require(kind.create, target[0])
    return source, target


def _commit_json(call: _Call, what: str) -> dict[str, Any]:
    """A commit body whose ``updates`` list is within ``MAX_COMMIT_UPDATES``, checked before anything parses it."""
    body = call.json()
    updates = body.get("updates")
    if isinstance(updates, list) and len(updates) > MAX_COMMIT_UPDATES:
        raise BadRequestError(
            f"a {what} commit carries at most {MAX_COMMIT_UPDATES} updates, this one has {len(updates)}; "
            "split it into several commits"
        )
    return body


def _bool_query(call: _Call, name: str) -> bool:
    raw = (call.query(name) or "false").lower()
    if raw not in ("true", "false"):
        raise BadRequestError(f"query parameter {name} must be true or false")
    return raw == "true"


def _page(items: Sequence[Any], call: _Call) -> tuple[list[Any], str | None]:
    """Offset paging: ``pageToken`` is the opaque start offset, ``pageSize`` the page length."""
    try:
        start = int(call.query("pageToken") or 0)
        size = int(call.query("pageSize") or 0) or MAX_PAGE_SIZE
    except ValueError:
        raise BadRequestError("pageToken and pageSize must be integers") from None
    if start < 0 or size < 0:
        raise BadRequestError("pageToken and pageSize must not be negative")
    size = min(size, MAX_PAGE_SIZE)
    end = start + size
    return list(items[start:end]), (str(end) if end < len(items) else None)


def _delegation_requested(request: Request) -> bool:
    """``vended-credentials`` (or Polaris's legacy ``true``) in the comma-separated header; others ignored."""
    values = {v.strip().lower() for v in request.headers.get(vocabulary.ACCESS_DELEGATION_HEADER, "").split(",")}
    return bool(values & {vocabulary.VENDED_CREDENTIALS, vocabulary.VENDED_CREDENTIALS_LEGACY})


# ----------------------------------------------------------------------------------------------------
# Configuration and namespaces


def _get_config(call: _Call) -> Response:
    name = call.query("warehouse")
    polaris = call.state.polaris_compat
    if name is None and len(call.state.warehouses) == 1 and not polaris:
        name = next(iter(call.state.warehouses))
    if name is None:
        raise BadRequestError("query parameter warehouse is required")
    if name not in call.state.warehouses:
        raise NotFoundError(f"unknown warehouse: {name}")
    defaults = _config_defaults(call.state.warehouses[name].config)
    if polaris:  # Polaris returns the catalog's properties, default-base-location among them, as defaults
        defaults["default-base-location"] = call.state.warehouses[name].config.location
    return _json(
        {
            "defaults": defaults,
            "overrides": {"prefix": name},
            "endpoints": _advertised_endpoints(call.state),
        }
    )


# -- sql-catalog: /v1/config defaults -----------------------------------------------------------------


def _config_defaults(w: WarehouseConfig) -> dict[str, str]:
    """What a client without vending needs to reach the store; the separator lets a level contain '.'."""
    defaults = {
        NAMESPACE_SEPARATOR_PROPERTY: quote(vocabulary.NAMESPACE_SEPARATOR),
        vocabulary.CLIENT_REGION: w.region,
        vocabulary.S3_REGION: w.region,
        vocabulary.S3_PATH_STYLE_ACCESS: str(w.path_style).lower(),
    }
    if w.endpoint:
        defaults[vocabulary.S3_ENDPOINT] = w.endpoint
    return defaults


def _advertised_endpoints(state: _State) -> list[str]:
    planning = {f"{op.method} {op.path}" for op in _PLANNING_OPERATIONS}
    return [e for e in ENDPOINTS if state.config.server.scan_planning or e not in planning]


# -- end sql-catalog: /v1/config defaults -------------------------------------------------------------


def _list_namespaces(call: _Call) -> Response:
    parent_raw = call.query("parent")
    parent = parse_namespace_path(parent_raw) if parent_raw else None
    call.require(Privilege.NAMESPACE_LIST, parent)
    found = call.warehouse.tables.list_namespaces(parent)
    page, token = _page(found, call)
    return _json({"namespaces": [list(ns) for ns in page], "next-page-token": token})


def _create_namespace(call: _Call) -> Response:
    body = call.json()
    namespace = validate_namespace(body.get("namespace"))
    properties = _property_map(body.get("properties"), "properties")
    call.require(Privilege.NAMESPACE_CREATE, namespace[:-1] or None)
    stored = call.warehouse.tables.create_namespace(namespace, properties)
    return _json({"namespace": list(namespace), "properties": stored})


def _load_namespace(call: _Call) -> Response:
    namespace = call.namespace
    call.require(Privilege.NAMESPACE_READ_PROPERTIES, namespace)
    properties = call.warehouse.tables.load_namespace(namespace)
    return _json({"namespace": list(namespace), "properties": properties})


def _namespace_exists(call: _Call) -> Response:
    namespace = call.namespace
    if not call.allowed(Privilege.NAMESPACE_READ_PROPERTIES, namespace):
        call.require(Privilege.NAMESPACE_LIST, namespace)
    return Response(status_code=204 if call.warehouse.tables.namespace_exists(namespace) else 404)


def _drop_namespace(call: _Call) -> Response:
    namespace = call.namespace
    call.require(Privilege.NAMESPACE_DROP, namespace)
    call.warehouse.tables.drop_namespace(namespace)
    return _no_content()


def _update_namespace_properties(call: _Call) -> Response:
    namespace = call.namespace
    body = call.json()
    removals = _property_list(body.get("removals"), "removals")
    updates = _property_map(body.get("updates"), "updates")
    call.require(Privilege.NAMESPACE_WRITE_PROPERTIES, namespace)
    both = sorted(set(removals) & set(updates))
    if both:
        raise UnprocessableEntityError(f"property {both[0]!r} is in both removals and updates")
    return _json(call.warehouse.tables.update_namespace_properties(namespace, removals, updates))


# ----------------------------------------------------------------------------------------------------
# Tables


@dataclass(frozen=True)
class _DataAccess:
    write: bool


def _data_access(call: _Call, namespace: Namespace, table: str) -> _DataAccess | None:
    """What the caller gets vended, or None when it did not ask; raises 403 without TABLE_READ_DATA."""
    if not _delegation_requested(call.request):
        return None
    if call.allowed(Privilege.TABLE_WRITE_DATA, namespace, table):
        return _DataAccess(write=True)
    call.require(Privilege.TABLE_READ_DATA, namespace, table)
    return _DataAccess(write=False)


def _refresh_endpoint(prefix: str, namespace: Namespace, table: str) -> str:
    encoded_ns = quote(vocabulary.NAMESPACE_SEPARATOR).join(quote(level, safe="") for level in namespace)
    return f"v1/{quote(prefix, safe='')}/namespaces/{encoded_ns}/tables/{quote(table, safe='')}/credentials"


def _storage_credentials(call: _Call, table: StoredTable, access: _DataAccess) -> list[dict[str, Any]]:
    warehouse = call.warehouse
    if not warehouse.config.vend_credentials or not is_object_store(table.location):
        return []  # vending switched off, or local files that need no credential
    principal = call.principal
    credential = warehouse.vendor.vend(principal.name, table.key, table.locations, access.write, reader=principal.actor)
    # A drop or move since the table was read: its place may be free; a staged place: reserved until this expiry.
    warehouse.tables.require_holding(table, credential.expires_at_ms)
    return [{"prefix": table.location, "config": credential.to_config()}]


def _client_config(call: _Call, table: StoredTable) -> dict[str, str]:
    w = call.warehouse.config
    config = {
        vocabulary.CLIENT_REGION: w.region,
        vocabulary.S3_PATH_STYLE_ACCESS: str(w.path_style).lower(),
        vocabulary.CLIENT_REFRESH_CREDENTIALS_ENDPOINT: _refresh_endpoint(call.prefix, table.namespace, table.name),
    }
    if w.endpoint:
        config[vocabulary.S3_ENDPOINT] = w.endpoint
    return config


def _snapshots_mode(call: _Call) -> str:
    mode = call.query("snapshots") or "all"
    if mode not in ("all", "refs"):
        raise BadRequestError("query parameter snapshots must be all or refs")
    return mode


def _metadata_json(table: StoredTable, snapshots: str) -> str:
    # The complete document (format-version 3 and the fields pyiceberg's model drops), not model_dump_json.
    return metadata_response_json(table.metadata, table.document, refs_only=snapshots == "refs")


# Operations that change an existing table: refused to a caller with read-restrictions on it, even through a
# trusted reader (a rename out of a tagged namespace, or a re-admission of other metadata, would shed them).
_WRITE_OPERATIONS = frozenset(
    {"commit", "rename", "register-overwrite", "notification-update", "notification-drop", "drop"}
)


# A drop without purge never reads the table's metadata, so a table whose metadata is lost can still be dropped.
_DROPS = frozenset({"drop", "notification-drop"})


def _refuse_restricted_change(call: _Call, namespace: Namespace, name: str, operation: str) -> StoredTable | None:
    """The table the operation changes (None: a drop of one whose metadata cannot be read), after the gate."""
    try:
        table = call.warehouse.tables.load_table(namespace, name)
    except (BadRequestError, UnprocessableEntityError):  # its metadata file is missing, invalid or not trusted
        # Nothing to resolve restrictions on: a drop goes by the name, which entries and tags keep, and is refused
        # (the load's error) where either names the table, whoever the caller: its restrictions are unknowable.
        # A transient failure (storage unreachable) is no such file: it fails as it would anyway.
        governance = call.state.restrictions.dropped_table_governance(call.prefix, namespace, name)
        if operation not in _DROPS or governance is not None:
            raise
        return None
    _restrictions(call, table, operation)
    return table


def _restrictions(
    call: _Call, table: StoredTable, operation: str, before_refusal: Callable[[], object] | None = None
) -> ResolvedRestrictions | None:
    """The end user's read-restrictions on ``table`` after the delivery gate (406 undeclared, 403 unless through a
    trusted reader, 403 for any commit); a refusal is audited here, a served response by the caller.

    ``before_refusal`` runs before a refusal is audited: a load whose integrity check is still in flight settles
    it there, so a rewritten file is answered (422) and not audited as the gate's refusal it never was."""
    principal = call.principal
    what = _table_name(call, table)
    settle = before_refusal or (lambda: None)
    try:
        resolved = _resolve(call, table)
    except CatalogError as exc:
        settle()
        _audit(call, operation, what, None, "refused-unusable", exc.status)
        raise
    if resolved is None:
        return None
    declared = vocabulary.READ_RESTRICTIONS_V1 in declared_capabilities(
        call.request.headers.getlist(vocabulary.CAPABILITIES_HEADER)
    )
    try:
        require_capability(resolved, declared=declared, via_trusted_reader=principal.via_trusted_reader, what=what)
    except CatalogError as exc:
        settle()
        outcome = "refused-capability" if isinstance(exc, NotAcceptableError) else "refused-untrusted"
        _audit(call, operation, what, resolved, outcome, exc.status)
        raise
    if operation in _WRITE_OPERATIONS:
        try:
            refuse_restricted_write(resolved)
        except CatalogError as exc:
            settle()
            _audit(call, operation, what, resolved, "refused-write", exc.status)
            raise
    return resolved


# -- policies: governed resolution with a request id (sqe_catalog.policies) ---------------------------------


def _request_id(call: _Call) -> str:
    """One id per request, in the governed error and the catalog's log line."""
    state = call.request.state
    if not hasattr(state, "request_id"):
        state.request_id = secrets.token_hex(8)
    return str(state.request_id)


def _resolve(call: _Call, table: StoredTable) -> ResolvedRestrictions | None:
    principal = call.principal
    try:
        return call.state.restrictions.resolve(
            call.prefix,
            table,
            principal.name,
            principal.groups,
            request_id=_request_id(call),
            show_detail=call.allowed(Privilege.CATALOG_MANAGE_POLICIES),
        )
    except GovernedLoadError as exc:
        log.warning(
            "governed %s %s refused: code=%s request_id=%s end_user=%s reader=%s",
            call.request.method,
            _table_name(call, table),
            exc.code,
            exc.request_id,
            principal.name,
            principal.actor or "-",
        )
        raise


# -- end policies ---------------------------------------------------------------------------------------


def _table_name(call: _Call, table: StoredTable) -> str:
    return ".".join([call.prefix, *table.namespace, table.name])


def _audit(
    call: _Call, operation: str, what: str, restricted: ResolvedRestrictions | None, outcome: str, status: int
) -> None:
    principal = call.principal
    digest = restricted.digest if restricted is not None else ""
    audit.governed_response(
        operation=operation,
        end_user=principal.name,
        reader=principal.actor,
        table=what,
        digest=digest,
        outcome=outcome,
        status=status,
    )


def _served(
    call: _Call, operation: str, table: StoredTable, restricted: ResolvedRestrictions | None, status: int = 200
) -> None:
    """The audit line of a governed response that was given out (nothing for unrestricted tables)."""
    if restricted is not None:
        _audit(call, operation, _table_name(call, table), restricted, "served", status)


def _governed_access(access: _DataAccess | None, restricted: ResolvedRestrictions | None) -> _DataAccess | None:
    """A restricted end user never gets a credential that writes, even through a reader."""
    if access is not None and restricted is not None:
        return _DataAccess(write=False)
    return access


def _table_response(
    call: _Call,
    table: StoredTable,
    access: _DataAccess | None,
    snapshots: str = "all",
    restricted: ResolvedRestrictions | None = None,
) -> Response:
    """A LoadTableResult: metadata, then (only when delegated) client config and storage credentials, then the
    caller's read-restrictions (the gate has passed: ``restricted`` comes from ``_restrictions``)."""
    parts = []
    if table.metadata_location is not None:
        parts.append(f'"{vocabulary.METADATA_LOCATION}":{json.dumps(table.metadata_location)}')
    parts.append(f'"metadata":{_metadata_json(table, snapshots)}')
    config = _client_config(call, table) if access is not None else {}
    credentials = _storage_credentials(call, table, access) if access is not None else []
    if credentials and _credential_in_config(call, table):
        config.update(credentials[0]["config"])
    parts.append(f'"config":{json.dumps(config)}')
    if access is not None:
        parts.append(f'"{vocabulary.STORAGE_CREDENTIALS}":{json.dumps(credentials)}')
    if restricted is not None:
        parts.append(f'"{vocabulary.READ_RESTRICTIONS}":{json.dumps(restricted.wire, separators=(",", ":"))}')
    headers = {}
    if table.metadata_location is not None:
        headers["ETag"] = _etag_for(call, table, snapshots, access, restricted.digest if restricted else "")
    return Response("{" + ",".join(parts) + "}", 200, headers, media_type=_JSON)


def _credential_in_config(call: _Call, table: StoredTable) -> bool:
    """Whether the vended keys go into ``config`` too: always in Polaris mode (Polaris copies them into every
    LoadTableResult), else for a staged table only. pyiceberg picks a ``storage-credentials`` entry by the answer's
    metadata-location, which a staged table lacks: without the copy, a create transaction's appends write without
    keys. The copy is the entry's own credential (same caller, scope and expiry): nobody gains a key by it."""
    return call.state.polaris_compat or table.metadata_location is None


def _etag_for(
    call: _Call, table: StoredTable, snapshots: str, access: _DataAccess | None, restrictions_digest: str = ""
) -> str:
    assert table.metadata_location is not None
    return table_etag(
        table.metadata_location,
        snapshots=snapshots,
        vended=access is not None,
        write=access is not None and access.write,
        restrictions_digest=restrictions_digest,
        actor=call.principal.actor or "",
    )


def _list_tables(call: _Call) -> Response:
    namespace = call.namespace
    call.require(Privilege.TABLE_LIST, namespace)
    names = call.warehouse.tables.list_tables(namespace)
    page, token = _page(names, call)
    identifiers = [{"namespace": list(namespace), "name": name} for name in page]
    return _json({"identifiers": identifiers, "next-page-token": token})


def _create_table(call: _Call) -> Response:
    namespace = call.namespace
    create = parse_create_body(call.json())
    call.require(Privilege.TABLE_CREATE, namespace)
    _refuse_view_name(call, namespace, create.name)
    defaults = call.state.config.server.default_table_properties  # sql-catalog: conventional defaults
    create = dataclasses.replace(create, properties={**defaults, **create.properties})
    access = _data_access(call, namespace, create.name)
    tables = call.warehouse.tables
    make = tables.stage_table if create.stage_create else tables.create_table
    table, restricted = _gated(call, "create", tables.pending_table(namespace, create), lambda: make(namespace, create))
    response = _table_response(call, table, _governed_access(access, restricted), restricted=restricted)
    _served(call, "create", table, restricted)
    return response


def _gated(
    call: _Call,
    operation: str,
    pending: StoredTable,
    make: Callable[[], StoredTable],
    replaced: StoredTable | None = None,
) -> tuple[StoredTable, ResolvedRestrictions | None]:
    """A new table (create, stage-create, create transaction, register) made by ``make`` and its restrictions.

    The gate runs first on ``pending``, what the operation would write: a refused caller must not leave a table
    (or a staged create's reservation) behind; then again on the table made, whose restrictions are answered.
    Its schema must leave every reader's restrictions resolvable (as a commit's), where ``replaced`` (the table a
    register overwrites) did: judged first then, as a commit's; after the gate for a new table, so what fails for
    every reader, the creator included, is still the gate's refusal."""
    if replaced is not None:
        _refuse_breaking_schema(call, replaced, pending)
    _restrictions(call, pending, operation)
    if replaced is None:
        _refuse_breaking_schema(call, None, pending)
    table = make()
    return table, _restrictions(call, table, operation)


def _register_table(call: _Call) -> Response:
    namespace = call.namespace
    body = call.json()
    name = validate_table_name(body.get("name"))
    metadata_location = body.get(vocabulary.METADATA_LOCATION)
    if not isinstance(metadata_location, str) or not metadata_location:
        raise BadRequestError("metadata-location must be a non-empty string")
    overwrite = body.get("overwrite", False)
    if not isinstance(overwrite, bool):
        raise BadRequestError("overwrite must be a boolean")
    call.require(Privilege.TABLE_CREATE, namespace)
    _refuse_view_name(call, namespace, name)
    # Decided once: the register does what was authorized here, or fails if the table appeared or went meanwhile.
    replaces = overwrite and call.warehouse.tables.table_exists(namespace, name)
    replaced = None
    if replaces:
        call.require(Privilege.TABLE_FULL_METADATA, namespace, name)  # re-admission (sqe_catalog.integrity)
        replaced = _refuse_restricted_change(call, namespace, name, "register-overwrite")
    access = _data_access(call, namespace, name)
    tables = call.warehouse.tables
    # The gate first, on what the register would admit (as for a create): a refused caller leaves no table behind.
    # The file is read once: the gate, the admission's checks, the pinned digest and the answer share that read.
    registration = tables.pending_registration(namespace, name, metadata_location, replaces)
    # An overwrite's schema is judged before the gate (a clear refusal) and again on the table it replaces.
    judge = _schema_judge(call, namespace, name) if replaces else None

    def register() -> StoredTable:
        return tables.register(registration, call.principal.name, judge)

    table, restricted = _gated(call, "register", registration.table, register, replaced)
    response = _table_response(call, table, _governed_access(access, restricted), restricted=restricted)
    _served(call, "register", table, restricted)
    return response


def _load_table(call: _Call) -> Response:
    namespace, name = call.namespace, call.table
    snapshots = _snapshots_mode(call)
    access = _data_access(call, namespace, name)
    if access is None:
        call.require(Privilege.TABLE_READ_PROPERTIES, namespace, name)
    pending = call.warehouse.tables.load_table_pending(namespace, name)
    table, restricted = _confirmed_with_restrictions(call, pending)
    access = _governed_access(access, restricted)
    etag = _etag_for(call, table, snapshots, access, restricted.digest if restricted else "")
    if if_none_match_matches(call.request.headers.get("if-none-match"), etag):
        _served(call, "load", table, restricted, 304)
        return Response(status_code=304, headers={"ETag": etag})
    response = _table_response(call, table, access, snapshots, restricted)
    _served(call, "load", table, restricted)
    return response


def _confirmed_with_restrictions(call: _Call, pending: PendingTable) -> tuple[StoredTable, ResolvedRestrictions | None]:
    """The user's restrictions resolved while the table's storage fingerprint is in flight, then the table to
    answer with; restrictions before the ETag: a 304 must never bypass the gate.

    The fingerprint's verdict comes first: a rewritten file is refused (422) even when the gate would also have
    refused, and restrictions resolved on a revision that is not the one answered are resolved again."""
    try:
        # An integrity failure wins over the gate's refusal (and its audit line), as when the load came first.
        restricted = _restrictions(call, pending.table, "load", before_refusal=pending.confirmed)
    except CatalogError:
        pending.confirmed()
        raise
    table = pending.confirmed()
    if table is not pending.table:
        restricted = _restrictions(call, table, "load")
    return table, restricted


def _table_exists(call: _Call) -> Response:
    namespace, name = call.namespace, call.table
    if not call.allowed(Privilege.TABLE_LIST, namespace):
        call.require(Privilege.TABLE_READ_PROPERTIES, namespace, name)
    return Response(status_code=204 if call.warehouse.tables.table_exists(namespace, name) else 404)


def _commit_table(call: _Call) -> Response:
    namespace, name = call.namespace, call.table
    commit = parse_commit_body(_commit_json(call, "table"))
    if commit.identifier is not None:
        claimed = _identifier(commit.identifier, "identifier", _TABLE_KIND)
        if claimed != (namespace, name):
            raise BadRequestError("identifier in the body does not match the table in the path")
    if is_create_transaction(commit):
        return _commit_create(call, namespace, name, commit)
    call.require(Privilege.TABLE_WRITE_PROPERTIES, namespace, name)
    tables = call.warehouse.tables
    gated = tables.load_table(namespace, name)  # 404 for a missing table, 422 for an untrusted one
    _restrictions(call, gated, "commit")  # refused before committing
    # The commit goes to this table or to none (409); a schema change is judged on the base it applies to.
    judge = _schema_judge(call, namespace, name)
    table = tables.commit_table(namespace, name, commit, gated.metadata.table_uuid, judge)
    return _commit_response(call, table, _commit_digest(call, table))


def _schema_judge(call: _Call, namespace: Namespace, name: str) -> Judge | None:
    """Refuses a commit whose schema change would make the table's read-restrictions unresolvable for a reader
    (a writer could otherwise fail every governed load of it), or an admission of a new table whose restrictions
    would not resolve, unless a policy manager makes it."""
    if call.allowed(Privilege.CATALOG_MANAGE_POLICIES):
        return None

    def judge(before: TableMetadata | None, after: TableMetadata) -> None:
        base = StoredTable(namespace, name, None, before) if before is not None else None
        new = StoredTable(namespace, name, None, after)
        call.state.restrictions.refuse_breaking_schema_change(call.prefix, base, new)

    return judge


def _refuse_breaking_schema(call: _Call, before: StoredTable | None, after: StoredTable) -> None:
    """``_schema_judge`` for a new table (``before`` None) or a re-admitted one."""
    if not call.allowed(Privilege.CATALOG_MANAGE_POLICIES):
        call.state.restrictions.refuse_breaking_schema_change(call.prefix, before, after)


def _commit_create(call: _Call, namespace: Namespace, name: str, commit: CommitBody) -> Response:
    """A create transaction's commit makes a table as a create does, and is gated as one (``_create_table``)."""
    call.require(Privilege.TABLE_CREATE, namespace)
    _refuse_view_name(call, namespace, name)
    tables = call.warehouse.tables
    commit = with_default_properties(commit, call.state.config.server.default_table_properties)
    pending = tables.pending_commit_create(namespace, name, commit)
    # Its assert-create refuses a table that appears meanwhile.
    table, restricted = _gated(call, "create", pending, lambda: tables.commit_table(namespace, name, commit))
    response = _commit_response(call, table, restricted.digest if restricted is not None else "")
    _served(call, "create", table, restricted)
    return response


def _commit_response(call: _Call, table: StoredTable, restrictions_digest: str) -> Response:
    location = json.dumps(table.metadata_location)
    body = f'{{"{vocabulary.METADATA_LOCATION}":{location},"metadata":{_metadata_json(table, "all")}}}'
    etag = _etag_for(call, table, "all", None, restrictions_digest)
    return Response(body, 200, {"ETag": etag}, media_type=_JSON)


def _commit_digest(call: _Call, table: StoredTable) -> str:
    """The restrictions digest for the committed metadata; one that no load can match if they stopped fitting."""
    try:
        restricted = _resolve(call, table)
    except CatalogError:
        return f"unresolved:{secrets.token_hex(8)}"
    return restricted.digest if restricted is not None else ""


def _drop_table(call: _Call) -> Response:
    namespace, name = call.namespace, call.table
    purge = _bool_query(call, "purgeRequested")
    call.require(Privilege.TABLE_DROP, namespace, name)
    # Gated like a commit: a restricted user who dropped the table could claim its files again (a content
    # manager may reuse a dropped location) in a new table that carries none of its restrictions.
    _refuse_restricted_change(call, namespace, name, "drop")
    call.warehouse.tables.drop_table(namespace, name, purge)
    return _no_content()


def _rename_table(call: _Call) -> Response:
    source, target = _rename_endpoints(call, _TABLE_KIND)
    _refuse_view_name(call, *target)
    _refuse_restricted_change(call, *source, "rename")
    _refuse_tag_change(call, source, target)
    _refuse_dropped_entries(call, target)
    call.warehouse.tables.rename_table(source, target)
    call.state.restrictions.renamed(call.prefix, source, target)
    if call.state.policies is not None:  # policies: table and column tags follow the rename
        call.state.policies.renamed(call.prefix, source, target)
    return _no_content()


def _refuse_tag_change(call: _Call, source: tuple[Namespace, str], target: tuple[Namespace, str]) -> None:
    """A rename must not change the tags that decide a table's read-restrictions, unless a policy manager does it.

    A table moved to another namespace leaves the tags it inherited there behind (its own tags follow it); and a
    name a dropped table had still carries that table's tags, which a table renamed onto it would take on (a
    ``public`` value there would override its namespace's ``restricted``)."""
    policies = call.state.policies
    if policies is None or call.allowed(Privilege.CATALOG_MANAGE_POLICIES):
        return
    if source[0] != target[0] and policies.inherited_tags(call.prefix, source[0]) != policies.inherited_tags(
        call.prefix, target[0]
    ):
        raise ForbiddenError(
            f"renaming into namespace {'.'.join(target[0])} changes the tags the table inherits from its namespace, "
            "which decide its read-restrictions: that needs CATALOG_MANAGE_POLICIES"
        )
    if call.warehouse.tables.table_exists(*target):  # its tags are a live table's: the rename's own 409, not ours
        raise AlreadyExistsError(f"table already exists: {'.'.join(target[0])}.{target[1]}")
    if policies.tags_on_name(call.prefix, *target):
        raise ForbiddenError(
            "the new name still carries the tags of a dropped table, which would decide this table's "
            "read-restrictions: renaming onto it needs CATALOG_MANAGE_POLICIES"
        )


def _refuse_dropped_entries(call: _Call, target: tuple[Namespace, str]) -> None:
    """A rename onto a name a dropped table's read-restriction entries still hold (entries match a table by its
    name too, so a re-created table stays restricted) gives the table those entries: written for another schema,
    they may not fit it and fail every load of theirs, as a schema change may; unless a policy manager does it."""
    if call.allowed(Privilege.CATALOG_MANAGE_POLICIES) or call.warehouse.tables.table_exists(*target):
        return  # a live table there: the rename's own 409
    if call.state.restrictions.dropped_table_governance(call.prefix, *target) is DroppedGovernance.ENTRIES:
        raise ForbiddenError(
            "the new name still carries read-restrictions of a dropped table, which would apply to this table: "
            "renaming onto it needs CATALOG_MANAGE_POLICIES (an operator clears them with sqe-catalog admin "
            "clear-restrictions)"
        )


# -- integrity: Polaris-style table notifications (sqe_catalog.integrity.notifications) ------------------


def _notify_table(call: _Call) -> Response:
    namespace, name = call.namespace, call.table
    notification = parse_notification(call.json(), name)
    changes_existing = notification.kind in ("UPDATE", "DROP")
    may_change = changes_existing and call.allowed(Privilege.TABLE_FULL_METADATA, namespace, name)
    if not may_change:
        # Checked before the table is looked up: a caller with neither privilege learns nothing of its existence.
        call.require(Privilege.TABLE_CREATE, namespace)
    # Decided once: the notification does what was authorized here, or fails if the table appeared or went since.
    exists = changes_existing and call.warehouse.tables.table_exists(namespace, name)
    if exists:
        call.require(Privilege.TABLE_FULL_METADATA, namespace, name)
        # A DROP is gated like DELETE (see _drop_table), an UPDATE like a commit.
        _refuse_restricted_change(call, namespace, name, f"notification-{notification.kind.lower()}")
    elif may_change:
        call.require(Privilege.TABLE_CREATE, namespace)  # an UPDATE of a missing table creates it
    # An UPDATE may change the schema as a commit does; a CREATE (or an UPDATE of a missing table) makes a table,
    # judged as a create is.
    judge = _schema_judge(call, namespace, name)
    call.warehouse.tables.notify(namespace, name, notification, call.principal.name, authorized_for=exists, judge=judge)
    return _no_content()


# -- end integrity ---------------------------------------------------------------------------------------


def _load_credentials(call: _Call) -> Response:
    namespace, name = call.namespace, call.table
    write = call.allowed(Privilege.TABLE_WRITE_DATA, namespace, name)
    if not write:
        call.require(Privilege.TABLE_READ_DATA, namespace, name)
    table = call.warehouse.tables.load_table(namespace, name, reuse_verified=True)
    restricted = _restrictions(call, table, "credentials")  # a credential reads raw files: trusted readers only
    access = _governed_access(_DataAccess(write), restricted)
    assert access is not None
    response = _json({vocabulary.STORAGE_CREDENTIALS: _storage_credentials(call, table, access)})
    _served(call, "credentials", table, restricted)
    return response


# -- sql-catalog: views (sqe_catalog.views) ------------------------------------------------------------
#
# Grants as in Polaris: list VIEW_LIST on the namespace, create VIEW_CREATE on the namespace, load and exists
# VIEW_READ_PROPERTIES (exists also VIEW_LIST on the namespace), replace VIEW_WRITE_PROPERTIES, drop VIEW_DROP,
# rename VIEW_DROP on the source and VIEW_CREATE on the target namespace. A name is a table or a view.


def _refuse_view_name(call: _Call, namespace: Namespace, name: str) -> None:
    if call.warehouse.views.view_exists(namespace, name):
        raise AlreadyExistsError(f"a view of that name exists: {'.'.join((*namespace, name))}")


def _view_name(call: _Call) -> str:
    return validate_view_name(str(call.request.path_params["view"]))


def _view_response(view: StoredView) -> Response:
    return _json({vocabulary.METADATA_LOCATION: view.metadata_location, "metadata": view.document, "config": {}})


def _list_views(call: _Call) -> Response:
    namespace = call.namespace
    call.require(Privilege.VIEW_LIST, namespace)
    page, token = _page(call.warehouse.views.list_views(namespace), call)
    return _json({"identifiers": [{"namespace": list(namespace), "name": n} for n in page], "next-page-token": token})


def _create_view(call: _Call) -> Response:
    namespace = call.namespace
    body = call.json()
    name = validate_view_name(body.get("name"))
    call.require(Privilege.VIEW_CREATE, namespace)
    return _view_response(call.warehouse.views.create_view(namespace, name, body))


def _load_view(call: _Call) -> Response:
    namespace, name = call.namespace, _view_name(call)
    call.require(Privilege.VIEW_READ_PROPERTIES, namespace, name)
    return _view_response(call.warehouse.views.load_view(namespace, name))


def _view_exists(call: _Call) -> Response:
    namespace, name = call.namespace, _view_name(call)
    if not call.allowed(Privilege.VIEW_LIST, namespace):
        call.require(Privilege.VIEW_READ_PROPERTIES, namespace, name)
    return Response(status_code=204 if call.warehouse.views.view_exists(namespace, name) else 404)


def _replace_view(call: _Call) -> Response:
    namespace, name = call.namespace, _view_name(call)
    body = _commit_json(call, "view")
    call.require(Privilege.VIEW_WRITE_PROPERTIES, namespace, name)
    return _view_response(call.warehouse.views.replace_view(namespace, name, body))


def _drop_view(call: _Call) -> Response:
    namespace, name = call.namespace, _view_name(call)
    call.require(Privilege.VIEW_DROP, namespace, name)
    call.warehouse.views.drop_view(namespace, name)
    return _no_content()


def _rename_view(call: _Call) -> Response:
    source, target = _rename_endpoints(call, _VIEW_KIND)
    call.warehouse.views.rename_view(source, target)
    return _no_content()


# -- end sql-catalog: views -----------------------------------------------------------------------------


# -- sql-catalog: server-side scan planning (sqe_catalog.planning) -------------------------------------
#
# Planning reads the table's manifests, so it needs what a load with vended credentials needs:
# TABLE_READ_DATA and, for a restricted caller, the read-restrictions gate (delegated token of a trusted
# reader that declared the capability). The caller's row filter always prunes (see sqe_catalog.planning).


def _planned_table(call: _Call) -> tuple[StoredTable, ResolvedRestrictions | None]:
    if not call.state.config.server.scan_planning:
        raise NotFoundError("server-side scan planning is switched off on this catalog")
    namespace, name = call.namespace, call.table
    call.require(Privilege.TABLE_READ_DATA, namespace, name)
    table = call.warehouse.tables.load_table(namespace, name, reuse_verified=True)
    return table, _restrictions(call, table, "plan")


def _plan_owner(call: _Call, restricted: ResolvedRestrictions | None) -> PlanOwner:
    return call.principal.name, call.principal.actor or "", restricted.digest if restricted is not None else ""


def _plan_key(call: _Call, table: StoredTable) -> tuple[str, tuple[str, ...], str]:
    return call.prefix, table.namespace, table.name


def _completed(plan_id: str, tasks: list[dict[str, Any]], plan_tasks: list[str]) -> Response:
    body = {"status": "completed", "plan-id": plan_id, **response_tasks(tasks)}
    if plan_tasks:
        body["plan-tasks"] = plan_tasks
    return _json(body)


def _plan_scan(call: _Call) -> Response:
    request = parse_plan_request(call.json())
    table, restricted = _planned_table(call)
    tasks = plan_files(table, call.warehouse.io, request, restricted.wire if restricted else None)
    plan_id, first, rest = call.state.plans.add(_plan_owner(call, restricted), _plan_key(call, table), tasks)
    _served(call, "plan", table, restricted)
    return _completed(plan_id, first, rest)


def _fetch_tasks(call: _Call) -> Response:
    token = call.json().get("plan-task")
    if not isinstance(token, str) or not token:
        raise BadRequestError("plan-task must be a non-empty string")
    table, restricted = _planned_table(call)
    tasks = call.state.plans.chunk(token, _plan_owner(call, restricted), _plan_key(call, table))
    _served(call, "plan-tasks", table, restricted)
    return _json(response_tasks(tasks))


def _get_plan(call: _Call) -> Response:
    plan_id = str(call.request.path_params["plan_id"])
    table, restricted = _planned_table(call)
    tasks = call.state.plans.get(plan_id, _plan_owner(call, restricted), _plan_key(call, table))
    _served(call, "plan", table, restricted)
    return _completed(plan_id, tasks, [])


def _cancel_plan(call: _Call) -> Response:
    plan_id = str(call.request.path_params["plan_id"])
    table, restricted = _planned_table(call)
    call.state.plans.cancel(plan_id, _plan_owner(call, restricted), _plan_key(call, table))
    return _no_content()


# -- end sql-catalog: server-side scan planning ---------------------------------------------------------


# -- policies: management endpoints (sqe_catalog.policies; only with read_restriction_policies = true) ------
#
# Every one needs CATALOG_MANAGE_POLICIES on the warehouse. Save-time errors are 400 with a stable code (and a
# position for expression errors) in the message.


def _policy_store(call: _Call) -> PolicyStore:
    call.warehouse  # noqa: B018 - 404 for an unknown warehouse first
    call.require(Privilege.CATALOG_MANAGE_POLICIES)
    assert call.state.policies is not None  # the routes exist only when the feature is on
    return call.state.policies


def _policy_name(call: _Call) -> str:
    return str(call.request.path_params["policy"])


def _list_policies(call: _Call) -> Response:
    store = _policy_store(call)
    return _json({"policies": [p.to_json() for p in store.policies(call.prefix)]})


def _create_policy(call: _Call) -> Response:
    store, body = _policy_store(call), call.json()
    policy = policy_errors(lambda: store.create_policy(call.prefix, body, call.principal.name))
    return _json(policy.to_json())


def _get_policy(call: _Call) -> Response:
    store = _policy_store(call)
    policy = store.policy(call.prefix, _policy_name(call))
    return _json({**policy.to_json(), "history": store.history(call.prefix, policy.name)})


def _update_policy(call: _Call) -> Response:
    store, body = _policy_store(call), call.json()
    policy = policy_errors(lambda: store.update_policy(call.prefix, _policy_name(call), body, call.principal.name))
    return _json(policy.to_json())


def _delete_policy(call: _Call) -> Response:
    _policy_store(call).delete_policy(call.prefix, _policy_name(call))
    return _no_content()


def _attach_policy(call: _Call) -> Response:
    store, selector = _policy_store(call), selector_from_json(call.json())
    store.attach(call.prefix, _policy_name(call), selector)
    return _json(store.policy(call.prefix, _policy_name(call)).to_json())


def _detach_policy(call: _Call) -> Response:
    store, selector = _policy_store(call), selector_from_json(call.json())
    store.detach(call.prefix, _policy_name(call), selector)
    return _no_content()


def _list_tags(call: _Call) -> Response:
    store = _policy_store(call)
    return _json({"tags": [a.to_json() for a in store.tags(call.prefix)]})


def _tag_body(call: _Call) -> tuple[PolicyStore, dict[str, Any]]:
    store, body = _policy_store(call), call.json()
    if set(body) - {"object", "tag", "value"} or not isinstance(body.get("tag"), str):
        raise BadRequestError("a tag assignment is {object, tag, value?}")
    return store, body


def _set_tag(call: _Call) -> Response:
    store, body = _tag_body(call)
    target = target_from_json(call.warehouse.tables, body.get("object", {}))
    store.set_tag(call.prefix, target, body["tag"], body.get("value"))
    return _no_content()


def _remove_tag(call: _Call) -> Response:
    store, body = _tag_body(call)
    target = target_from_json(call.warehouse.tables, body.get("object", {}), removal=True)
    store.remove_tag(call.prefix, target, body["tag"])
    return _no_content()


def _preview_restrictions(call: _Call) -> Response:
    """Explain resolution for (user, table) without serving or enabling anything."""
    _policy_store(call)
    body = call.json()
    user, include = body.get("user"), body.get("include-disabled", True)
    if not isinstance(user, str) or not isinstance(include, bool):
        raise BadRequestError("preview needs a string 'user' (and a Boolean 'include-disabled')")
    namespace, name = _identifier(body.get("table"), "table", _TABLE_KIND)
    table = call.warehouse.tables.load_table(namespace, name)
    return _json(call.state.restrictions.preview(call.prefix, table, user, include_disabled=include))


# -- end policies ---------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------------
# Routing


@dataclass(frozen=True)
class _Op:
    method: str
    path: str
    handler: Handler
    needs_body: bool = False
    reads: bool = False  # changes nothing though not a GET/HEAD (scan planning, a preview): the reads' threads

    @property
    def writes(self) -> bool:
        """Whether it runs on the writes' threads (see WRITE_THREADS)."""
        return self.method not in _READS and not self.reads


def _object_operations(path: str, load: Handler, exists: Handler, commit: Handler, drop: Handler) -> tuple[_Op, ...]:
    """The spec's four operations on one table or view path: load, exists, commit (replace), drop."""
    return (
        _Op("GET", path, load),
        _Op("HEAD", path, exists),
        _Op("POST", path, commit, needs_body=True),
        _Op("DELETE", path, drop),
    )


_NS = "/v1/{prefix}/namespaces/{namespace}"
_TABLE = _NS + "/tables/{table}"
_VIEW = _NS + "/views/{view}"
_OPERATIONS: tuple[_Op, ...] = (
    _Op("GET", "/v1/{prefix}/namespaces", _list_namespaces),
    _Op("POST", "/v1/{prefix}/namespaces", _create_namespace, needs_body=True),
    _Op("GET", _NS, _load_namespace),
    _Op("HEAD", _NS, _namespace_exists),
    _Op("DELETE", _NS, _drop_namespace),
    _Op("POST", _NS + "/properties", _update_namespace_properties, needs_body=True),
    _Op("GET", _NS + "/tables", _list_tables),
    _Op("POST", _NS + "/tables", _create_table, needs_body=True),
    _Op("POST", _NS + "/register", _register_table, needs_body=True),
    *_object_operations(_TABLE, _load_table, _table_exists, _commit_table, _drop_table),
    _Op("POST", "/v1/{prefix}/tables/rename", _rename_table, needs_body=True),
    _Op("GET", _TABLE + "/credentials", _load_credentials),
    _Op("POST", _TABLE + "/notifications", _notify_table, needs_body=True),
    # -- sql-catalog: views and scan planning
    _Op("GET", _NS + "/views", _list_views),
    _Op("POST", _NS + "/views", _create_view, needs_body=True),
    *_object_operations(_VIEW, _load_view, _view_exists, _replace_view, _drop_view),
    _Op("POST", "/v1/{prefix}/views/rename", _rename_view, needs_body=True),
    # -- end sql-catalog
)
_PLANNING_OPERATIONS: tuple[_Op, ...] = (
    # A reader's planning: never queued behind contended writes (the plans live in this process's memory).
    _Op("POST", _TABLE + "/plan", _plan_scan, needs_body=True, reads=True),
    _Op("GET", _TABLE + "/plan/{plan_id}", _get_plan),
    _Op("DELETE", _TABLE + "/plan/{plan_id}", _cancel_plan, reads=True),
    _Op("POST", _TABLE + "/tasks", _fetch_tasks, needs_body=True, reads=True),
)
ENDPOINTS: tuple[str, ...] = tuple(f"{op.method} {op.path}" for op in (*_OPERATIONS, *_PLANNING_OPERATIONS))
# policies: management routes, present only with [server] read_restriction_policies = true
_POLICY = "/v1/{prefix}/policies/{policy}"
_POLICY_OPERATIONS: tuple[_Op, ...] = (
    _Op("GET", "/v1/{prefix}/policies", _list_policies),
    _Op("POST", "/v1/{prefix}/policies", _create_policy, needs_body=True),
    _Op("GET", _POLICY, _get_policy),
    _Op("PUT", _POLICY, _update_policy, needs_body=True),
    _Op("DELETE", _POLICY, _delete_policy),
    _Op("POST", _POLICY + "/tags", _attach_policy, needs_body=True),
    _Op("POST", _POLICY + "/tags/detach", _detach_policy, needs_body=True),
    _Op("GET", "/v1/{prefix}/tags", _list_tags),
    _Op("POST", "/v1/{prefix}/tags", _set_tag, needs_body=True),
    _Op("POST", "/v1/{prefix}/tags/remove", _remove_tag, needs_body=True),
    _Op("POST", "/v1/{prefix}/restrictions/preview", _preview_restrictions, needs_body=True, reads=True),
)


async def _read_body(request: Request) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadRequestError(f"request body is larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _encoded_separator_in_path(request: Request) -> bool:
    """An encoded '/' or '\\' in a name splits the decoded path: no route matches, but the name is the problem."""
    raw = request.scope.get("raw_path", b"").split(b"?")[0].lower()
    return raw.startswith(b"/v1/") and (b"%2f" in raw or b"%5c" in raw or b"\\" in raw)


def _authenticate(state: _State, request: Request) -> Principal:
    if state.anonymous_principal is not None and "authorization" not in request.headers:
        principal = state.auth.anonymous_principal(state.anonymous_principal)  # sql-catalog: sandbox mode
        request.state.principal_name = principal.name
        return principal
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise NotAuthorizedError("missing bearer token")
    principal = state.auth.principal_for_token(token.strip())
    request.state.principal_name = principal.name
    return principal


def _run(handler: Handler, call: _Call) -> Response:
    call.principal = _authenticate(call.state, call.request)
    with (
        dropped_location_reuse(lambda namespace, name: _check_dropped_claim(call, namespace, name)),
        namespace_area_claims(lambda namespace: _check_area_claim(call, namespace)),
        foreign_file_reads(lambda namespace, name: _check_foreign_file(call, namespace, name)),
    ):
        return handler(call)


def _check_foreign_file(call: _Call, namespace: Namespace, name: str) -> None:
    """A register or notification reads its metadata file with the catalog's key: under another table's location
    only for a caller who may write that table's files (and so could have put it there)."""
    if not call.allowed(Privilege.TABLE_WRITE_DATA, namespace, name):
        raise ForbiddenError(
            f"{vocabulary.METADATA_LOCATION} lies inside the location of another table: reading it for an admission "
            "needs TABLE_WRITE_DATA on that table"
        )


def _check_area_claim(call: _Call, namespace: Namespace) -> None:
    """A table placed in another namespace's area (``<warehouse>/<ns>/...``) takes a place that namespace's
    tables would get by default: it needs the right to create tables there."""
    if not call.allowed(Privilege.TABLE_CREATE, namespace):
        raise ForbiddenError(
            f"table location is inside the area of namespace {'.'.join(namespace)}: placing a table there needs "
            "TABLE_CREATE on that namespace"
        )


def _check_dropped_claim(call: _Call, namespace: Namespace, name: str) -> None:
    """A new location over the files of a dropped table (dropped without purge, or its purge not done yet).

    Only a warehouse-wide content manager may claim it. A table there would carry none of the dropped table's
    read-restrictions, so where it had some, its files may hold data restricted for the claimant: claiming them
    also needs CATALOG_MANAGE_POLICIES (whose holder can lift policies anyway), and is refused over REST while
    restriction entries name it (an operator sets and clears those)."""
    shown = ".".join((*namespace, name))
    refused = (
        f"table location overlaps the location of dropped or moved table {shown}, whose files are still in storage"
    )
    if not call.allowed(Privilege.CATALOG_MANAGE_CONTENT):
        raise ForbiddenError(f"{refused}; claiming it needs CATALOG_MANAGE_CONTENT on the warehouse")
    governance = call.state.restrictions.dropped_table_governance(call.prefix, namespace, name)
    if governance is DroppedGovernance.ENTRIES:
        raise ForbiddenError(
            f"{refused}, and {governance.value}: no one may claim it while they do (an operator clears them with "
            "sqe-catalog admin clear-restrictions)"
        )
    if governance is DroppedGovernance.POLICIES and not call.allowed(Privilege.CATALOG_MANAGE_POLICIES):
        raise ForbiddenError(f"{refused}, and {governance.value}: claiming it also needs CATALOG_MANAGE_POLICIES")


def _log_unexpected(request: Request, exc: BaseException) -> str:
    """Log an unexpected failure once, under a new request id, and return that id for the 500."""
    request_id = _new_request_id()
    route = f"{request.method} {request.scope.get('route_path', request.url.path)}"
    if isinstance(exc, DBAPIError):
        # SQLAlchemy's rendering includes statements and bound parameters; keep the driver's first line.
        detail = describe_database_error(exc)
        log.error("database error in %s (request id %s): %s: %s", route, request_id, type(exc).__name__, detail)
    else:
        log.error("unexpected error in %s (request id %s)", route, request_id, exc_info=exc)
    return request_id


def _endpoint(state: _State, ops: dict[str, _Op]) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        op = ops.get(request.method)
        if op is None:
            response = _error(_MethodNotAllowed(f"method {request.method} is not allowed here"))
        else:
            response = await _dispatch(state, op, request)
        if request.method == "HEAD" and response.status_code >= 400:
            return Response(status_code=response.status_code, headers=_strip_length(response))
        return response

    return endpoint


def _strip_length(response: Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}


async def _dispatch(state: _State, op: _Op, request: Request) -> Response:
    request.scope["route_path"] = op.path
    try:
        body = await _read_body(request) if op.needs_body else None
        call = _Call(request, state, body)
        if not op.writes:
            return await run_in_threadpool(_run, op.handler, call)
        return await _run_write(state, op, call)
    except CatalogError as exc:
        return _error(exc)
    except Exception as exc:
        return _internal_error(_log_unexpected(request, exc))


async def _run_write(state: _State, op: _Op, call: _Call) -> Response:
    """A write on the writes' threads, told when its client disconnects (``contention.CLIENT_LEFT``): a claim
    losing to other processes then stops trying instead of holding its thread for an answer no one reads."""
    left = threading.Event()
    token = CLIENT_LEFT.set(left)  # the thread runs in a copy of this context
    failure: Exception | None = None
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_watch_for_disconnect, call.request, left)
            try:
                response = await anyio.to_thread.run_sync(
                    functools.partial(_run, op.handler, call), limiter=state.writes.limiter()
                )
            except Exception as exc:  # raised below, as it is: the task group would wrap it in an exception group
                failure = exc
            finally:
                group.cancel_scope.cancel()
    finally:
        CLIENT_LEFT.reset(token)
    if failure is not None:
        raise failure
    return response


async def _watch_for_disconnect(request: Request, left: threading.Event) -> None:
    """Set ``left`` once the server reports the client gone (the body, if any, was read before)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    left.set()


class _MethodNotAllowed(CatalogError, status=405, error_type=vocabulary.ERROR_METHOD_NOT_ALLOWED):
    pass


def _routes(state: _State) -> list[Route]:
    by_path: dict[str, dict[str, _Op]] = {}
    policy_ops = _POLICY_OPERATIONS if state.policies is not None else ()
    for op in (*_OPERATIONS, *_PLANNING_OPERATIONS, *policy_ops):
        by_path.setdefault(op.path, {})[op.method] = op
    config_ops = {"GET": _Op("GET", "/v1/config", _get_config)}
    routes = [
        Route("/v1/config", _endpoint(state, config_ops), methods=["GET", "POST", "PUT", "DELETE"]),
        Route("/v1/oauth/tokens", _token_endpoint(state), methods=["GET", "POST", "PUT", "DELETE"]),
    ]
    all_methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]
    routes += [Route(path, _endpoint(state, ops), methods=all_methods) for path, ops in by_path.items()]
    return routes


# ----------------------------------------------------------------------------------------------------
# OAuth token endpoint (Polaris dialect: client_credentials, form body or HTTP Basic)


class _OAuthError(Exception):
    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.error, self.description, self.status = error, description, status

    def response(self) -> Response:
        headers = {"Cache-Control": "no-store"}
        if self.status == 401:
            headers["WWW-Authenticate"] = 'Basic realm="sqe-catalog"'
        return _json({"error": self.error, "error_description": self.description}, self.status, headers)


def _basic_credentials(request: Request) -> tuple[str, str] | None:
    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        client_id, sep, client_secret = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise _OAuthError("invalid_request", "malformed HTTP Basic credentials") from None
    if not sep:
        raise _OAuthError("invalid_request", "malformed HTTP Basic credentials")
    return client_id, client_secret


def _client_credentials(request: Request, form: dict[str, str]) -> tuple[str, str]:
    basic = _basic_credentials(request)
    form_id, form_secret = form.get("client_id"), form.get("client_secret")
    if basic is not None:
        if (form_id and form_id != basic[0]) or form_secret:
            raise _OAuthError("invalid_request", "use either HTTP Basic or form credentials, not both")
        return basic
    if not form_id or not form_secret:
        raise _OAuthError("invalid_client", "client_id and client_secret are required", 401)
    return form_id, form_secret


def _issue_token(state: _State, client_id: str, client_secret: str, scope: str) -> Response:
    try:
        token, expires_in = state.auth.issue_token(client_id, client_secret, scope)
    except NotAuthorizedError:
        raise _OAuthError("invalid_client", "client authentication failed", 401) from None
    except BadRequestError as exc:
        raise _OAuthError("invalid_scope", exc.message.removeprefix("invalid_scope: ")) from None
    body = {
        "access_token": token,
        "token_type": "bearer",
        "issued_token_type": ACCESS_TOKEN_TYPE,
        "expires_in": expires_in,
    }
    return _json(body, 200, {"Cache-Control": "no-store", "Pragma": "no-cache"})


def _exchange_token(state: _State, form: dict[str, str]) -> Response:
    """RFC 8693 token exchange (our extension: the actor must be a reader; see ``sqe_catalog.delegation``)."""
    try:
        delegated = exchange_token(state.auth, form)
    except TokenExchangeError as exc:
        raise _OAuthError(exc.error, exc.description, exc.status) from None
    body = {
        "access_token": delegated.access_token,
        "issued_token_type": ACCESS_TOKEN_TYPE,
        "token_type": "bearer",
        "expires_in": delegated.expires_in,
    }
    return _json(body, 200, {"Cache-Control": "no-store", "Pragma": "no-cache"})


async def _token_form(request: Request) -> dict[str, str]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise _OAuthError("invalid_request", "the body must be application/x-www-form-urlencoded")
    try:
        async with request.form(max_fields=32) as form:
            return {k: v for k, v in form.items() if isinstance(v, str)}
    except HTTPException:  # Starlette's parser refuses a field over 1 MiB or too many fields: the client's form
        raise _OAuthError("invalid_request", "malformed form body (too many fields or a field too large)") from None


def _token_endpoint(state: _State) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        if request.method != "POST":
            return _error(_MethodNotAllowed(f"method {request.method} is not allowed here"))
        try:
            form = await _token_form(request)
            grant_type = form.get("grant_type")
            if not grant_type:
                raise _OAuthError("invalid_request", "grant_type is required")
            if grant_type == TOKEN_EXCHANGE_GRANT:
                return await run_in_threadpool(_exchange_token, state, form)
            if grant_type != "client_credentials":
                raise _OAuthError(
                    "unsupported_grant_type", f"only client_credentials and {TOKEN_EXCHANGE_GRANT} are supported"
                )
            client_id, client_secret = _client_credentials(request, form)
            return await run_in_threadpool(_issue_token, state, client_id, client_secret, form.get("scope", ""))
        except _OAuthError as exc:
            return exc.response()
        except Exception as exc:
            return _internal_error(_log_unexpected(request, exc))

    return endpoint


# ----------------------------------------------------------------------------------------------------
# Middleware, error handlers and the factory


class _RequestLog:
    """One debug line per request: method, path, status, principal. Never headers, query strings or bodies."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            principal = scope.get("state", {}).get("principal_name", "-")
            path = scope.get("raw_path", b"").decode("latin-1") or scope.get("path", "")
            log.debug("%s %s -> %d principal=%s", scope["method"], path.split("?")[0], status, principal)


async def _http_exception(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 404 and _encoded_separator_in_path(request):
        return _error(BadRequestError("identifiers must not contain a path separator ('/' or '\\')"))
    if status == 404:
        return _error(NotFoundError(f"no route for {request.method} {request.url.path}"))
    if status == 405:
        return _error(_MethodNotAllowed(f"method {request.method} is not allowed here"))
    return _json({"error": {"message": "request failed", "type": "HTTPException", "code": status}}, status)


async def _unexpected(request: Request, exc: Exception) -> Response:
    return _internal_error(_log_unexpected(request, exc))


def _signing_key(config: CatalogServerConfig) -> bytes:
    # Unset or empty in the config: a random key per process, so tokens die with the process.
    return config.server.signing_key_bytes() or secrets.token_bytes(32)


def _new_warehouse(w: WarehouseConfig, engine: Engine) -> _Warehouse:
    tables = WarehouseTables(w, engine)
    tables.cover_unrecorded_credentials()  # this process serves: older ones may have vended unrecorded
    views = ViewStore(w, engine, tables)
    views.create_schema()
    vendor = CredentialVendor(w, record_expiry=tables.integrity.record_vended_expiry)
    return _Warehouse(w, tables, vendor, views, load_file_io(catalog_io_properties(w)))


def _sandbox_principal(config: CatalogServerConfig) -> str | None:
    """``[server] anonymous_principal`` when it may be used: only on a loopback address, else refused."""
    name = config.server.anonymous_principal
    if not name:
        return None
    if not is_loopback(config.server.host):
        log.warning(
            "anonymous_principal is refused: the server listens on %s, not a loopback address; "
            "every request needs a bearer token",
            config.server.host,
        )
        return None
    log.warning("sandbox mode: requests without a bearer token are served as principal %s", name)
    return name


def create_app(config: CatalogServerConfig) -> Starlette:
    """The catalog application: one database engine, one AuthStore, and per warehouse tables + a vendor."""
    if (pair := overlapping_warehouses(config.warehouses)) is not None:  # a config built without parse_config
        raise ConfigError(overlap_message(config.warehouses, pair))
    engine = create_engine_for(config.server.database)
    auth = AuthStore(
        engine, _signing_key(config), config.server.token_lifetime_seconds, scrypt_n=config.server.secret_hash_scrypt_n
    )
    auth.create_schema()
    policies = PolicyStore(engine) if config.server.read_restriction_policies else None
    restrictions = RestrictionStore(engine, policies)
    restrictions.create_schema()
    warehouses = {w.name: _new_warehouse(w, engine) for w in config.warehouses}
    plans = PlanStore(config.server.plan_lifetime_seconds, config.server.max_plan_tasks_per_caller)
    state = _State(
        engine,
        auth,
        restrictions,
        warehouses,
        config,
        plans,
        _sandbox_principal(config),
        policies=policies,
        polaris_compat=config.server.polaris_compat,
    )
    cleaner = BackgroundCleaner(  # runs persisted purge tasks (sqe_catalog.integrity.cleaner)
        [w.tables.run_cleanup for w in warehouses.values()], config.server.cleanup_interval_seconds
    )

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        cleaner.start()
        yield
        cleaner.stop()
        engine.dispose()

    routes: list[BaseRoute] = list(_routes(state))
    if config.server.polaris_compat:  # Polaris mode: Polaris serves the Iceberg REST API under /api/catalog
        routes = [Mount(POLARIS_BASE_PATH, routes=routes)]
    return Starlette(
        routes=routes,
        middleware=[Middleware(_RequestLog)],
        exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
        lifespan=lifespan,
    )
