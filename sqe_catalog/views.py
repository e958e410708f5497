"""Iceberg views of one warehouse: metadata JSON files in the warehouse, pointers in the catalog database.

A view's location is where a new table of its name would go (``<warehouse>/<namespace levels>/<view>``, or beside
it where a dropped table's files or vended credentials still hold that place); the catalog writes its metadata
files with the warehouse's own FileIO only under it, to ``<location>/metadata/<n>-<uuid>.metadata.json``, so the
directory of the pointer's file is the location, whatever a metadata file says. A view's location overlaps no
table's and no other view's (``WarehouseTables.view_location_claimed``, in the tables' claim section): vended
table credentials never reach a view's metadata, whose SQL runs in every invoker's session.

The pointer row lives in ``sqe_catalog_views``; a replace moves it with a compare-and-swap on the previous
location, so a lost race is a 409 and never a lost update. The document is validated by pyiceberg's
``ViewMetadata`` model before it is written.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic
from pyiceberg.io import load_file_io
from pyiceberg.view.metadata import ViewMetadata
from sqlalchemy import ColumnElement, Engine, delete, insert, select, update

from sqe import vocabulary
from sqe_catalog.config import WarehouseConfig
from sqe_catalog.errors import (
    AlreadyExistsError,
    BadRequestError,
    CommitFailedError,
    NoSuchNamespaceError,
    NotFoundError,
)
from sqe_catalog.identifiers import Namespace, validate_name
from sqe_catalog.integrity.admission import removed_if_raced
from sqe_catalog.integrity.canonical import check_new_metadata_size, read_metadata_bytes
from sqe_catalog.schema import VIEW_POINTERS, create_tables
from sqe_catalog.tables import (
    CLIENT_PARSE_ERRORS,
    WarehouseTables,
    catalog_io_properties,
    client_parse_message,
    pointer_directory,
)

__all__ = ["NoSuchViewError", "StoredView", "ViewStore", "validate_view_name"]

_views = VIEW_POINTERS
# Versions pile up in a view's file: replacing it with a smaller one (a new view) is the way out.
_VIEW_SIZE_ADVICE = "drop the view and create it again"


class NoSuchViewError(NotFoundError, error_type=vocabulary.ERROR_NO_SUCH_VIEW):
    kind = "view"


def validate_view_name(name: object) -> str:
    return validate_name(name, "view name")


@dataclass(frozen=True)
class StoredView:
    """A view as loaded: its pointer row's metadata location and the validated document found there."""

    namespace: Namespace
    name: str
    metadata_location: str  # the pointer row's: the catalog's own record, not the document's word
    document: dict[str, Any]


def _encode(namespace: Namespace) -> str:
    return vocabulary.NAMESPACE_SEPARATOR.join(namespace)


def _checked(document: dict[str, Any]) -> dict[str, Any]:
    """The document if pyiceberg's view model accepts it (400 otherwise, without echoing values)."""
    try:
        ViewMetadata.model_validate(document)
    except pydantic.ValidationError as exc:
        where = "; ".join(".".join(str(p) for p in e.get("loc", ())) for e in exc.errors()[:3])
        raise BadRequestError(f"invalid view metadata at {where or 'body'}") from None
    except CLIENT_PARSE_ERRORS as exc:
        raise BadRequestError(f"invalid view metadata: {client_parse_message(exc)}") from None
    return document


def _now_ms() -> int:
    return int(time.time() * 1000)


def _new_document(location: str, body: dict[str, Any]) -> dict[str, Any]:
    """A new view's first metadata, at ``location``."""
    schema, version = body.get("schema"), body.get("view-version")
    if not isinstance(schema, dict) or not isinstance(version, dict):
        raise BadRequestError("a view needs a schema and a view-version object")
    properties = body.get("properties") or {}
    if not isinstance(properties, dict):
        raise BadRequestError("properties must be an object of string values")
    schema_id = int(schema.get("schema-id", 0))
    version = {**version, "version-id": 1, "schema-id": schema_id}
    version.setdefault("timestamp-ms", _now_ms())
    return {
        "view-uuid": str(uuid.uuid4()),
        "format-version": 1,
        "location": location,  # client locations are not accepted
        "schemas": [{**schema, "schema-id": schema_id}],
        "current-version-id": 1,
        "versions": [version],
        "version-log": [{"timestamp-ms": version["timestamp-ms"], "version-id": 1}],
        "properties": dict(properties),
    }


class ViewStore:
    """Views of one warehouse; ``tables`` (the warehouse's) has its namespaces, and the location rule and lock."""

    def __init__(self, warehouse: WarehouseConfig, engine: Engine, tables: WarehouseTables) -> None:
        self._warehouse = warehouse.name
        self._engine = engine
        self._io = load_file_io(catalog_io_properties(warehouse))
        self._tables = tables
        self._namespace_exists: Callable[[Namespace], bool] = tables.namespace_exists
        self._table_exists: Callable[[Namespace, str], bool] = tables.table_exists

    def create_schema(self) -> None:
        create_tables(self._engine, [_views])

    # -- reads -------------------------------------------------------------------------------------------

    def list_views(self, namespace: Namespace) -> list[str]:
        self._require_namespace(namespace)
        stmt = select(_views.c.view_name).where(
            _views.c.warehouse == self._warehouse, _views.c.namespace == _encode(namespace)
        )
        with self._engine.connect() as conn:
            return sorted(conn.execute(stmt).scalars())

    def view_exists(self, namespace: Namespace, name: str) -> bool:
        return self._location(namespace, name) is not None

    def load_view(self, namespace: Namespace, name: str) -> StoredView:
        location = NoSuchViewError.unless_found(self._location(namespace, name), *namespace, name)
        return StoredView(namespace, name, location, self._read(location))

    def _location(self, namespace: Namespace, name: str) -> str | None:
        stmt = select(_views.c.metadata_location).where(*self._row(namespace, name))
        with self._engine.connect() as conn:
            found: str | None = conn.execute(stmt).scalar()
        return found

    def _read(self, location: str) -> dict[str, Any]:
        try:  # bounded as a table's: a writer of the store could put a huge (or gzip-bomb) file there
            document = json.loads(read_metadata_bytes(self._io, location).decode("utf-8"))
        except ValueError as exc:  # too large, not gzip, not UTF-8 or not JSON
            raise BadRequestError(f"view metadata file is not valid: {exc}") from None
        if not isinstance(document, dict):
            raise BadRequestError("view metadata file is not a JSON object")
        return document

    # -- writes ------------------------------------------------------------------------------------------

    def create_view(self, namespace: Namespace, name: str, body: dict[str, Any]) -> StoredView:
        self._require_namespace(namespace)
        if self._table_exists(namespace, name):
            raise AlreadyExistsError(f"a table of that name exists: {'.'.join((*namespace, name))}")
        if self.view_exists(namespace, name):
            raise AlreadyExistsError(f"view already exists: {'.'.join((*namespace, name))}")
        view_location = self._tables.new_view_location(namespace, name)
        document = _checked(_new_document(view_location, body))

        # Checked, written and recorded in a claim section: no table or view claims the place meanwhile.
        def write() -> str:
            location = self._write(document, view_location, 0)
            with removed_if_raced(self._io, location):  # another process's claim won: checked and written again
                self._insert(namespace, name, location)
            return location

        location = self._tables.view_location_claimed(namespace, name, view_location, write)
        return StoredView(namespace, name, location, document)

    def _insert(self, namespace: Namespace, name: str, metadata_location: str) -> None:
        with self._engine.begin() as conn:
            try:
                conn.execute(
                    insert(_views).values(
                        warehouse=self._warehouse,
                        namespace=_encode(namespace),
                        view_name=name,
                        metadata_location=metadata_location,
                    )
                )
            except Exception:
                raise AlreadyExistsError(f"view already exists: {'.'.join((*namespace, name))}") from None
            self._tables.integrity.fence(conn)  # the claim section's record: rolled back if another claim won

    def _write(self, document: dict[str, Any], view_location: str, sequence: int) -> str:
        """Write ``document`` under the view's location (its ``location`` field set to it, whatever it said)."""
        document["location"] = view_location
        location = f"{view_location}/metadata/{sequence:05d}-{uuid.uuid4()}.metadata.json"
        data = json.dumps(document, separators=(",", ":")).encode("utf-8")
        check_new_metadata_size(len(data), _VIEW_SIZE_ADVICE)  # no load would read it back
        with self._io.new_output(location).create(overwrite=False) as stream:
            stream.write(data)
        return location

    def replace_view(self, namespace: Namespace, name: str, body: dict[str, Any]) -> StoredView:
        """The spec's CommitViewRequest: requirements (``assert-view-uuid``) then updates, compare-and-swap."""
        current = self.load_view(namespace, name)
        document = json.loads(json.dumps(current.document))
        for requirement in _list(body.get("requirements"), "requirements"):
            _check_requirement(requirement, document)
        for change in _list(body.get("updates"), "updates"):
            _apply_update(change, document)
        document.pop("_last_added_schema", None)
        document.pop("_last_added_version", None)
        _checked(document)
        sequence = len(document.get("version-log", []))
        # The location the catalog recorded (where the current file is), not the file's field: files stay under it.
        view_location = pointer_directory(current.metadata_location)

        # A view recorded before table and view locations were kept apart may overlap a table: its new SQL is not
        # written where that table's writers could rewrite it.
        def write() -> str:
            location = self._write(document, view_location, sequence)
            with removed_if_raced(self._io, location):
                self._swap(namespace, name, current.metadata_location, location)
            return location

        location = self._tables.view_location_claimed(namespace, name, view_location, write, replace=True)
        return StoredView(namespace, name, location, document)

    def _swap(self, namespace: Namespace, name: str, previous: str, metadata_location: str) -> None:
        """Move the pointer from ``previous`` to ``metadata_location``; 409 if it is no longer at ``previous``."""
        stmt = (
            update(_views)
            .where(*self._row(namespace, name), _views.c.metadata_location == previous)
            .values(metadata_location=metadata_location)
        )
        with self._engine.begin() as conn:
            if conn.execute(stmt).rowcount != 1:
                raise CommitFailedError(f"view {'.'.join((*namespace, name))} changed concurrently; retry")
            self._tables.integrity.fence(conn)  # the claim section's record: rolled back if another claim won

    def drop_view(self, namespace: Namespace, name: str) -> None:
        stmt = delete(_views).where(*self._row(namespace, name))
        with self._engine.begin() as conn:
            if conn.execute(stmt).rowcount != 1:
                raise NoSuchViewError.named(*namespace, name)

    def rename_view(self, source: tuple[Namespace, str], target: tuple[Namespace, str]) -> None:
        (src_ns, src_name), (dst_ns, dst_name) = source, target
        if not self.view_exists(src_ns, src_name):
            raise NoSuchViewError.named(*src_ns, src_name)
        self._require_namespace(dst_ns)
        if self.view_exists(dst_ns, dst_name) or self._table_exists(dst_ns, dst_name):
            raise AlreadyExistsError(f"view or table already exists: {'.'.join((*dst_ns, dst_name))}")
        stmt = update(_views).where(*self._row(src_ns, src_name)).values(namespace=_encode(dst_ns), view_name=dst_name)
        with self._engine.begin() as conn:
            if conn.execute(stmt).rowcount != 1:
                raise NoSuchViewError.named(*src_ns, src_name)

    def _row(self, namespace: Namespace, name: str) -> tuple[ColumnElement[bool], ...]:
        """The conditions that select the pointer row of one view of this warehouse."""
        return (
            _views.c.warehouse == self._warehouse,
            _views.c.namespace == _encode(namespace),
            _views.c.view_name == name,
        )

    def _require_namespace(self, namespace: Namespace) -> None:
        if not self._namespace_exists(namespace):
            raise NoSuchNamespaceError.named(*namespace)


# ----------------------------------------------------------------------------------------------------
# View requirements and updates (the spec's ViewRequirement / ViewUpdate actions)


def _list(value: object, what: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise BadRequestError(f"{what} must be a list of objects")
    return list(value)


def _check_requirement(requirement: dict[str, Any], document: dict[str, Any]) -> None:
    if requirement.get("type") != "assert-view-uuid":
        raise BadRequestError("unknown view requirement type")
    if requirement.get("uuid") != document["view-uuid"]:
        raise CommitFailedError("requirement failed: view uuid does not match")


def _apply_update(change: dict[str, Any], document: dict[str, Any]) -> None:
    action = change.get("action")
    if action == "set-properties":
        updates = change.get("updates")
        if not isinstance(updates, dict):
            raise BadRequestError("set-properties needs an updates object")
        document["properties"].update(updates)
    elif action == "remove-properties":
        for key in change.get("removals") or []:
            document["properties"].pop(key, None)
    elif action == "add-schema":
        _add_schema(change, document)
    elif action == "add-view-version":
        _add_version(change, document)
    elif action == "set-current-view-version":
        _set_current_version(change, document)
    elif action in ("assign-uuid", "upgrade-format-version", "set-location"):
        raise BadRequestError(f"view update {action} is not supported")
    else:
        raise BadRequestError("unknown view update action")


def _add_schema(change: dict[str, Any], document: dict[str, Any]) -> None:
    schema = change.get("schema")
    if not isinstance(schema, dict):
        raise BadRequestError("add-schema needs a schema object")
    next_id = max((s.get("schema-id", 0) for s in document["schemas"]), default=-1) + 1
    document["schemas"].append({**schema, "schema-id": next_id})
    document["_last_added_schema"] = next_id  # resolved by add-view-version's schema-id -1, then removed


def _add_version(change: dict[str, Any], document: dict[str, Any]) -> None:
    version = change.get("view-version")
    if not isinstance(version, dict):
        raise BadRequestError("add-view-version needs a view-version object")
    schema_id = version.get("schema-id")
    if schema_id == -1:
        schema_id = document.get("_last_added_schema", document["versions"][-1]["schema-id"])
    next_id = max(v["version-id"] for v in document["versions"]) + 1
    document["versions"].append({**version, "version-id": next_id, "schema-id": schema_id})
    document["_last_added_version"] = next_id


def _set_current_version(change: dict[str, Any], document: dict[str, Any]) -> None:
    version_id = change.get("view-version-id")
    if version_id == -1:
        version_id = document.pop("_last_added_version", None)
    if not any(v["version-id"] == version_id for v in document["versions"]):
        raise BadRequestError("set-current-view-version names an unknown version")
    document["current-version-id"] = version_id
    document["version-log"].append({"timestamp-ms": _now_ms(), "version-id": version_id})
    document.pop("_last_added_schema", None)
