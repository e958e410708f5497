"""The seam between the catalog client and the rest of the engine.

The session and planner only ever see ``LoadedTable`` objects handed out by a ``TableProvider``; the REST
client (``sqe.catalog.rest``) is the production provider. Anything holding a ``LoadedTable`` can read the table's
files only through ``LoadedTable.io`` (SQE's own per-file credential-scoped FileIO), never through pyiceberg's.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table

    from sqe.credentials import CatalogCredentials


class CacheOutcome(enum.Enum):
    HIT = "hit"  # served from the cache, no request
    REVALIDATED = "304"  # If-None-Match answered 304
    RELOADED = "reload"  # full load (first load, changed table, or credentials past their usable point)


@dataclass(frozen=True)
class TableIdent:
    warehouse: str
    namespace: tuple[str, ...]
    name: str

    def __str__(self) -> str:
        return ".".join((self.warehouse, *self.namespace, self.name))


@dataclass
class LoadedTable:
    ident: TableIdent
    table: Table  # pyiceberg Table whose .io is SQE's scoped FileIO (never pyiceberg's own)
    io: FileIO  # same object as table.io; routes every path to its own credential set
    credential_source: str  # "vended" | "static" | "none"
    usable_until: float | None  # epoch seconds after which the credentials must not be used (None: no expiry)
    expires_at: float | None  # earliest credential expiry, epoch seconds
    cache_outcome: CacheOutcome
    raw: Mapping[str, Any] = field(repr=False)  # the raw load-table JSON (read-restrictions live here)
    can_write: bool = False

    def is_usable(self, now: float) -> bool:
        return self.usable_until is None or now < self.usable_until


@dataclass(frozen=True)
class ViewDefinition:
    """A catalog view as SQE needs it: its SQL per dialect, and the namespace its one-part names resolve in."""

    ident: TableIdent
    representations: tuple[tuple[str, str], ...]  # (dialect, sql) of the current version, in catalog order
    default_namespace: tuple[str, ...]
    version_id: int
    default_catalog: str | None = None  # unset: the warehouse the view is stored in (Iceberg view spec)


class ScanPlanningClient(Protocol):
    """The REST spec's server-side scan planning calls for one warehouse, as this user; raw JSON answers.

    Every method raises ``sqe.errors.SQEError`` subclasses (the catalog's ErrorModel translated)."""

    def submit_plan(self, ident: TableIdent, request: Mapping[str, Any]) -> Mapping[str, Any]:
        """POST ``.../tables/{t}/plan``: a completed, submitted, cancelled or failed plan."""
        ...

    def fetch_plan(self, ident: TableIdent, plan_id: str) -> Mapping[str, Any]:
        """GET ``.../tables/{t}/plan/{plan-id}``: the plan's status (polled while ``submitted``)."""
        ...

    def fetch_plan_tasks(self, ident: TableIdent, plan_task: str) -> Mapping[str, Any]:
        """POST ``.../tables/{t}/tasks``: the file scan tasks of one plan task."""
        ...

    def cancel_plan(self, ident: TableIdent, plan_id: str) -> None:
        """DELETE ``.../tables/{t}/plan/{plan-id}`` (best effort: a plan SQE gives up on)."""
        ...

    def file_io_for_plan(self, loaded: LoadedTable, storage_credentials: list[Any]) -> FileIO:
        """SQE's scoped FileIO for a plan that carried ``storage-credentials`` (the load's ``config`` below)."""
        ...


class TableProvider(Protocol):
    """What the session needs from a catalog: load, create, drop, list and forget tables and namespaces.

    Everything answers as the session's user: a list holds only what the catalog lets this user see.

    Every method raises ``sqe.errors.SQEError`` subclasses (``NoSuchTableError`` for an unknown warehouse or
    table), never a client library's own exceptions.
    """

    def default_warehouse(self) -> str:
        """The warehouse a two-part name (``namespace.table``) resolves in."""
        ...

    def load_table(self, ident: TableIdent, *, bypass_cache: bool = False) -> LoadedTable:
        """The table with usable credentials; ``bypass_cache`` forces a full load (no revalidation)."""
        ...

    def create_table(self, ident: TableIdent, schema: pa.Schema) -> LoadedTable:
        """Create the table (its namespace must exist) and return it loaded with write credentials.

        Raises CatalogError (status 409) if it exists. The returned table's FileIO is SQE's scoped FileIO.
        """
        ...

    def list_tables(self, warehouse: str, namespace: tuple[str, ...] | None) -> list[TableIdent]:
        """The tables of ``namespace`` in ``warehouse``; of every top-level namespace when None."""
        ...

    def drop_table(self, ident: TableIdent) -> None:
        """Drop the table from the catalog (its files stay; purging is the catalog's business)."""
        ...

    def list_namespaces(self, warehouse: str, parent: tuple[str, ...] | None = None) -> list[tuple[str, ...]]:
        """The namespaces of ``warehouse`` directly below ``parent`` (top-level when None) this user may see."""
        ...

    def create_namespace(self, warehouse: str, namespace: tuple[str, ...]) -> None:
        """Create the namespace; CatalogError with status 409 when it exists."""
        ...

    def drop_namespace(self, warehouse: str, namespace: tuple[str, ...]) -> None:
        """Drop the (empty) namespace; NoSuchNamespaceError when it does not exist."""
        ...

    def invalidate(self, ident: TableIdent) -> None:
        """Forget anything cached for ``ident`` (called after a write): the next load is a full load."""
        ...

    # -- views ---------------------------------------------------------------------------------------------
    def load_view(self, ident: TableIdent) -> ViewDefinition:
        """The view's current version; ``NoSuchViewError`` when there is no such view (or warehouse)."""
        ...

    def create_view(
        self, ident: TableIdent, schema: pa.Schema, sql: str, dialect: str, *, replace: bool = False
    ) -> None:
        """Create the view (CatalogError 409 if the name is taken), or with ``replace`` add a new current version
        to an existing one (creating it when missing)."""
        ...

    def drop_view(self, ident: TableIdent) -> None:
        """Drop the view; ``NoSuchViewError`` when there is none."""
        ...

    def list_views(self, warehouse: str, namespace: tuple[str, ...] | None) -> list[TableIdent]:
        """The views of ``namespace`` (of every top-level namespace when None) this user may see."""
        ...

    # -- server-side scan planning -------------------------------------------------------------------------
    def scan_planning(self, warehouse: str) -> ScanPlanningClient | None:
        """The planning calls when the warehouse's catalog advertises them in ``/v1/config``, else None."""
        ...

    # -- credential refresh ------------------------------------------------------------------------------
    def load_table_credentials(self, ident: TableIdent) -> CatalogCredentials | None:
        """The table's ``/credentials`` as this user when its catalog advertises the endpoint, else None (the
        coordinator then reloads the table to refresh its workers' keys)."""
        ...
