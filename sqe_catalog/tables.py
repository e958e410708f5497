"""Namespace and table state of one warehouse, kept by pyiceberg's ``SqlCatalog``.

Each warehouse is one ``SqlCatalog`` (``catalog_name`` = warehouse name) over the shared database engine. The
catalog reads and writes metadata files with the warehouse's own static key, so everything a client controls
that could steer that I/O is checked here first:

- table locations (``location``, ``write.data.path``, ``write.metadata.path``) must lie inside the warehouse
  location and must not overlap another table's locations, because vended credentials are scoped by them, nor a
  view's (a table's writers could rewrite the view's SQL, which runs in every invoker's session); nor,
  unless the request may claim them (``dropped_location_reuse``), a dropped table's whose files are still there
  (dropped without purge, or purged by a cleanup task not done yet) or one a commit moved a table away from; nor,
  unless the request may create tables there (``namespace_area_claims``), another namespace's area;
- table properties that make pyiceberg import a class (``py-io-impl``, ``write.py-location-provider.impl``)
  are refused, and table properties never reach the catalog's own FileIO;
- a purge deletes only files under the table's own locations.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar

import pydantic
from pyiceberg import exceptions as ice
from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.manifest import ManifestFile
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import StagedTable, Table
from pyiceberg.table.metadata import (
    SUPPORTED_TABLE_FORMAT_VERSION,
    TableMetadata,
    TableMetadataUtil,
    new_table_metadata,
)
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AssertCreate,
    AssertTableUUID,
    RemovePropertiesUpdate,
    SetLocationUpdate,
    SetPropertiesUpdate,
    TableRequirement,
    TableUpdate,
    UpgradeFormatVersionUpdate,
)
from pyiceberg.typedef import IcebergBaseModel, Identifier
from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sqe import vocabulary
from sqe._lru import LRUCache
from sqe._text import first_line, iso_utc
from sqe.credentials.paths import covered_by_any, prefix_matches
from sqe.planning.avro_limits import BoundedManifestIO
from sqe_catalog.avro_limits import CatalogManifestBounds, ManifestLimitError
from sqe_catalog.config import WarehouseConfig
from sqe_catalog.contention import retried_claim
from sqe_catalog.errors import (
    AlreadyExistsError,
    BadRequestError,
    CatalogError,
    ClaimContendedError,
    CommitFailedError,
    ForbiddenError,
    NoSuchNamespaceError,
    NoSuchTableError,
    ServiceUnavailableError,
)
from sqe_catalog.history import check_history, with_snapshot_log
from sqe_catalog.identifiers import (
    MAX_NAMESPACE_DEPTH,
    URI_CHARACTERS,
    Namespace,
    from_storage_namespace,
    storage_namespace,
    validate_name,
    validate_namespace,
)
from sqe_catalog.integrity.admission import Admission
from sqe_catalog.integrity.canonical import ParsedMetadata, check_new_metadata_size, read_metadata_file
from sqe_catalog.integrity.fingerprint import storage_fingerprint
from sqe_catalog.integrity.guard import IntegrityGuard, Judge, PendingRead
from sqe_catalog.integrity.state import Reservation, TableName, TrustedState, now_ms
from sqe_catalog.schema import VIEW_POINTERS, create_tables
from sqe_catalog.update_ids import assigned_ids

__all__ = [
    "CLIENT_PARSE_ERRORS",
    "LOCATION_PROPERTIES",
    "CommitBody",
    "Namespace",
    "NamespaceNotEmptyError",
    "Registration",
    "StoredTable",
    "TableCreate",
    "WarehouseTables",
    "catalog_io_properties",
    "client_parse_message",
    "dropped_location_reuse",
    "foreign_file_reads",
    "is_create_transaction",
    "namespace_area_claims",
    "pointer_directory",
    "validate_client_model",
    "validate_namespace",
    "validate_table_name",
    "with_default_properties",
]

log = logging.getLogger("sqe_catalog.tables")

WRITE_DATA_PATH = "write.data.path"
WRITE_METADATA_PATH = "write.metadata.path"
LOCATION_PROPERTIES = (WRITE_DATA_PATH, WRITE_METADATA_PATH)
# Table properties that make pyiceberg import and run a class inside the catalog process.
FORBIDDEN_TABLE_PROPERTIES = frozenset({"py-io-impl", "write.py-location-provider.impl"})
# The newest format a create transaction may ask for (creates write v3 metadata themselves).
_MAX_CREATE_FORMAT_VERSION = 3
_T = TypeVar("_T")
_P = ParamSpec("_P")


class _RequestCheck(Generic[_P]):
    """A permission a rule here needs and api.py decides per request, from the caller's privileges: a context
    variable, so every route that reaches the rule gets it without each passing a flag. Unset (admin CLI, tests, a
    route that forgot) means no: fail closed with ``refusal(...)``. A set check raises ForbiddenError to refuse."""

    def __init__(self, name: str, refusal: Callable[_P, str]) -> None:
        self._check: ContextVar[Callable[_P, None] | None] = ContextVar(name, default=None)
        self._refusal = refusal

    @contextmanager
    def decided_by(self, check: Callable[_P, None]) -> Iterator[None]:
        """Within the block, ``check`` decides."""
        token = self._check.set(check)
        try:
            yield
        finally:
            self._check.reset(token)

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> None:
        check = self._check.get()
        if check is None:
            raise ForbiddenError(self._refusal(*args, **kwargs))
        check(*args, **kwargs)


# May the request claim a location of a dropped table whose files are still there (CATALOG_MANAGE_CONTENT on the
# warehouse, and more where the dropped table was governed)? Every route that claims locations (create,
# stage-create, register, commits, notifications) asks. The check gets the dropped table's namespace and name.
_check_dropped_claim = _RequestCheck[[Namespace, str]](
    "dropped_location_reuse",
    lambda namespace, name: (
        f"table location overlaps the location of dropped or moved table {'.'.join((*namespace, name))}, whose "
        "files are still in storage"
    ),
)
dropped_location_reuse = _check_dropped_claim.decided_by

# May the request place a table in another namespace's area (``<warehouse>/<ns>/...``, where that namespace's
# tables go by default; TABLE_CREATE on that namespace)? The check gets the namespace whose area it is.
_check_area_claim = _RequestCheck[[Namespace]](
    "namespace_area_claim", lambda owner: f"table location is inside the area of namespace {'.'.join(owner)}"
)
namespace_area_claims = _check_area_claim.decided_by

# May the request have the catalog read, for an admission (register, notification), a file under another table's
# location with the catalog's own key (TABLE_WRITE_DATA on that table: whoever may write its files)? The check
# gets the table.
_check_foreign_file = _RequestCheck[[Namespace, str]](
    "foreign_file_read",
    lambda _namespace, _name: f"{vocabulary.METADATA_LOCATION} lies inside the location of another table",
)
foreign_file_reads = _check_foreign_file.decided_by


@dataclass(frozen=True)
class _Claimant:
    """The table a location check is for: its name, and its UUID where a revision brings one (a dropped table
    registered again under another name is the same table, and may take back the places its drop reserved)."""

    namespace: Namespace
    name: str
    uuid: str | None = None

    def holds(self, reservation: Reservation) -> bool:
        if self.uuid is not None and reservation.uuid == self.uuid:
            return True
        return (from_storage_namespace(reservation.namespace), reservation.name) == (self.namespace, self.name)


class NamespaceNotEmptyError(CatalogError, status=409, error_type=vocabulary.ERROR_NAMESPACE_NOT_EMPTY):
    pass


# ----------------------------------------------------------------------------------------------------
# Identifiers and locations


def validate_table_name(name: object) -> str:
    return validate_name(name, "table name")


def _s(namespace: Namespace) -> Namespace:
    """The namespace as pyiceberg's SQL catalog and the integrity state store it (``.`` escaped in levels)."""
    return storage_namespace(namespace)


def _split_location(location: str) -> tuple[str, list[str]]:
    """``s3://b/x/y/`` -> ``("s3", ["b", "x", "y"])``; ``file:///tmp/w`` -> ``("file", ["tmp", "w"])``."""
    scheme, sep, rest = location.partition("://")
    if not sep or not scheme:
        raise BadRequestError("table location must be a URI such as s3://bucket/path")
    if scheme == vocabulary.FILE_SCHEME:
        rest = rest.removeprefix("/")
    return scheme, rest.rstrip("/").split("/")


def _overlaps(a: str, b: str) -> bool:
    return prefix_matches(a, b) or prefix_matches(b, a)


@dataclass(frozen=True)
class StoredTable:
    namespace: Namespace
    name: str
    metadata_location: str | None  # None for a staged (not yet committed) table
    metadata: TableMetadata
    # The complete JSON document (fields pyiceberg's model drops included); None: dump the model.
    document: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def location(self) -> str:
        return self.metadata.location.rstrip("/")

    @property
    def locations(self) -> tuple[str, ...]:
        """Table location, plus ``write.data.path`` and ``write.metadata.path`` when set."""
        return table_locations(self.metadata.location, self.metadata.properties)

    @property
    def key(self) -> str:
        return "/".join((*self.namespace, self.name))


@dataclass(frozen=True)
class Registration:
    """A register request's revision, read once (``WarehouseTables.pending_registration``): the gate, every
    admission check, the pinned digest and the answer all use these bytes, never a second read of the file."""

    namespace: Namespace
    name: str
    metadata_location: str
    parsed: ParsedMetadata = field(repr=False)
    # Whether it replaces the table of that name (a re-admission), as decided when the request was authorized:
    # a table appearing or going meanwhile fails the register (409, 404) rather than changing what it does.
    replaces: bool

    @property
    def table(self) -> StoredTable:
        """The table the register would make, admitted nowhere (what the gate judges)."""
        parsed = self.parsed
        return StoredTable(self.namespace, self.name, self.metadata_location, parsed.metadata, parsed.document)


class PendingTable:
    """A read route's table whose storage fingerprint may still be in flight (``IntegrityGuard.load_pending``):
    ``table`` to prepare the answer from, ``confirmed()`` the table to answer with (the same object when the
    stored file is unchanged); nothing may be sent before ``confirmed()`` returned."""

    def __init__(self, namespace: Namespace, name: str, location: str, pending: PendingRead) -> None:
        self._pending = pending
        self._where = (namespace, name, location)
        candidate = pending.candidate
        self.table = StoredTable(namespace, name, location, candidate.metadata, candidate.document)
        self._outcome: StoredTable | CatalogError | None = None

    def confirmed(self) -> StoredTable:
        """The table to answer with, or the error (422 for a rewrite); settled once, a second call repeats it."""
        if self._outcome is None:
            try:
                parsed = self._pending.confirmed()
            except CatalogError as exc:
                self._outcome = exc
                raise
            same = parsed is self._pending.candidate
            self._outcome = self.table if same else StoredTable(*self._where, parsed.metadata, parsed.document)
        if isinstance(self._outcome, CatalogError):
            raise self._outcome
        return self._outcome


def _metadata_locations(metadata: TableMetadata) -> tuple[str, ...]:
    return table_locations(metadata.location, metadata.properties)


def table_locations(location: str, properties: dict[str, str]) -> tuple[str, ...]:
    found = [location.rstrip("/")]
    for key in LOCATION_PROPERTIES:
        if value := properties.get(key):
            found.append(value.rstrip("/"))
    return tuple(dict.fromkeys(found))


def catalog_io_properties(warehouse: WarehouseConfig) -> dict[str, str]:
    """FileIO properties for the catalog's own metadata I/O: the warehouse's static key, endpoint, region."""
    props = {
        vocabulary.S3_REGION: warehouse.region,
        vocabulary.S3_FORCE_VIRTUAL_ADDRESSING: str(not warehouse.path_style).lower(),
    }
    if warehouse.endpoint:
        props[vocabulary.S3_ENDPOINT] = warehouse.endpoint
    pair = warehouse.static_key_pair()
    if pair is not None:
        props[vocabulary.S3_ACCESS_KEY_ID], props[vocabulary.S3_SECRET_ACCESS_KEY] = pair
    return props


# ----------------------------------------------------------------------------------------------------
# Request bodies


class CommitBody(IcebergBaseModel):
    """``CommitTableRequest`` of the spec; the identifier is optional because it is in the path."""

    identifier: dict[str, Any] | None = None
    requirements: tuple[TableRequirement, ...] = pydantic.Field(default_factory=tuple)
    updates: tuple[TableUpdate, ...] = pydantic.Field(default_factory=tuple)


@dataclass(frozen=True)
class TableCreate:
    name: str
    schema: Schema
    location: str | None
    partition_spec: PartitionSpec
    sort_order: SortOrder
    properties: dict[str, str]
    stage_create: bool


class _CreateBody(IcebergBaseModel):
    name: str
    location: str | None = None
    table_schema: Schema = pydantic.Field(alias="schema")
    partition_spec: PartitionSpec | None = pydantic.Field(alias="partition-spec", default=None)
    write_order: SortOrder | None = pydantic.Field(alias="write-order", default=None)
    stage_create: bool = pydantic.Field(alias="stage-create", default=False)
    properties: dict[str, str] = pydantic.Field(default_factory=dict)


def pydantic_message(exc: pydantic.ValidationError) -> str:
    """A short description of what is wrong, without echoing the input values back."""
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error.get("loc", ())) or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "invalid request body: " + "; ".join(parts)


_Model = TypeVar("_Model", bound=pydantic.BaseModel)


# What parsing a client's body with pyiceberg's models raises besides pydantic's ValidationError: pyiceberg's own
# ValidationError (validators such as decimal(P,S)'s bounds), TypeError (an expression without its fields is
# built without checking its shape), RecursionError (a structure nested too deeply). All the client's doing.
CLIENT_PARSE_ERRORS = (ice.ValidationError, TypeError, RecursionError)


def client_parse_message(exc: BaseException) -> str:
    """One of ``CLIENT_PARSE_ERRORS`` as a short description (pyiceberg's message; never a Python type's)."""
    if isinstance(exc, ice.ValidationError):
        return first_line(exc, limit=200)
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return "a value does not have the expected shape"


def validate_client_model(model: type[_Model], body: object) -> _Model:
    """``model`` parsed from a client's body; whatever parsing raises is the client's malformed body (400)."""
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        raise BadRequestError(pydantic_message(exc)) from None
    except CLIENT_PARSE_ERRORS as exc:
        raise BadRequestError(f"invalid request body: {client_parse_message(exc)}") from None


def parse_create_body(body: dict[str, Any]) -> TableCreate:
    parsed = validate_client_model(_CreateBody, body)
    return TableCreate(
        name=validate_table_name(parsed.name),
        schema=parsed.table_schema,
        location=parsed.location.rstrip("/") if parsed.location else None,
        partition_spec=parsed.partition_spec or UNPARTITIONED_PARTITION_SPEC,
        sort_order=parsed.write_order or UNSORTED_SORT_ORDER,
        properties=dict(parsed.properties),
        stage_create=parsed.stage_create,
    )


# Iceberg ids are 32-bit signed ints (Java's readers fail on anything larger); pyiceberg's models take any int.
_MAX_ID = 2**31 - 1


def _check_schema_ids(schema: Schema) -> None:
    """A schema a client adds: its id and every field id (nested ones too) a non-negative 32-bit int."""
    ids = [schema.schema_id, *schema._lazy_id_to_field]
    if any(not 0 <= value <= _MAX_ID for value in ids):
        raise BadRequestError(f"invalid schema: ids must be integers from 0 to {_MAX_ID}")


def _require_same_uuid(
    namespace: Namespace, name: str, previous: TableMetadata, new: TableMetadata, trusted: TrustedState | None
) -> None:
    """Re-admission keeps the table: another table's metadata (a new UUID) would also shed the column tags
    matched by this table's UUID and field ids, and those decide read-restrictions. The UUID is the one the
    catalog recorded with the current pointer, where it did: the current file may have been rewritten in storage
    (a plaintext table's has no digest), and must not decide which UUID counts."""
    recorded = trusted.table_uuid if trusted is not None else None
    if str(new.table_uuid) != (recorded if recorded is not None else str(previous.table_uuid)):
        raise CommitFailedError(
            f"table {'.'.join((*namespace, name))}: the new metadata has another table-uuid; "
            "a table keeps its UUID (drop and register it instead)"
        )


def _recorded_or(trusted: TrustedState | None, metadata: TableMetadata) -> tuple[str, ...]:
    """The places the catalog recorded for a protected table's current revision, else those ``metadata`` names."""
    if trusted is not None and trusted.locations is not None:
        return trusted.locations
    return table_locations(metadata.location, metadata.properties)


def _displaced(before: Sequence[str], after: Sequence[str]) -> tuple[str, ...]:
    """The places in ``before`` that a table holding ``after`` has left (not inside any of them)."""
    return tuple(old for old in before if not covered_by_any(old, after))


def _check_metadata_log(metadata: TableMetadata, own: Sequence[str], logged_before: frozenset[str]) -> None:
    """A client-written metadata-log names only the table's own files: those under its locations, and on a
    re-admission those its current revision already logs (its older metadata, left where an earlier
    ``write.metadata.path`` or location put it). A writer honouring ``write.metadata.delete-after-commit.enabled``
    deletes the entries a later commit trims, so any other file (another table's, a dropped table's, one outside
    the warehouse) is refused."""
    for entry in metadata.metadata_log:
        path = entry.metadata_file
        if path not in logged_before and not covered_by_any(path, own):
            raise BadRequestError("metadata-log names a file that is not the table's own")


def parse_commit_body(body: dict[str, Any]) -> CommitBody:
    return validate_client_model(CommitBody, body)


# ----------------------------------------------------------------------------------------------------
# pyiceberg adaptation


# Fresh names tried beside a dropped table's location: 8 hex digits collide by chance almost never, so failing
# this often means every name beside it overlaps (a dropped location holds the whole namespace).
_FRESH_LOCATION_ATTEMPTS = 8


class _MetadataCache:
    """Parsed metadata files by location. Metadata files are immutable, so entries never go stale."""

    def __init__(self, size: int) -> None:
        self.entries: LRUCache[str, ParsedMetadata] = LRUCache(size)

    def get(self, location: str, io: FileIO) -> ParsedMetadata:
        if (hit := self.entries.get(location)) is not None:
            return hit
        metadata = read_metadata_file(io, location)
        self.entries.put(location, metadata)
        return metadata


class _WarehouseSqlCatalog(SqlCatalog):
    """``SqlCatalog`` on a shared engine whose FileIO never takes settings from table properties."""

    def __init__(self, name: str, engine: Engine, io_properties: dict[str, str], cache_entries: int) -> None:
        # SqlCatalog.__init__ would build its own engine from a URI; reuse the server's (thread-safe, WAL).
        MetastoreCatalog.__init__(self, name, **io_properties)
        self.engine = engine
        self._io = load_file_io(dict(io_properties))
        self.metadata_cache = _MetadataCache(cache_entries)
        self._init_catalog()

    @property
    def io(self) -> FileIO:
        return self._io

    def _load_file_io(self, properties: dict[str, str] | None = None, location: str | None = None) -> FileIO:
        # pyiceberg merges table properties over catalog properties here: a table property such as
        # s3.endpoint or py-io-impl would then steer the catalog's key. Table properties are ignored.
        return self._io

    def _update_and_stage_table(
        self,
        current_table: Table | None,
        table_identifier: Identifier,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> StagedTable:
        # Every commit path stages here (plain, protected, create transaction): the one place to check the result.
        # A create transaction may ask for format v3 (``upgrade-format-version``, as DuckDB's CREATE TABLE does);
        # pyiceberg creates v3 metadata but refuses that update, so it is held back and applied after the others.
        base = current_table.metadata if current_table else None
        version = _created_format_version(current_table, updates)
        # ids first: a spec's partition field ids follow the format version its upgrade-format-version sets
        staged_updates = assigned_ids(base, updates)
        staged_updates = staged_updates if version is None else _without_format_upgrades(staged_updates)
        staged = super()._update_and_stage_table(current_table, table_identifier, requirements, staged_updates)
        check_history(base, staged.metadata, staged_updates)
        metadata = with_snapshot_log(base, staged.metadata, staged_updates)
        if version is not None:
            document = {**metadata.model_dump(by_alias=True), "format-version": version}
            metadata = TableMetadataUtil.parse_obj(document)
        if metadata is not staged.metadata:
            staged = self._with_metadata(staged, metadata)
        _check_added_manifest_lists(staged.metadata, updates)
        return staged

    def _with_metadata(self, staged: StagedTable, metadata: TableMetadata) -> StagedTable:
        return StagedTable(
            identifier=staged.name(),
            metadata=metadata,
            metadata_location=staged.metadata_location,
            io=staged.io,
            catalog=self,
        )

    @staticmethod
    def _write_metadata(metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:
        # pyiceberg writes a legacy table's commits: bounded as the catalog's own writes, or no load reads it back.
        check_new_metadata_size(len(metadata.model_dump_json(exclude_none=True).encode("utf-8")))
        SqlCatalog._write_metadata(metadata, io, metadata_path)

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        if not (metadata_location := orm_table.metadata_location):
            raise ice.NoSuchTableError("table has no metadata location")
        metadata = self.metadata_cache.get(metadata_location, self._io).metadata
        return Table(
            identifier=(*Catalog.identifier_to_tuple(orm_table.table_namespace), orm_table.table_name),
            metadata=metadata,
            metadata_location=metadata_location,
            io=self._io,
            catalog=self,
        )


def _check_added_manifest_lists(metadata: TableMetadata, updates: tuple[TableUpdate, ...]) -> None:
    """An added snapshot's manifest list must lie under the committed table's own locations: server-side planning
    reads it (and its manifests) with the catalog's key, so one naming another table's files would let the
    committer learn that table's statistics."""
    own = table_locations(metadata.location, metadata.properties)
    for update in updates:
        if isinstance(update, AddSnapshotUpdate) and not covered_by_any(update.snapshot.manifest_list, own):
            raise BadRequestError(
                f"snapshot {update.snapshot.snapshot_id}: manifest-list must be inside the table's locations"
            )


def _created_format_version(current_table: Table | None, updates: tuple[TableUpdate, ...]) -> int | None:
    """The format version a create transaction upgrades to, when it is one pyiceberg cannot apply (v3)."""
    if current_table is not None:
        return None
    versions = [u.format_version for u in updates if isinstance(u, UpgradeFormatVersionUpdate)]
    if versions and SUPPORTED_TABLE_FORMAT_VERSION < max(versions) <= _MAX_CREATE_FORMAT_VERSION:
        return max(versions)
    return None


def _without_format_upgrades(updates: tuple[TableUpdate, ...]) -> tuple[TableUpdate, ...]:
    return tuple(u for u in updates if not isinstance(u, UpgradeFormatVersionUpdate))


def is_create_transaction(commit: CommitBody) -> bool:
    """Whether the commit is a create transaction's (its requirements assert that no table exists)."""
    return any(isinstance(r, AssertCreate) for r in commit.requirements)


def with_default_properties(commit: CommitBody, defaults: Mapping[str, str]) -> CommitBody:
    """A create transaction's commit with the server's default table properties set first, as a create merges
    them under its own: the commit's own set-properties, applied after, win."""
    if not defaults:
        return commit
    return commit.model_copy(update={"updates": (SetPropertiesUpdate(updates=dict(defaults)), *commit.updates)})


@contextmanager
def _translated(namespace: Namespace, table: str | None = None) -> Iterator[None]:
    """pyiceberg's exceptions -> the catalog's typed errors, with messages naming the identifier."""
    what = ".".join(namespace) + (f".{table}" if table else "")
    try:
        yield
    except ice.NoSuchTableError:
        raise NoSuchTableError(f"table does not exist: {what}") from None
    except ice.NoSuchNamespaceError:
        raise NoSuchNamespaceError.named(*namespace) from None
    except ice.TableAlreadyExistsError:
        raise AlreadyExistsError(f"table already exists: {what}") from None
    except ice.NamespaceAlreadyExistsError:
        raise AlreadyExistsError(f"namespace already exists: {what}") from None
    except ice.NamespaceNotEmptyError:
        raise NamespaceNotEmptyError(f"namespace is not empty: {what}") from None
    except ice.CommitFailedException as exc:
        raise CommitFailedError(f"commit to {what} failed: {exc}") from None


# ----------------------------------------------------------------------------------------------------
# The warehouse


class WarehouseTables:
    """Every namespace and table operation of one warehouse. Thread-safe; raises ``CatalogError``s."""

    def __init__(self, warehouse: WarehouseConfig, engine: Engine) -> None:
        self.warehouse = warehouse
        self.root = warehouse.location.rstrip("/")
        entries = warehouse.metadata_cache_entries
        self._catalog = _WarehouseSqlCatalog(warehouse.name, engine, catalog_io_properties(warehouse), entries)
        # Serialises "check locations, then create/relocate" in this process (``_claimed``: across processes too):
        # two requests cannot claim overlapping prefixes.
        self._location_lock = threading.Lock()
        create_tables(engine, [VIEW_POINTERS])  # read by every location check, whether or not views are served
        # pins, digests; verified revisions cached like the plain ones
        fingerprint, recheck = storage_fingerprint(warehouse), warehouse.metadata_recheck_seconds
        self.integrity = IntegrityGuard(
            self._catalog,
            self._read_parsed,
            _metadata_locations,
            entries,
            fingerprint,
            recheck,
            legacy_locations=self._legacy_locations,
            credential_lifetime_ms=self._credential_lifetime_ms,
        )

    def cover_unrecorded_credentials(self) -> None:
        """Called when a serving process starts (not by admin commands, which vend nothing and may run often):
        drops and moves reserve places for at least the credential lifetime from now, since processes of an
        earlier version may have vended credentials without recording their expiry (see the guard's method)."""
        if self.warehouse.vend_credentials and not self.warehouse.sts_unavailable:
            self.integrity.cover_unrecorded_credentials()

    # -- namespaces --------------------------------------------------------------------------------------

    def namespace_exists(self, namespace: Namespace) -> bool:
        return bool(self._catalog.namespace_exists(_s(namespace)))

    def _require_namespace(self, namespace: Namespace) -> None:
        if not self.namespace_exists(namespace):
            raise NoSuchNamespaceError.named(*namespace)

    def list_namespaces(self, parent: Namespace | None) -> list[Namespace]:
        if parent:
            self._require_namespace(parent)
        with _translated(parent or ()):
            found = self._catalog.list_namespaces(_s(parent or ()))
        return sorted(from_storage_namespace(tuple(ns)) for ns in found)

    def create_namespace(self, namespace: Namespace, properties: dict[str, str]) -> dict[str, str]:
        if len(namespace) > 1:
            self._require_namespace(namespace[:-1])
        try:
            with _translated(namespace):
                self._catalog.create_namespace(_s(namespace), properties)
        except IntegrityError:
            # Two concurrent creates both pass SqlCatalog's existence check; the second hits the primary key.
            raise AlreadyExistsError(f"namespace already exists: {'.'.join(namespace)}") from None
        return self.load_namespace(namespace)

    def load_namespace(self, namespace: Namespace) -> dict[str, str]:
        self._require_namespace(namespace)
        with _translated(namespace):
            return dict(self._catalog.load_namespace_properties(_s(namespace)))

    def drop_namespace(self, namespace: Namespace) -> None:
        self._require_namespace(namespace)
        if self._catalog.list_namespaces(_s(namespace)):
            raise NamespaceNotEmptyError(f"namespace is not empty (it has child namespaces): {'.'.join(namespace)}")
        with _translated(namespace):
            self._catalog.drop_namespace(_s(namespace))

    def update_namespace_properties(
        self, namespace: Namespace, removals: Sequence[str], updates: dict[str, str]
    ) -> dict[str, list[str]]:
        self._require_namespace(namespace)
        with _translated(namespace):
            summary = self._catalog.update_namespace_properties(_s(namespace), set(removals), updates)
        return {
            "updated": sorted(summary.updated),
            "removed": sorted(summary.removed),
            "missing": sorted(summary.missing or []),
        }

    # -- tables: reads -----------------------------------------------------------------------------------

    def list_tables(self, namespace: Namespace) -> list[str]:
        self._require_namespace(namespace)
        with _translated(namespace):
            return sorted(ident[-1] for ident in self._catalog.list_tables(_s(namespace)))

    def table_exists(self, namespace: Namespace, name: str) -> bool:
        return self._metadata_location(namespace, name) is not None

    def load_table(self, namespace: Namespace, name: str, reuse_verified: bool = False) -> StoredTable:
        """The table as stored; ``reuse_verified`` for read routes (see ``IntegrityGuard.load``)."""
        location, trusted = self.integrity.current(_s(namespace), name)
        location = NoSuchTableError.unless_found(location, *namespace, name)
        # protected tables: verified before returned
        parsed = self.integrity.load(_s(namespace), name, location, trusted, reuse_verified)
        return StoredTable(namespace, name, location, parsed.metadata, parsed.document)

    def require_holding(self, table: StoredTable, expires_at_ms: int | None) -> None:
        """Raise unless ``table`` still holds the places credentials were just vended for (its ``locations``);
        ``expires_at_ms``: when that credential expires (None: static keys, no expiry).

        Called after the vendor recorded their expiry: a drop or move that committed before that record
        reserved the places only until the expiry recorded earlier, so the credential must not be handed out
        (404 for a dropped table, 503 for a moved one: load it again). One that commits after it reserves them
        until this expiry: its read of it waits for the record (``state.vended_credentials_until``).

        A staged create holds its places by a reservation made before the credential was vended, for the
        configured lifetime: it is set to end when this credential expires, which STS decided (later when the
        AssumeRole took a while or STS's clock runs ahead, earlier when STS caps the session)."""
        if table.metadata_location is None:
            if expires_at_ms is not None:
                uuid = str(table.metadata.table_uuid)
                self.integrity.settle_staged(_s(table.namespace), table.name, uuid, expires_at_ms)
            return
        location, trusted = self.integrity.current(_s(table.namespace), table.name)
        location = NoSuchTableError.unless_found(location, *table.namespace, table.name)
        if location == table.metadata_location:
            return
        if _displaced(table.locations, _recorded_or(trusted, self._read_metadata(location))):
            shown = ".".join((*table.namespace, table.name))
            raise ServiceUnavailableError(f"table {shown} moved while credentials were vended for it: load it again")

    def load_table_pending(self, namespace: Namespace, name: str) -> PendingTable:
        """``load_table(reuse_verified=True)`` whose storage fingerprint runs while the caller prepares its answer
        (see ``IntegrityGuard.load_pending``); the caller answers only with ``PendingTable.confirmed()``."""
        location, trusted = self.integrity.current(_s(namespace), name)
        location = NoSuchTableError.unless_found(location, *namespace, name)
        pending = self.integrity.load_pending(_s(namespace), name, location, trusted)
        return PendingTable(namespace, name, location, pending)

    def _metadata_location(self, namespace: Namespace, name: str) -> str | None:
        stmt = select(IcebergTables.metadata_location).where(
            IcebergTables.catalog_name == self.warehouse.name,
            IcebergTables.table_namespace == ".".join(_s(namespace)),
            IcebergTables.table_name == name,
        )
        with Session(self._catalog.engine) as session:
            found: str | None = session.scalar(stmt)
        return found

    def _read_metadata(self, metadata_location: str) -> TableMetadata:
        return self._read_parsed(metadata_location).metadata

    def _read_parsed(self, metadata_location: str, fresh: bool = False) -> ParsedMetadata:
        """The parsed file; ``fresh`` reads storage, bypassing the cache (admissions, protected loads)."""
        try:
            if fresh:
                return read_metadata_file(self._catalog.io, metadata_location)
            return self._catalog.metadata_cache.get(metadata_location, self._catalog.io)
        except FileNotFoundError:
            raise BadRequestError("metadata file not found") from None
        except ValueError as exc:
            raise BadRequestError(f"metadata file is not valid table metadata: {exc}") from None

    @property
    def _credential_lifetime_ms(self) -> int:
        """How long credentials vended for this warehouse's tables may stay valid as asked of STS (a drop or move
        reserves places until the expiry STS answered, recorded by the vendor)."""
        return self.warehouse.credential_lifetime_seconds * 1000

    def default_location(self, namespace: Namespace, name: str) -> str:
        return "/".join((self.root, *namespace, name))

    def _new_table_location(self, namespace: Namespace, name: str) -> str:
        """The default location, or when a table dropped without purge still holds it, a fresh one beside it: so
        dropping a table and creating it again under its name works without reaching the old files. So too when
        a live table or view renamed away from the name still holds it (renames do not move files)."""
        default = location = self.default_location(namespace, name)
        dropped = [theirs for _table, held in self.integrity.dropped_locations() for theirs in held]
        dropped += [theirs for reserved in self.integrity.reserved_locations() for theirs in reserved.locations]
        dropped += [theirs for _table, held in self._all_table_locations() for theirs in held]
        dropped += [theirs for _view, theirs in self._all_view_locations()]
        for _attempt in range(_FRESH_LOCATION_ATTEMPTS):
            if not any(_overlaps(location, theirs) for theirs in dropped):
                return location
            location = f"{default}-{uuid.uuid4().hex[:8]}"
        # A dropped location around the default one (a namespace-wide data path): no name beside it is free, and
        # the create's location check refuses the default with its 403.
        return default

    # -- tables: writes ----------------------------------------------------------------------------------

    def pending_table(self, namespace: Namespace, create: TableCreate) -> StoredTable:
        """What a create would write, written and reserved nowhere: for checks that must pass before anything is
        created (the create itself checks the locations again)."""
        location = self._prepare_create(namespace, create)
        with _client_value_errors():
            metadata = self._new_metadata(create, location)
        return StoredTable(namespace, create.name, None, metadata)

    def pending_registration(
        self, namespace: Namespace, name: str, metadata_location: str, replaces: bool = False
    ) -> Registration:
        """The revision a register would admit, read once and admitted nowhere: the caller's checks (the gate) run
        on it, then ``register`` admits exactly it. ``replaces``: a re-admission of the existing table (404 if
        there is none); otherwise a taken name is refused first, as the register does (409)."""
        self._require_namespace(namespace)
        if replaces and not self.table_exists(namespace, name):
            raise NoSuchTableError.named(*namespace, name)
        if not replaces:
            self._require_absent(namespace, name)
        parsed = self._read_for_admission(metadata_location, (namespace, name))
        return Registration(namespace, name, metadata_location, parsed, replaces)

    def stage_table(self, namespace: Namespace, create: TableCreate) -> StoredTable:
        """Metadata for a create-table transaction; nothing is written until the client commits it."""
        location = self._prepare_create(namespace, create)
        locations = table_locations(location, create.properties)

        def claim() -> TableMetadata:
            self._check_new_locations(locations, exclude=None, claimant=_Claimant(namespace, create.name))
            with _client_value_errors():
                metadata = self._new_metadata(create, location)
            # Nothing is written, yet the response may carry credentials for the place: no other table may claim
            # it while they can be valid (the staged table's own create transaction may). For the lifetime asked
            # of STS until the credential is vended; then until the expiry it answered (``require_holding``).
            until = now_ms() + self._credential_lifetime_ms
            self.integrity.reserve(_s(namespace), create.name, str(metadata.table_uuid), tuple(locations), until)
            return metadata

        metadata = self._claimed(claim, _shown("stage-create of table", namespace, create.name))
        return StoredTable(namespace, create.name, None, metadata)

    def _new_metadata(self, create: TableCreate, location: str) -> TableMetadata:
        """A new table's first metadata, carrying the integrity properties a new table starts with."""
        return new_table_metadata(
            schema=create.schema,
            partition_spec=create.partition_spec,
            sort_order=create.sort_order,
            location=location,
            properties=self.integrity.create_properties(create.schema, create.properties),
        )

    def _prepare_create(self, namespace: Namespace, create: TableCreate) -> str:
        """Checks shared by create and stage-create; returns the table location."""
        self._require_namespace(namespace)
        self._require_absent(namespace, create.name)
        self._check_properties(create.properties)
        return create.location or self._new_table_location(namespace, create.name)

    def _require_absent(self, namespace: Namespace, name: str) -> None:
        # Checked before locations, so an existing name is 409 rather than "overlaps itself" (400).
        if self.table_exists(namespace, name):
            raise AlreadyExistsError(f"table already exists: {'.'.join(namespace)}.{name}")

    def create_table(self, namespace: Namespace, create: TableCreate) -> StoredTable:
        location = self._prepare_create(namespace, create)
        locations = table_locations(location, create.properties)

        def claim() -> None:
            self._check_new_locations(locations, exclude=None, claimant=_Claimant(namespace, create.name))
            with _translated(namespace, create.name), _client_value_errors():
                metadata = self._new_metadata(create, location)
            self.integrity.create(_s(namespace), create.name, metadata)  # row + pin in one transaction

        self._claimed(claim, _shown("create of table", namespace, create.name))
        return self.load_table(namespace, create.name)

    def register_table(
        self, namespace: Namespace, name: str, metadata_location: str, actor: str = "-", overwrite: bool = False
    ) -> StoredTable:
        replaces = overwrite and self.table_exists(namespace, name)
        return self.register(self.pending_registration(namespace, name, metadata_location, replaces), actor)

    def register(self, registration: Registration, actor: str = "-", judge: Judge | None = None) -> StoredTable:
        """Admit the revision ``pending_registration`` read: the file is not read again, so the bytes checked
        (and gated by the caller) are the bytes pinned and answered, whatever storage holds by now. ``judge``: sees
        (current, new metadata) of an overwrite before anything is written, as for a commit."""
        namespace, name, parsed = registration.namespace, registration.name, registration.parsed
        location = registration.metadata_location
        if registration.replaces:  # 404 if the table went meanwhile
            return self._reregister(namespace, name, location, parsed, actor, "register-overwrite", judge=judge)
        self._require_absent(namespace, name)
        return self._admit(namespace, name, location, parsed, actor, "register")

    def _admit(
        self,
        namespace: Namespace,
        name: str,
        metadata_location: str,
        parsed: ParsedMetadata,
        actor: str,
        action: str,
        stamp: Any = None,
        judge: Judge | None = None,
    ) -> StoredTable:
        """Trust on first use of ``parsed`` (the one read of ``metadata_location``): checked, pinned, answered;
        ``judge`` sees (None, its metadata) before anything is written."""

        def claim() -> None:
            if judge is not None:
                judge(None, parsed.metadata)
            self._check_admitted_locations(parsed, (namespace, name), existing=False, logged_before=frozenset())
            # Row + pin (of these bytes' digest) + audit event in one transaction.
            self.integrity.admit(_s(namespace), name, Admission(metadata_location, parsed, actor, action), stamp)

        self._claimed(claim, _shown(f"{action} of table", namespace, name))
        return StoredTable(namespace, name, metadata_location, parsed.metadata, parsed.document)

    def _read_for_admission(self, metadata_location: str, table: tuple[Namespace, str]) -> ParsedMetadata:
        """Read a revision to admit for ``table``, fresh from storage, after checking it is inside the warehouse and
        not a file of another table the request may not write; its properties must be ones a client may set."""
        self._check_inside_warehouse(metadata_location, vocabulary.METADATA_LOCATION)
        self._check_admitted_file_place(metadata_location, table)
        parsed = self._read_parsed(metadata_location, fresh=True)
        self._check_properties(parsed.metadata.properties)
        return parsed

    def _check_admitted_file_place(self, metadata_location: str, table: tuple[Namespace, str]) -> None:
        """Before reading, for an admission of ``table``, a file under another table's location with the catalog's
        own key: the request must be allowed to (``foreign_file_reads``: it may write that table's files). Past this
        check, the refusal of a file that is not table metadata quotes nothing of it, but tells whether it exists."""
        for other, locations in self._all_table_locations():
            if other != table and covered_by_any(metadata_location, locations):
                _check_foreign_file(*other)

    def _check_admitted_locations(
        self, parsed: ParsedMetadata, table: tuple[Namespace, str], *, existing: bool, logged_before: frozenset[str]
    ) -> None:
        """``existing`` and ``logged_before``: a re-admission of the table, and what its current revision logs."""
        own = table_locations(parsed.metadata.location, parsed.metadata.properties)
        claimant = _Claimant(*table, uuid=str(parsed.metadata.table_uuid))
        self._check_new_locations(own, exclude=table if existing else None, claimant=claimant)
        _check_metadata_log(parsed.metadata, own, logged_before)

    def _reregister(
        self,
        namespace: Namespace,
        name: str,
        location: str,
        parsed: ParsedMetadata,
        actor: str,
        action: str,
        stamp: Any = None,
        judge: Judge | None = None,
    ) -> StoredTable:
        """Point an existing table at ``parsed``, the one read of ``location`` (register overwrite, notification
        update): checked, pinned and answered without reading the file again; ``judge`` as for a commit."""

        def claim() -> None:
            found, trusted = self.integrity.current(_s(namespace), name)
            current = NoSuchTableError.unless_found(found, *namespace, name)
            # Not verified: a re-admission may repair a current file that no longer matches its pin.
            previous = self._read_parsed(current).metadata
            _require_same_uuid(namespace, name, previous, parsed.metadata, trusted)
            if judge is not None:
                judge(previous, parsed.metadata)
            logged = frozenset({current, *(entry.metadata_file for entry in previous.metadata_log)})
            self._check_admitted_locations(parsed, (namespace, name), existing=True, logged_before=logged)
            # Other metadata of the same table may move it away, as a commit may: the old places stay claimed. They
            # are the ones the catalog recorded, never what the (unverified) displaced file says now.
            before = _recorded_or(trusted, previous)
            left = _displaced(before, table_locations(parsed.metadata.location, parsed.metadata.properties))
            admitted = Admission(location, parsed, actor, action)
            self.integrity.readmit(_s(namespace), name, (current, trusted), admitted, stamp, left)

        self._claimed(claim, _shown(f"{action} of table", namespace, name))
        return StoredTable(namespace, name, location, parsed.metadata, parsed.document)

    def notify(
        self,
        namespace: Namespace,
        name: str,
        notification: Any,
        actor: str,
        authorized_for: bool | None = None,
        judge: Judge | None = None,
    ) -> None:
        """A Polaris-style table notification (``sqe_catalog.integrity.notifications`` parsed it).

        ``authorized_for``: whether the caller was authorized for an existing table (True) or a missing one (False)
        (None: whatever is there now); a table that appeared or went since is refused (409, 404), so the
        notification never does more than was authorized. ``judge``: sees (current, new metadata) of an UPDATE,
        (None, new metadata) of a CREATE or of an UPDATE that creates the table, before anything is written."""
        self._require_namespace(namespace)
        kind, location = notification.kind, notification.metadata_location
        if kind == "VALIDATE":  # changes nothing, so it neither checks nor records a timestamp
            self._check_inside_warehouse(location, vocabulary.METADATA_LOCATION)
            return
        # Stale -> 409 now; the timestamp is recorded only in the transaction that carries the notification out.
        stamp = self.integrity.notification_stamp(_s(namespace), name, notification.timestamp_ms)
        exists = self.table_exists(namespace, name)
        if authorized_for is not None and exists != authorized_for:
            if exists:
                raise AlreadyExistsError(f"table already exists: {'.'.join(namespace)}.{name}")
            raise NoSuchTableError.named(*namespace, name)
        if kind == "DROP":
            if not exists:
                raise NoSuchTableError.named(*namespace, name)
            self.integrity.drop(_s(namespace), name, None, self._uuid_if_readable(namespace, name), stamp)
        elif exists and kind == "CREATE":
            raise AlreadyExistsError(f"table already exists: {'.'.join(namespace)}.{name}")
        elif exists:
            self.integrity.require_notification_update(_s(namespace), name)
            parsed = self._read_for_admission(location, (namespace, name))
            self._reregister(namespace, name, location, parsed, actor, "notification-update", stamp, judge)
        else:
            parsed = self._read_for_admission(location, (namespace, name))
            self._admit(namespace, name, location, parsed, actor, f"notification-{kind.lower()}", stamp, judge)

    def commit_table(
        self,
        namespace: Namespace,
        name: str,
        commit: CommitBody,
        gated_uuid: uuid.UUID | None = None,
        judge: Judge | None = None,
    ) -> StoredTable:
        """Apply requirements + updates atomically; a failed requirement or lost race: CommitFailedError.

        ``gated_uuid``: the table the caller authorized the commit on; checked against the base the commit is
        applied to, so another table created under the name since is refused (409), never committed ungated.
        ``judge``: sees (base, new metadata) of a commit to an existing table before anything is written."""
        if gated_uuid is not None:  # an implicit assert-table-uuid
            same_table = AssertTableUUID(uuid=gated_uuid)
            commit = commit.model_copy(update={"requirements": (*commit.requirements, same_table)})
        creating = is_create_transaction(commit)
        if creating:
            commit = self._prepare_create_commit(namespace, name, commit)
        elif not self.table_exists(namespace, name):
            raise NoSuchTableError.named(*namespace, name)
        self._check_commit_properties(commit.updates)
        requirements, updates = commit.requirements, commit.updates

        def apply(left: tuple[str, ...]) -> tuple[str, ParsedMetadata]:
            with _translated(namespace, name), _client_value_errors():
                if creating:
                    return self.integrity.commit_create(_s(namespace), name, requirements, updates)
                # legacy or protected: decided with the pointer swap (IntegrityGuard.commit)
                return self.integrity.commit(_s(namespace), name, requirements, updates, left, judge)

        if not (creating or self._changes_locations(updates)):
            return self._as_loaded(namespace, name, apply(()))  # claims no place: no claim section

        # Claims places (a create, a location or path update): checked, then committed, in a claim section. The
        # places it moves the table away from stay claimed as a dropped table's: the table's snapshots still name
        # its files there, and a new table there would be vended credentials for them.
        def claim() -> tuple[str, ParsedMetadata]:
            return apply(self._check_commit_locations(namespace, name, updates, creating))

        # Given up: 409 CommitFailedException, "not applied": clients retry a table commit on a fresh base, and fail a
        # create transaction cleanly (Java deletes its uncommitted files; it never retries one). A 5xx on a commit
        # they must read as "state unknown": neither retried nor cleaned up.
        shown = _shown("commit of table", namespace, name)
        return self._as_loaded(namespace, name, self._claimed(claim, shown, CommitFailedError))

    def pending_commit_create(self, namespace: Namespace, name: str, commit: CommitBody) -> StoredTable:
        """What a create transaction's commit would write, written and reserved nowhere: for checks that must pass
        before anything is created (as ``pending_table`` for a create; the commit checks the locations)."""
        commit = self._prepare_create_commit(namespace, name, commit)
        self._check_commit_properties(commit.updates)
        with _translated(namespace, name), _client_value_errors():
            metadata = self.integrity.staged_create(_s(namespace), name, commit.requirements, commit.updates)
        return StoredTable(namespace, name, None, metadata)

    def _prepare_create_commit(self, namespace: Namespace, name: str, commit: CommitBody) -> CommitBody:
        """Checks shared by a create transaction's gate and commit; the commit placed where a create would be."""
        self._require_namespace(namespace)
        self._require_absent(namespace, name)
        if any(isinstance(u, SetLocationUpdate) for u in commit.updates):
            return commit
        located = (SetLocationUpdate(location=self._new_table_location(namespace, name)), *commit.updates)
        return commit.model_copy(update={"updates": located})

    def _claimed(self, claim: Callable[[], _T], what: str, gave_up: type[CatalogError] = ClaimContendedError) -> _T:
        """Run ``claim`` (the checks of the places it claims, then the transaction recording the claim) as one
        critical section: against this process's other requests (the location lock) and against every other
        catalog process on the database (``IntegrityGuard.claiming``). When another process's claim committed
        behind its checks, nothing was written and it runs again, checked afresh, after a jittered pause
        (``sqe_catalog.contention``). When it keeps losing: ``gave_up`` naming ``what``, nothing written. The
        default, a 503 with ``Retry-After``, is for creates, where clients read a 409 as "already exists"."""

        def attempt() -> _T:
            with self._location_lock, self.integrity.claiming():
                return claim()

        def contended(attempts: int) -> CatalogError:
            return gave_up(
                f"{what} not applied: places of warehouse {self.warehouse.name} kept being claimed concurrently by"
                f" other catalog processes ({attempts} attempts); nothing was committed, retry"
            )

        return retried_claim(attempt, contended)

    def _check_commit_properties(self, updates: Sequence[TableUpdate]) -> None:
        for update in updates:
            if isinstance(update, SetPropertiesUpdate):
                self._check_properties(update.updates)
            elif isinstance(update, AddSchemaUpdate):
                _check_schema_ids(update.schema_)

    @staticmethod
    def _as_loaded(namespace: Namespace, name: str, committed: tuple[str, ParsedMetadata]) -> StoredTable:
        location, parsed = committed
        return StoredTable(namespace, name, location, parsed.metadata, parsed.document)

    def drop_table(self, namespace: Namespace, name: str, purge: bool) -> None:
        # A purge loads (and for a protected table verifies) first: a failure refuses the drop, nothing removed.
        # A purge returns once its cleanup task is persisted; the cleaner verifies again before it deletes.
        table = self.load_table(namespace, name) if purge else None
        purge_location = table.metadata_location if table else None
        uuid = str(table.metadata.table_uuid) if table else self._uuid_if_readable(namespace, name)
        self.integrity.drop(_s(namespace), name, purge_location, uuid)

    def _uuid_if_readable(self, namespace: Namespace, name: str) -> str | None:
        """The table's UUID, or None when its metadata cannot be read (a drop without purge still goes ahead)."""
        try:
            return str(self.load_table(namespace, name).metadata.table_uuid)
        except (CatalogError, OSError, ValueError):
            return None

    def run_cleanup(self, persisted_before_ms: int | None = None) -> dict[int, str]:
        """Run this warehouse's pending cleanup tasks (background cleaner, ``sqe-catalog admin run-cleanup``)."""
        return self.integrity.run_pending_cleanup(self._delete_files, persisted_before_ms)

    def _delete_files(
        self, table: TableName, metadata: TableMetadata, metadata_location: str, recorded: tuple[str, ...] | None
    ) -> str:
        dropped = StoredTable(from_storage_namespace(table.namespace), table.name, metadata_location, metadata)
        return self._purge_files(dropped, recorded, str(table))

    def rename_table(self, source: tuple[Namespace, str], target: tuple[Namespace, str]) -> None:
        (src_ns, src_name), (dst_ns, dst_name) = source, target
        if not self.table_exists(src_ns, src_name):
            raise NoSuchTableError.named(*src_ns, src_name)
        self._require_namespace(dst_ns)
        if self.table_exists(dst_ns, dst_name):
            raise AlreadyExistsError(f"table already exists: {'.'.join(dst_ns)}.{dst_name}")
        with _translated(dst_ns, dst_name):
            self.integrity.rename(
                (_s(src_ns), src_name), (_s(dst_ns), dst_name)
            )  # table row and pin move in one transaction

    # -- checks ------------------------------------------------------------------------------------------

    @staticmethod
    def _check_properties(properties: dict[str, str]) -> None:
        forbidden = sorted(FORBIDDEN_TABLE_PROPERTIES & set(properties))
        if forbidden:
            raise BadRequestError(f"table property not allowed: {forbidden[0]}")

    def _check_inside_warehouse(self, location: str, what: str) -> None:
        scheme, parts = _split_location(location)
        root_scheme, root_parts = _split_location(self.root)
        # URI_CHARACTERS: pyiceberg's FileIO parses a location as a URI and would cut its path there (another place).
        unsafe = any(ord(ch) < 0x20 or ch in URI_CHARACTERS for ch in location)
        if unsafe or any(part in ("", ".", "..") for part in parts):
            raise BadRequestError(f"{what} is not a normalised location")
        inside = scheme == root_scheme and len(parts) > len(root_parts) and parts[: len(root_parts)] == root_parts
        if not inside:
            raise BadRequestError(f"{what} must be inside the warehouse location {self.root}")

    def _check_new_locations(
        self, locations: Sequence[str], exclude: tuple[Namespace, str] | None, claimant: _Claimant
    ) -> None:
        """Refuse ``locations`` for the table ``claimant`` where they overlap another table's (``exclude``: the
        claimant's current ones, for a table that exists), a dropped or moved table's, or a reservation."""
        for location in locations:
            self._check_inside_warehouse(location, "table location")
        views = dict(self._all_view_locations())
        if (claimant.namespace, claimant.name) in views:  # a view created since the name was checked
            raise AlreadyExistsError(f"a view of that name exists: {'.'.join((*claimant.namespace, claimant.name))}")
        held = self._check_table_overlaps(locations, exclude, "table location")
        self._check_view_overlaps(locations, None, "table location", views)
        # A location inside one the table already holds reaches no file its credentials did not already reach.
        new = [loc for loc in locations if not covered_by_any(loc, held)]
        self._check_dropped_locations(new)
        self._check_reserved_locations(new, claimant)
        self._check_namespace_areas(new, claimant.namespace)

    def _check_table_overlaps(
        self, locations: Sequence[str], exclude: tuple[Namespace, str] | None, what: str
    ) -> tuple[str, ...]:
        """Refuse ``locations`` overlapping a table's other than ``exclude``; returns ``exclude``'s locations."""
        held: tuple[str, ...] = ()
        for (other_ns, other_name), other_locations in self._all_table_locations():
            if exclude == (other_ns, other_name):
                held = other_locations
                continue
            if any(_overlaps(mine, theirs) for mine in locations for theirs in other_locations):
                raise BadRequestError(f"{what} overlaps the location of table {'.'.join((*other_ns, other_name))}")
        return held

    def _check_view_overlaps(
        self,
        locations: Sequence[str],
        exclude: tuple[Namespace, str] | None,
        what: str,
        views: dict[tuple[Namespace, str], str] | None = None,
    ) -> None:
        """Refuse ``locations`` overlapping the location of a view other than ``exclude`` (``views``: all views'
        locations, when already read)."""
        for (view_ns, view_name), view_location in (views or dict(self._all_view_locations())).items():
            if exclude != (view_ns, view_name) and any(_overlaps(mine, view_location) for mine in locations):
                raise BadRequestError(f"{what} overlaps the location of view {'.'.join((*view_ns, view_name))}")

    def _all_view_locations(self) -> Iterator[tuple[tuple[Namespace, str], str]]:
        """Each view's location: the directory its pointer's metadata file is in (``<location>/metadata/``), the
        catalog's own record, never what a (rewritable) metadata file says."""
        v = VIEW_POINTERS.c
        stmt = select(v.namespace, v.view_name, v.metadata_location).where(v.warehouse == self.warehouse.name)
        with self._catalog.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        for namespace, name, metadata_location in rows:
            levels = tuple(str(namespace).split(vocabulary.NAMESPACE_SEPARATOR))
            yield (levels, str(name)), pointer_directory(str(metadata_location))

    def view_location_claimed(
        self, namespace: Namespace, name: str, location: str, write: Callable[[], _T], replace: bool = False
    ) -> _T:
        """Run ``write`` (a view create, or with ``replace`` a replace, at ``location``, whose transaction calls
        ``integrity.fence``) in a claim section, after checking the location overlaps no table's, no other view's
        and no place credentials may still be valid for (a table's writers there could rewrite the view's SQL).
        Kept losing the claim: a replace (a commit) is 409 CommitFailedException, a create 503 (as a table's)."""
        what = "view location"

        def claim() -> _T:
            if self.table_exists(namespace, name):  # a table created since the name was checked
                raise AlreadyExistsError(f"a table of that name exists: {'.'.join((*namespace, name))}")
            self._check_inside_warehouse(location, what)
            self._check_table_overlaps((location,), None, what)
            self._check_view_overlaps((location,), (namespace, name), what)
            self._check_reserved_locations((location,), None, what)
            return write()

        if replace:
            return self._claimed(claim, _shown("replace of view", namespace, name), CommitFailedError)
        return self._claimed(claim, _shown("create of view", namespace, name))

    def new_view_location(self, namespace: Namespace, name: str) -> str:
        """Where a new view goes: as a new table of that name would (beside a dropped or reserved place)."""
        return self._new_table_location(namespace, name)

    def _check_namespace_areas(self, locations: Sequence[str], namespace: Namespace) -> None:
        """A place inside another namespace's area (where its tables go by default) is that namespace's to give
        out: a table of ``namespace`` may take it only where the request may create tables there. Areas of
        ``namespace`` itself and of namespaces nested in it are its own."""
        for location in locations:
            owner = self._area_owner(location)
            if owner is not None and owner[: len(namespace)] != namespace:
                _check_area_claim(owner)

    def _area_owner(self, location: str) -> Namespace | None:
        """The deepest existing namespace whose area (``<warehouse>/<level>/...``) holds ``location``."""
        root_parts = _split_location(self.root)[1]
        # No namespace is deeper than MAX_NAMESPACE_DEPTH: a location thousands of levels deep costs no more
        # lookups (one per level, under the location lock) than one at that depth.
        levels = _split_location(location)[1][len(root_parts) :][:MAX_NAMESPACE_DEPTH]
        for depth in range(len(levels), 0, -1):
            if self.namespace_exists(tuple(levels[:depth])):
                return tuple(levels[:depth])
        return None

    def _check_reserved_locations(
        self, locations: Sequence[str], claimant: _Claimant | None, what: str = "table location"
    ) -> None:
        """Refuse a place reserved for another table (for a table ``claimant``; None: a view, which holds no
        reservation): credentials vended for it may still be valid."""
        if not locations:
            return
        for reserved in self.integrity.reserved_locations():
            if claimant is not None and claimant.holds(reserved):
                continue
            owner = (*from_storage_namespace(reserved.namespace), reserved.name)
            if any(_overlaps(mine, theirs) for mine in locations for theirs in reserved.locations):
                until = iso_utc(reserved.until_ms / 1000, zulu=True)
                raise ForbiddenError(
                    f"{what} overlaps a place credentials were vended for (table {'.'.join(owner)}): it is "
                    f"reserved until {until}, while they may still be valid"
                )

    def _check_dropped_locations(self, locations: Sequence[str]) -> None:
        """Refuse claiming a location that overlaps a dropped table whose files are still there (a new table there
        would be vended credentials for them), unless the request may (``dropped_location_reuse``)."""
        if not locations:
            return
        for (ns, name), dropped in self.integrity.dropped_locations():
            if any(_overlaps(mine, theirs) for mine in locations for theirs in dropped):
                _check_dropped_claim(from_storage_namespace(ns), name)

    def _all_table_locations(self) -> Iterator[tuple[tuple[Namespace, str], tuple[str, ...]]]:
        stmt = select(IcebergTables.table_namespace, IcebergTables.table_name, IcebergTables.metadata_location).where(
            IcebergTables.catalog_name == self.warehouse.name
        )
        with Session(self._catalog.engine) as session:
            rows = session.execute(stmt).all()
        stored = self.integrity.stored_locations()  # protected tables: recorded by the catalog, never re-read
        for namespace, name, metadata_location in rows:
            key = (tuple(namespace.split(".")), name)
            if key in stored:
                yield (from_storage_namespace(key[0]), name), stored[key]
            elif metadata_location:
                yield (from_storage_namespace(key[0]), name), self._legacy_locations(key, metadata_location)

    def _legacy_locations(self, key: tuple[Namespace, str], metadata_location: str) -> tuple[str, ...]:
        """A legacy table's locations from its metadata file; if that cannot be read, the directory its pointer
        (the catalog's own record) lives in is claimed instead, so a broken table's area stays taken."""
        try:
            metadata = self._read_metadata(metadata_location)
        except BadRequestError:
            log.warning(
                "table %s.%s has unreadable metadata; claiming its metadata directory", ".".join(key[0]), key[1]
            )
            return (pointer_directory(metadata_location),)
        return table_locations(metadata.location, metadata.properties)

    @staticmethod
    def _changes_locations(updates: Sequence[TableUpdate]) -> bool:
        for update in updates:
            if isinstance(update, SetLocationUpdate):
                return True
            if isinstance(update, SetPropertiesUpdate) and set(update.updates) & set(LOCATION_PROPERTIES):
                return True
            # Removing a path moves the table back to its default place: it leaves the old one.
            if isinstance(update, RemovePropertiesUpdate) and set(update.removals) & set(LOCATION_PROPERTIES):
                return True
        return False

    def _check_commit_locations(
        self, namespace: Namespace, name: str, updates: Sequence[TableUpdate], creating: bool
    ) -> tuple[str, ...]:
        """Check the locations the commit leaves the table with; returns the current ones it moves away from."""
        before: tuple[str, ...] = ()
        if creating:
            location, properties = "", {}
        else:
            current = self.load_table(namespace, name).metadata
            location, properties = current.location, dict(current.properties)
            before = table_locations(location, properties)
        for update in updates:
            if isinstance(update, SetLocationUpdate):
                location = update.location
            elif isinstance(update, SetPropertiesUpdate):
                properties.update(update.updates)
            elif isinstance(update, RemovePropertiesUpdate):
                for key in update.removals:
                    properties.pop(key, None)
        after = table_locations(location, properties)
        self._check_new_locations(after, exclude=(namespace, name), claimant=_Claimant(namespace, name))
        return _displaced(before, after)

    # -- purge -------------------------------------------------------------------------------------------

    def _purge_files(self, table: StoredTable, recorded: tuple[str, ...] | None, shown: str) -> str:
        """Delete the table's files, but only those under its own locations (metadata is client-written) and, when
        the catalog recorded the table's locations at the drop, under those too (the file may have been rewritten
        in storage since: a protected plaintext table's has no digest). ``shown``: the table, as logs name it."""

        def own(path: str) -> bool:
            return covered_by_any(path, table.locations) and (recorded is None or covered_by_any(path, recorded))

        files = self._referenced_files(table, own, shown)
        inside = sorted(path for path in files if own(path))
        deleted, refused = 0, 0
        for path in inside:
            try:
                self._catalog.io.delete(path)
                deleted += 1
            except FileNotFoundError:
                pass  # already gone
            except OSError:
                refused += 1
        summary = f"{deleted} of {len(files)} referenced files deleted, {len(files) - len(inside)} outside left alone"
        if refused:  # the task fails, so the drop's tombstone keeps guarding the files that stay
            raise OSError(f"{summary}; the store refused to delete {refused}")
        log.info("purged table at %s: %s", table.location, summary)
        return summary

    def _referenced_files(self, table: StoredTable, own: Callable[[str], bool], shown: str) -> set[str]:
        """Metadata files, manifest lists, manifests and data files; lists outside the table (``own``) are not
        read."""
        # A table's writer decides what they hold: read no further than planning reads them.
        io = BoundedManifestIO(self._catalog.io, CatalogManifestBounds("files it names are not purged"))
        files = {entry.metadata_file for entry in table.metadata.metadata_log}
        if table.metadata_location:
            files.add(table.metadata_location)
        for snapshot in table.metadata.snapshots:
            files.add(snapshot.manifest_list)
            if not own(snapshot.manifest_list):
                continue
            manifests: list[ManifestFile] = []
            with _unread_logged(shown):
                manifests = snapshot.manifests(io)
            for manifest in manifests:
                files.add(manifest.manifest_path)
                if own(manifest.manifest_path):
                    # One refused manifest leaves only the files it names: the list's next manifests are read.
                    with _unread_logged(shown):
                        entries = manifest.fetch_manifest_entry(io, discard_deleted=False)
                        files.update(entry.data_file.file_path for entry in entries)
        return files


@contextmanager
def _unread_logged(shown: str) -> Iterator[None]:
    """A purge's read of a manifest list or manifest: a missing, corrupt or refused file is logged (naming the
    table ``shown``, never the file's path) and must not stop the rest of the purge."""
    try:
        yield
    except Exception as exc:
        why = exc.message if isinstance(exc, ManifestLimitError) else type(exc).__name__
        log.warning("purge of %s could not read a manifest: %s", shown, why)


def _shown(what: str, namespace: Namespace, name: str) -> str:
    """``what`` and the object's dotted name, for a message (``create of table ns.t``)."""
    return f"{what} {'.'.join((*namespace, name))}"


def pointer_directory(metadata_location: str) -> str:
    """``<table>/metadata/00001-x.metadata.json`` -> ``<table>``; any other layout -> the file's directory."""
    directory = metadata_location.rsplit("/", 1)[0]
    return directory.removesuffix("/metadata") if directory.endswith("/metadata") else directory


@contextmanager
def _client_value_errors() -> Iterator[None]:
    """pyiceberg rejects invalid schemas/updates with ValueError: that is the client's mistake (400)."""
    try:
        yield
    except (ValueError, ice.ValidationError) as exc:
        raise BadRequestError(f"invalid table update: {exc}") from None
    except KeyError as exc:  # e.g. remove-properties naming a property the table does not have
        raise BadRequestError(f"invalid table update: no such key {exc}") from None
    except StopIteration:  # pyiceberg's next() over the schemas or specs: a create transaction added none
        raise BadRequestError(
            "invalid table update: the table would have no current schema or default partition spec"
        ) from None
