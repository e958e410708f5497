"""A ``TableProvider`` that builds the REST client on its first catalog call.

``sqe.catalog.rest`` pulls in pyiceberg's ``RestCatalog`` (and with it pyiceberg's table, manifest and
serializer modules), requests and tenacity: a third of a second before the first statement runs. A statement
that names no Iceberg table (``SELECT 1``, a file table function, ``--help``) never needs any of it, so the
embedded session starts with this provider and imports the client only when a table, namespace or view is
actually asked for. Every call is delegated unchanged: caching, credentials and errors are the real provider's.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from sqe._unpicklable import Unpicklable

if TYPE_CHECKING:
    import pyarrow as pa

    from sqe.catalog.base import LoadedTable, ScanPlanningClient, TableIdent, ViewDefinition
    from sqe.catalog.rest import RestTableProvider, SQERestCatalog
    from sqe.config import SQEConfig
    from sqe.credentials import CatalogCredentials


class LazyRestTableProvider(Unpicklable):
    """``RestTableProvider(config)``, constructed (and imported) on first use."""

    _pickle_refusal = "table providers cannot be pickled (their config holds the catalog secret)"

    def __init__(self, config: SQEConfig) -> None:
        self._config = config
        self._provider: RestTableProvider | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "built" if self._provider is not None else "not yet built"
        return f"LazyRestTableProvider(warehouse={self._config.catalog.warehouse!r}, {state})"

    @property
    def built(self) -> bool:
        """Whether the REST client exists yet (tests: a statement without tables never builds it)."""
        return self._provider is not None

    def real(self, warehouse: str | None = None) -> RestTableProvider:
        """The REST provider, built on the first call. ``warehouse``: the one that first call is for; its first
        token is requested before the client is imported, on a thread, so the two overlap
        (``sqe.catalog._early_token``). None, or a warehouse not configured: no early request."""
        with self._lock:
            if self._provider is None:
                self._provider = self._build(warehouse)
            return self._provider

    def _build(self, warehouse: str | None) -> RestTableProvider:
        from sqe.catalog._early_token import EarlyToken

        # A warehouse refused its connection (a sibling on another catalog that would inherit [catalog]'s
        # credentials) fails the client before any token request, the primary's own included.
        self._config.catalog.connections()
        known = warehouse is not None and warehouse in self._config.catalog.warehouse_names
        early = EarlyToken.start(self._config, warehouse) if known else None
        try:
            from sqe.catalog.rest import RestTableProvider

            return RestTableProvider(self._config, early=early)
        except BaseException:  # an interrupted import: nothing is left open behind it
            if early is not None:
                early.session.close()
            raise

    def catalog(self, warehouse: str) -> SQERestCatalog:
        """The warehouse's REST catalog client (diagnostics and tests, like ``RestTableProvider.catalog``)."""
        return self.real(warehouse).catalog(warehouse)

    def close(self) -> None:
        with self._lock:
            provider, self._provider = self._provider, None
        if provider is not None:
            provider.close()

    # -- TableProvider ----------------------------------------------------------------------------------
    def default_warehouse(self) -> str:
        return self._config.catalog.warehouse

    def load_table(self, ident: TableIdent, *, bypass_cache: bool = False) -> LoadedTable:
        return self.real(ident.warehouse).load_table(ident, bypass_cache=bypass_cache)

    def create_table(self, ident: TableIdent, schema: pa.Schema) -> LoadedTable:
        return self.real(ident.warehouse).create_table(ident, schema)

    def list_tables(self, warehouse: str, namespace: tuple[str, ...] | None) -> list[TableIdent]:
        return self.real(warehouse).list_tables(warehouse, namespace)

    def drop_table(self, ident: TableIdent) -> None:
        self.real(ident.warehouse).drop_table(ident)

    def list_namespaces(self, warehouse: str, parent: tuple[str, ...] | None = None) -> list[tuple[str, ...]]:
        return self.real(warehouse).list_namespaces(warehouse, parent)

    def create_namespace(self, warehouse: str, namespace: tuple[str, ...]) -> None:
        self.real(warehouse).create_namespace(warehouse, namespace)

    def drop_namespace(self, warehouse: str, namespace: tuple[str, ...]) -> None:
        self.real(warehouse).drop_namespace(warehouse, namespace)

    def invalidate(self, ident: TableIdent) -> None:
        if self._provider is not None:  # nothing cached before the first load
            self._provider.invalidate(ident)

    def load_view(self, ident: TableIdent) -> ViewDefinition:
        return self.real(ident.warehouse).load_view(ident)

    def create_view(
        self, ident: TableIdent, schema: pa.Schema, sql: str, dialect: str, *, replace: bool = False
    ) -> None:
        self.real(ident.warehouse).create_view(ident, schema, sql, dialect, replace=replace)

    def drop_view(self, ident: TableIdent) -> None:
        self.real(ident.warehouse).drop_view(ident)

    def list_views(self, warehouse: str, namespace: tuple[str, ...] | None) -> list[TableIdent]:
        return self.real(warehouse).list_views(warehouse, namespace)

    def scan_planning(self, warehouse: str) -> ScanPlanningClient | None:
        return self.real(warehouse).scan_planning(warehouse)

    def load_table_credentials(self, ident: TableIdent) -> CatalogCredentials | None:
        return self.real(ident.warehouse).load_table_credentials(ident)
