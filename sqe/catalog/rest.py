"""The engine's REST catalog client: one per user and warehouse, plus the per-principal metadata cache.

pyiceberg's ``RestCatalog`` does the protocol work (commits, namespaces, create); SQE replaces the pieces that
matter for security and robustness:

- the HTTP session: SQE's retrying transport with timeouts, and an OAuth token refreshed before it expires;
- every table's FileIO: built by ``sqe.credentials`` from the response, never by pyiceberg (whose FileIO would let
  table properties choose the endpoint or a FileIO class);
- load-table: SQE's own request keeps the raw JSON (pyiceberg drops ``read-restrictions``) and sends
  ``If-None-Match`` for cached entries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import pyarrow as pa
import requests
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import Capability, RestCatalog, TableResponse
from pyiceberg.exceptions import RESTError
from pyiceberg.io import FileIO
from pyiceberg.schema import assign_fresh_schema_ids
from pyiceberg.table import StagedTable, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.view.metadata import ViewMetadata

from sqe import vocabulary
from sqe._config_loader import short
from sqe._text import first_line, redact_credentials
from sqe._unpicklable import Unpicklable
from sqe.catalog._delegation import catalog_auth
from sqe.catalog._early_token import EarlyToken
from sqe.catalog._transport import RetryPolicy, make_session
from sqe.catalog.base import CacheOutcome, LoadedTable, ScanPlanningClient, TableIdent, ViewDefinition
from sqe.catalog.errors import (
    PYICEBERG_CATALOG_ERRORS,
    error_for_status,
    translate_error,
    without_bearer_token_sent,
)
from sqe.config import CatalogConnection, SQEConfig, origin_of, same_origin
from sqe.credentials import CatalogCredentials, ScopedFileIO, StoragePolicy, parse_catalog_credentials
from sqe.errors import (
    CatalogError,
    CatalogProtocolError,
    CatalogUnavailableError,
    NoSuchTableError,
    NoSuchViewError,
    RestrictionError,
    SQEError,
)
from sqe.restrictions import strict_json_loads

log = logging.getLogger("sqe.catalog")
_T = TypeVar("_T")
CREATE_ID = "sqe.create-id"  # a table property set at create: tells a create that landed from another's table
_TableT = TypeVar("_TableT", bound=Table)

__all__ = [
    "PYICEBERG_CATALOG_ERRORS",
    "RestTableProvider",
    "SQERestCatalog",
    "error_for_status",
    "principal_key",
    "translate_error",
]


def principal_key(connection: CatalogConnection) -> str:
    """Identifies the principal (and the reader acting for it) for cache keys without revealing a secret.

    A principal known only by its token is keyed by the token's whole SHA-256: a short digest could be shared by
    two tokens, which would then share cached tables and credential leases. Logs show it through
    :func:`sqe._text.short_identity`."""
    if connection.client_id:
        user = f"client:{connection.client_id}"
    else:
        user = "token:" + hashlib.sha256((connection.token_value() or "").encode()).hexdigest()
    return f"{user}+reader:{connection.reader_client_id}" if connection.delegates else user


class SQERestCatalog(Unpicklable, RestCatalog):
    """pyiceberg's RestCatalog with SQE's transport, token handling and FileIO."""

    _pickle_refusal = "catalog clients cannot be pickled"

    def __init__(
        self, name: str, endpoint: CatalogConnection, config: SQEConfig, *, early: EarlyToken | None = None
    ) -> None:
        """``early``: this endpoint's token session and auth, its first token already requested (see
        ``sqe.catalog._early_token``); otherwise both are made here."""
        self._sqe_config = config
        self._endpoint = endpoint
        policy = RetryPolicy.of(config)
        self._retry_policy = policy
        self._catalog_session: requests.Session | None = None  # made by pyiceberg's first _create_session call
        if early is not None:
            self._token_session, self._bearer = early.session, early.auth
        else:
            self._token_session = make_session(policy)
            self._bearer = catalog_auth(self._token_session, endpoint)
        properties: dict[str, str] = {"uri": endpoint.uri, "warehouse": endpoint.warehouse}
        properties.update(self._header_properties(config))
        try:
            self._connect(name, properties, early)
        except BaseException:  # no client: its sessions (and their pooled connections) go now
            self._token_session.close()
            if self._catalog_session is not None:
                self._catalog_session.close()
            raise

    def _connect(self, name: str, properties: dict[str, str], early: EarlyToken | None) -> None:
        """pyiceberg's initialisation (``/v1/config``, with the first token), its errors translated."""
        uri = self._endpoint.uri
        try:
            if early is not None:
                early.wait()  # its refusal or transport error, raised and translated as if fetched here
            super().__init__(name, **properties)
        except RESTError as exc:
            raise translate_error(exc, f"catalog {uri}") from None
        except requests.RequestException as exc:
            raise CatalogUnavailableError(f"cannot reach catalog {uri}: {type(exc).__name__}") from None

    def __repr__(self) -> str:
        uri = redact_credentials(repr(self._endpoint.uri))  # a password or a token parameter is not shown
        return f"SQERestCatalog(uri={uri}, warehouse={self._endpoint.warehouse!r})"

    def close(self) -> None:
        """Close both HTTP connection pools (catalog calls and token requests); a long-lived server needs this."""
        self._session.close()
        self._token_session.close()

    @staticmethod
    def _header_properties(config: SQEConfig) -> dict[str, str]:
        # Set as header.* properties so every request of this catalog object carries them.
        headers: dict[str, str] = {
            f"header.{vocabulary.ACCESS_DELEGATION_HEADER}": config.catalog.effective_access_delegation
        }
        if config.catalog.client_capabilities:
            headers[f"header.{vocabulary.CAPABILITIES_HEADER}"] = config.catalog.client_capabilities
        return headers

    # -- pyiceberg hooks ---------------------------------------------------------------------------------
    def _fetch_config(self) -> None:
        """pyiceberg's ``/v1/config``, whose ``overrides`` may move ``uri``: every later call, with this user's
        bearer token, goes there. Within the configured origin that is the catalog's own choice (another path);
        another origin is refused, as a redirect there would lose ``Authorization``: whoever answers /v1/config
        (a proxy in front of the catalog too) would otherwise be sent the token. The token endpoint never moves
        (``oauth2-server-uri`` is not read: see ``catalog_auth``)."""
        super()._fetch_config()
        if not same_origin(self.uri, self._endpoint.uri):
            moved_to, configured = short(origin_of(self.uri)), short(origin_of(self._endpoint.uri))
            raise CatalogProtocolError(
                f"catalog {configured} answered /v1/config with overrides.uri on another host or port ({moved_to}); "
                "SQE sends no token there. If that host is the catalog, configure its uri instead"
            )

    def _create_session(self) -> requests.Session:
        """One session for pyiceberg's ``/v1/config`` request and every later call. pyiceberg asks for one to
        fetch the config in a ``with`` block that closes it, then for another: the connection the config opened
        was gone before the first table load, which opened a new one (a TCP handshake on each new client's
        first query). A kept session outlives that block; :meth:`close` closes it. Its headers are set again on
        each call: the second comes after the config's defaults and overrides joined the properties, and their
        ``header.*`` entries become headers, as on pyiceberg's own second session."""
        session = self._catalog_session or make_session(self._retry_policy, kept=True)
        self._config_headers(session)
        if self._sqe_config.catalog.effective_access_delegation == "none":
            # pyiceberg defaults the header to vended-credentials; "none" means: do not ask at all.
            session.headers.pop(vocabulary.ACCESS_DELEGATION_HEADER, None)
        session.auth = self._bearer
        self._auth_manager = None
        self._catalog_session = session
        return session

    def _refresh_token(self) -> None:
        self._bearer.invalidate()

    def _load_file_io(self, properties: Mapping[str, str] = {}, location: str | None = None) -> FileIO:
        raise CatalogError("internal: pyiceberg FileIO must never be built for catalog tables")

    @staticmethod
    def _delete_old_metadata(io: FileIO, base: TableMetadata, metadata: TableMetadata) -> None:
        """Never: the files a table's ``metadata-log`` names are whatever its writers put there (see
        ``sqe.execution.write_target.WriteTable._do_commit``); old metadata is the catalog's to remove."""

    def _response_to_table(self, identifier_tuple: tuple[str, ...], table_response: TableResponse) -> Table:
        io = self.file_io_for(table_response.config, table_response.model_dump(by_alias=True), time.time())
        return self.table_from_response(identifier_tuple, table_response, io)

    def table_from_response(self, identifier: tuple[str, ...], response: TableResponse, io: ScopedFileIO) -> Table:
        """A pyiceberg Table reading through ``io``, SQE's scoped FileIO built from this response's credentials."""
        return self._table_of(Table, identifier, response, io, config=response.config)

    def _response_to_staged_table(
        self, identifier_tuple: tuple[str, ...], table_response: TableResponse
    ) -> StagedTable:
        io = self.file_io_for(table_response.config, table_response.model_dump(by_alias=True), time.time())
        return self._table_of(StagedTable, identifier_tuple, table_response, io)

    def _table_of(
        self, kind: type[_TableT], identifier: tuple[str, ...], response: TableResponse, io: ScopedFileIO, **extra: Any
    ) -> _TableT:
        return kind(
            identifier=identifier,
            metadata_location=response.metadata_location,  # type: ignore[arg-type]
            metadata=response.metadata,
            io=io,
            catalog=self,
            **extra,
        )

    # -- SQE additions -----------------------------------------------------------------------------------
    def file_io_for(
        self,
        response_config: Mapping[str, str],
        raw: Mapping[str, Any],
        received_at: float,
        refresher: Callable[[], CatalogCredentials] | None = None,
    ) -> ScopedFileIO:
        metadata = raw.get("metadata")
        location = metadata.get("location") if isinstance(metadata, Mapping) else None
        response = {**raw, "config": dict(response_config or {})}
        policy = StoragePolicy.from_config(self._sqe_config)
        return ScopedFileIO.from_response(
            response, policy, received_at=received_at, location=location, refresher=refresher
        )

    def credentials_refresher(self, namespace: Sequence[str], name: str) -> Callable[[], CatalogCredentials]:
        """Fetches the table's current credentials as this user: its ``/credentials`` when advertised, else a
        full load (no ``If-None-Match``: a 304 carries no keys). Used when a long scan reaches a usable point."""

        def refresh() -> CatalogCredentials:
            found = self.load_table_credentials(namespace, name)
            if found is not None:
                return found
            _status, raw, _etag = self.get_table_raw(namespace, name, None)
            return parse_catalog_credentials(raw or {})

        return refresh

    def load_table_credentials(self, namespace: Sequence[str], name: str) -> CatalogCredentials | None:
        """GET the table's ``/credentials`` as this user, parsed; None when the catalog does not advertise it."""
        if str(Capability.V1_LOAD_CREDENTIALS) not in {str(e) for e in self._supported_endpoints}:
            return None
        what = ".".join((self.name, *namespace, name))
        response = self._get(self.table_url(namespace, name) + "/credentials", f"load credentials of {what}")
        if response.status_code != 200:
            raise error_for_status(response, f"credentials of {what}")
        body = _json_object(response)
        if body is None:
            raise CatalogUnavailableError(f"the catalog's credentials answer for {what} is not a JSON object")
        return parse_catalog_credentials(body, "credentials response")

    def _get(self, url: str, action: str, headers: Mapping[str, str] | None = None) -> requests.Response:
        return self._send("GET", url, action, headers=headers)

    def _send(
        self,
        method: str,
        url: str,
        action: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> requests.Response:
        """One call as this user. A 401 with client credentials (the catalog no longer takes the token, e.g. after
        a signing-key change; it handled nothing) is sent once more with a new token; connection failures are
        typed."""
        payload = dict(body) if body is not None else None
        try:
            response = self._session.request(method, url, headers=dict(headers or {}), json=payload)
            if response.status_code == 401 and self._bearer.uses_client_credentials:
                self._bearer.invalidate()
                response = self._session.request(method, url, headers=dict(headers or {}), json=payload)
        except requests.RequestException as exc:
            raise CatalogUnavailableError(f"cannot {action}: {type(exc).__name__}") from None
        return response

    def table_url(self, namespace: Sequence[str], name: str) -> str:
        ns = self._encode_namespace_path(tuple(namespace))
        return self.url(
            "namespaces/{namespace}/tables/{table}", prefixed=True, namespace=ns, table=quote(name, safe="")
        )

    def get_table_raw(
        self, namespace: Sequence[str], name: str, etag: str | None
    ) -> tuple[int, dict[str, Any] | None, str | None]:
        """GET load-table; returns (status, raw JSON or None on 304, ETag)."""
        headers = {"If-None-Match": etag} if etag else {}
        what = ".".join((*namespace, name))
        response = self._get(self.table_url(namespace, name), f"load table {what}", headers)
        if response.status_code == 304 and etag:
            return 304, None, etag
        if response.status_code != 200:
            raise error_for_status(response, f"table {what}")
        try:
            # Strict: a duplicated key (e.g. two read-restrictions) must not silently collapse into one.
            raw = strict_json_loads(response.content)
        except RestrictionError:
            raise CatalogProtocolError(
                f"catalog returned malformed JSON for table {what} (invalid JSON or duplicate keys)"
            ) from None
        if not isinstance(raw, dict) or "metadata" not in raw:
            raise CatalogProtocolError(f"catalog response for table {what} has no metadata")
        return 200, raw, response.headers.get("ETag")

    # -- raw JSON calls (views, scan planning) ----------------------------------------------------------------
    def advertises(self, *endpoints: Any) -> bool:
        """Whether ``/v1/config`` listed every one of ``endpoints`` (pyiceberg ``Endpoint`` values)."""
        supported = {str(e) for e in self._supported_endpoints}
        return all(str(e) in supported for e in endpoints)

    def request_json(
        self, method: str, path: str, what: str, body: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """One prefixed REST call as this user; the JSON object answered (None for 204), errors typed."""
        url = self.url(path, prefixed=True)
        response = self._send(method, url, f"reach the catalog for {what}", body=body)
        if response.status_code == 204:
            return None
        if response.status_code != 200:
            raise error_for_status(response, what)
        answer = _json_object(response)
        if answer is None:
            raise CatalogProtocolError(f"the catalog's answer for {what} is not a JSON object")
        return without_bearer_token_sent(answer, response)  # a failed plan's ErrorModel is shown as an error

    def namespace_path(self, namespace: Sequence[str]) -> str:
        return "namespaces/" + self._encode_namespace_path(tuple(namespace))

    def view_path(self, namespace: Sequence[str], name: str) -> str:
        return f"{self.namespace_path(namespace)}/views/{quote(name, safe='')}"

    def table_path(self, namespace: Sequence[str], name: str) -> str:
        return f"{self.namespace_path(namespace)}/tables/{quote(name, safe='')}"


def _may_have_landed(error: SQEError) -> bool:
    """A create failure that does not say the catalog refused it: no answer, a 5xx or 429, or a 409 (which may
    answer a resend of a create that landed)."""
    status = error.status if isinstance(error, CatalogError) else None
    return status is None or status in (409, 429) or status >= 500


def _json_object(response: requests.Response) -> dict[str, Any] | None:
    """The response body when it is a JSON object; None for anything else (the caller names the failure)."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _view_schema_json(schema: pa.Schema) -> dict[str, Any]:
    """An Arrow schema as an Iceberg schema JSON object with fresh field ids (pyiceberg's own conversion)."""
    fresh = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema))
    return fresh.model_dump(by_alias=True, exclude_none=True)


def _view_version_json(sql: str, dialect: str, ident: TableIdent, schema_id: int) -> dict[str, Any]:
    """A ViewVersion of the REST spec with one SQL representation (``schema_id`` -1: the schema just added).
    SQE resolves a view's names in the view's own warehouse and namespace: ``default-namespace`` is the view's,
    and ``default-catalog`` is left unset, which means the view's catalog (spec) in every engine, whatever name
    that engine gives the catalog (SQE's warehouse name may not be one)."""
    return {
        "version-id": 1,
        "schema-id": schema_id,
        "timestamp-ms": int(time.time() * 1000),
        "summary": {"engine-name": "sqe"},
        "representations": [{"type": "sql", "sql": sql, "dialect": dialect}],
        "default-namespace": list(ident.namespace),
    }


def view_definition(ident: TableIdent, raw: Mapping[str, Any]) -> ViewDefinition:
    """The current version of a load-view answer (validated by pyiceberg's view model)."""
    try:
        metadata = ViewMetadata.model_validate(raw.get("metadata"))
    except ValueError:
        raise CatalogProtocolError(f"the catalog's view metadata for {ident} is not valid") from None
    current = next((v for v in metadata.versions if v.version_id == metadata.current_version_id), None)
    if current is None:
        raise CatalogProtocolError(f"view {ident} has no current version {metadata.current_version_id}")
    representations = tuple((r.root.dialect, r.root.sql) for r in current.representations if r.root.type == "sql")
    return ViewDefinition(
        ident, representations, tuple(current.default_namespace), current.version_id, current.default_catalog or None
    )


class _RestScanPlanning:
    """``ScanPlanningClient`` over one warehouse's catalog client."""

    def __init__(self, catalog: SQERestCatalog) -> None:
        self._catalog = catalog

    def _call(self, method: str, ident: TableIdent, tail: str, body: Mapping[str, Any] | None) -> dict[str, Any]:
        path = self._catalog.table_path(ident.namespace, ident.name) + tail
        answer = self._catalog.request_json(method, path, f"scan planning of {ident}", body)
        return answer or {}

    def submit_plan(self, ident: TableIdent, request: Mapping[str, Any]) -> Mapping[str, Any]:
        return self._call("POST", ident, "/plan", request)

    def fetch_plan(self, ident: TableIdent, plan_id: str) -> Mapping[str, Any]:
        return self._call("GET", ident, f"/plan/{quote(plan_id, safe='')}", None)

    def fetch_plan_tasks(self, ident: TableIdent, plan_task: str) -> Mapping[str, Any]:
        return self._call("POST", ident, "/tasks", {"plan-task": plan_task})

    def cancel_plan(self, ident: TableIdent, plan_id: str) -> None:
        self._call("DELETE", ident, f"/plan/{quote(plan_id, safe='')}", None)

    def file_io_for_plan(self, loaded: LoadedTable, storage_credentials: list[Any]) -> ScopedFileIO:
        raw = {"metadata": loaded.raw.get("metadata"), vocabulary.STORAGE_CREDENTIALS: storage_credentials}
        config = loaded.raw.get("config")
        # A long scan of the plan's files refreshes like one of the table's own: the same table, as the same user.
        refresher = self._catalog.credentials_refresher(loaded.ident.namespace, loaded.ident.name)
        return self._catalog.file_io_for(config if isinstance(config, Mapping) else {}, raw, time.time(), refresher)


# (principal, warehouse, namespace levels, table name)
_CacheKey = tuple[str, str, tuple[str, ...], str]


@dataclass
class _CacheEntry:
    etag: str | None
    loaded: LoadedTable
    validated_at: float  # time.monotonic() when the request that last confirmed this entry (200 or 304) was sent


class RestTableProvider:
    """Loads tables for one user across the configured warehouses, with an ETag-revalidated cache.

    A cache entry is keyed by (principal, warehouse, table) and is never served — fresh, stale or revalidated —
    past its credentials' usable point: then the next lookup does a full load without ``If-None-Match``. With
    ``[catalog] metadata_revalidate_seconds`` > 0, an entry confirmed less than that long ago is served with no
    request at all, unless its credentials reach their usable point within that interval.
    """

    def __init__(self, config: SQEConfig, *, early: EarlyToken | None = None) -> None:
        """``early``: a warehouse's first token, already requested (``LazyRestTableProvider``); used once."""
        self._config = config
        self._endpoints = config.catalog.connections()
        self._early = early
        self._catalogs: dict[str, SQERestCatalog] = {}
        self._cache: dict[_CacheKey, _CacheEntry] = {}
        self._lock = threading.RLock()

    def default_warehouse(self) -> str:
        return self._config.catalog.warehouse

    def catalog(self, warehouse: str) -> SQERestCatalog:
        with self._lock:
            if warehouse not in self._catalogs:
                endpoint = self._endpoints.get(warehouse)
                if endpoint is None:
                    raise NoSuchTableError(
                        f"unknown warehouse {warehouse!r}; configured: {', '.join(sorted(self._endpoints))}"
                    )
                early = None
                if self._early is not None and self._early.warehouse == warehouse:
                    early, self._early = self._early, None
                self._catalogs[warehouse] = SQERestCatalog(warehouse, endpoint, self._config, early=early)
            return self._catalogs[warehouse]

    def close(self) -> None:
        """Close the catalogs' HTTP connections and drop the cache (the engine session using it ended)."""
        with self._lock:
            catalogs, self._catalogs = list(self._catalogs.values()), {}
            unused, self._early = self._early, None
            self._cache.clear()
        for catalog in catalogs:
            catalog.close()
        if unused is not None:  # its warehouse was never asked for
            unused.session.close()

    def load_table(self, ident: TableIdent, *, bypass_cache: bool = False) -> LoadedTable:
        key = self._cache_key(ident)
        catalog = self.catalog(ident.warehouse)
        now = time.time()
        with self._lock:
            entry = None if bypass_cache or not self._config.catalog.metadata_cache else self._cache.get(key)
        if entry is not None and not entry.loaded.is_usable(now):
            entry = None  # a 304 would hand back dead keys: reload in full
        if entry is not None and self._provably_fresh(entry, now):
            return dataclasses.replace(entry.loaded, cache_outcome=CacheOutcome.HIT)
        sent_at = time.monotonic()
        status, raw, etag = catalog.get_table_raw(ident.namespace, ident.name, entry.etag if entry else None)
        if status == 304 and entry is not None:
            with self._lock:
                entry.validated_at = sent_at  # (an entry invalidated meanwhile is no longer in the cache)
            return dataclasses.replace(entry.loaded, cache_outcome=CacheOutcome.REVALIDATED)
        assert raw is not None
        loaded = self._build_loaded(catalog, ident, raw, now)
        if self._config.catalog.metadata_cache and etag:
            with self._lock:
                self._cache[key] = _CacheEntry(etag, loaded, validated_at=sent_at)
        return loaded

    def _provably_fresh(self, entry: _CacheEntry, now: float) -> bool:
        """Confirmed by the catalog within the revalidation interval, and its credentials stay usable for a whole
        interval more (so a skipped round trip never brings a credential refresh closer)."""
        interval = self._config.catalog.metadata_revalidate_seconds
        if interval <= 0:
            return False
        with self._lock:
            confirmed_ago = time.monotonic() - entry.validated_at
        usable_until = entry.loaded.usable_until
        return confirmed_ago < interval and (usable_until is None or now + interval < usable_until)

    def invalidate(self, ident: TableIdent) -> None:
        """Forget the cached entry: after a write, the next load is a full load, not a revalidation."""
        key = self._cache_key(ident)
        with self._lock:
            self._cache.pop(key, None)

    def forget_cached_tables(self) -> None:
        """Forget every cached entry (another engine session of the same client may have written to any)."""
        with self._lock:
            self._cache.clear()

    def list_tables(self, warehouse: str, namespace: tuple[str, ...] | None) -> list[TableIdent]:
        """The tables of ``namespace`` in ``warehouse``, or of every top-level namespace when None."""
        catalog = self.catalog(warehouse)
        what = ".".join((warehouse, *(namespace or ())))
        try:
            namespaces = [namespace] if namespace else catalog.list_namespaces()
            identifiers = [identifier for ns in namespaces for identifier in catalog.list_tables(ns)]
        except PYICEBERG_CATALOG_ERRORS as exc:
            raise translate_error(exc, f"listing tables of {what}") from None
        except requests.RequestException as exc:
            raise CatalogUnavailableError(f"cannot list tables of {what}: {type(exc).__name__}") from None
        return [TableIdent(warehouse, tuple(identifier[:-1]), identifier[-1]) for identifier in identifiers]

    def _cache_key(self, ident: TableIdent) -> _CacheKey:
        """The levels and the name as they are, not joined: a level or a name may hold a dot, so ``"a.b".c`` and
        ``a."b.c"`` joined alike and one table's entry (metadata, credentials, restrictions) answered the other."""
        endpoint = self._endpoints.get(ident.warehouse)
        if endpoint is None:
            raise NoSuchTableError(f"{ident}: unknown warehouse {ident.warehouse!r}")
        return principal_key(endpoint), ident.warehouse, tuple(ident.namespace), ident.name

    def _build_loaded(self, catalog: SQERestCatalog, ident: TableIdent, raw: dict[str, Any], now: float) -> LoadedTable:
        try:
            response = TableResponse.model_validate(raw)
        except ValueError as exc:
            raise CatalogProtocolError(
                f"catalog response for {ident} is not a valid load-table result: {first_line(exc)}"
            ) from None
        refresher = catalog.credentials_refresher(ident.namespace, ident.name)
        io = catalog.file_io_for(response.config, raw, now, refresher)
        table = catalog.table_from_response((*ident.namespace, ident.name), response, io)
        return LoadedTable(
            ident=ident,
            table=table,
            io=io,
            credential_source=io.source,
            usable_until=io.usable_until,
            expires_at=io.expires_at,
            cache_outcome=CacheOutcome.RELOADED,
            raw=raw,
        )

    def create_table(self, ident: TableIdent, schema: pa.Schema) -> LoadedTable:
        """Create through the catalog, then load it afresh (vended write credentials, raw JSON kept).

        The table carries a fresh ``sqe.create-id``: when the create fails without a clear answer (no answer, a
        5xx, or a 409 to the transport's resend of a create that landed), a table of that name with this id is
        the one this call created, and is returned as created; one without it is someone else's (the error
        stands)."""
        catalog = self.catalog(ident.warehouse)
        create_id = uuid.uuid4().hex
        try:
            catalog.create_table((*ident.namespace, ident.name), schema=schema, properties={CREATE_ID: create_id})
        except PYICEBERG_CATALOG_ERRORS as exc:
            error: SQEError = translate_error(exc, f"table {ident}")
        except requests.RequestException as exc:
            error = CatalogUnavailableError(f"cannot create table {ident}: {type(exc).__name__}")
        else:
            return self.load_table(ident, bypass_cache=True)
        created = self._created_by(ident, create_id) if _may_have_landed(error) else None
        if created is None:
            raise error
        log.info("the create of %s landed though its answer was lost (%s)", ident, first_line(error))
        return created

    def _created_by(self, ident: TableIdent, create_id: str) -> LoadedTable | None:
        """The table ``ident`` when its ``sqe.create-id`` is ``create_id``, else None (absent, or unknowable)."""
        try:
            loaded = self.load_table(ident, bypass_cache=True)
        except SQEError:
            return None
        return loaded if loaded.table.metadata.properties.get(CREATE_ID) == create_id else None

    # -- catalog DDL (additive: namespaces and drop) ---------------------------------------------------------
    def drop_table(self, ident: TableIdent) -> None:
        catalog = self.catalog(ident.warehouse)
        self._catalog_call(f"table {ident}", lambda: catalog.drop_table((*ident.namespace, ident.name)))
        self.invalidate(ident)

    def list_namespaces(self, warehouse: str, parent: tuple[str, ...] | None = None) -> list[tuple[str, ...]]:
        catalog = self.catalog(warehouse)
        what = f"namespaces of {'.'.join((warehouse, *(parent or ())))}"
        namespaces = self._catalog_call(what, lambda: catalog.list_namespaces(parent or ()))
        return [tuple(namespace) for namespace in namespaces]

    def create_namespace(self, warehouse: str, namespace: tuple[str, ...]) -> None:
        catalog = self.catalog(warehouse)
        what = f"namespace {'.'.join((warehouse, *namespace))}"
        self._catalog_call(what, lambda: catalog.create_namespace(namespace))

    def drop_namespace(self, warehouse: str, namespace: tuple[str, ...]) -> None:
        catalog = self.catalog(warehouse)
        what = f"namespace {'.'.join((warehouse, *namespace))}"
        self._catalog_call(what, lambda: catalog.drop_namespace(namespace))

    @staticmethod
    def _catalog_call(what: str, call: Callable[[], _T]) -> _T:
        """One pyiceberg catalog call with its errors in SQE's tree."""
        try:
            return call()
        except PYICEBERG_CATALOG_ERRORS as exc:
            raise translate_error(exc, what) from None
        except requests.RequestException as exc:
            raise CatalogUnavailableError(f"cannot reach the catalog for {what}: {type(exc).__name__}") from None

    # -- views (the REST spec's view endpoints, as this user) ------------------------------------------------
    def load_view(self, ident: TableIdent) -> ViewDefinition:
        catalog = self._view_catalog(ident)
        raw = self._view_call(
            ident, lambda: catalog.request_json("GET", catalog.view_path(ident.namespace, ident.name), f"view {ident}")
        )
        return view_definition(ident, raw or {})

    def create_view(
        self, ident: TableIdent, schema: pa.Schema, sql: str, dialect: str, *, replace: bool = False
    ) -> None:
        catalog = self._view_catalog(ident)
        if replace:
            try:
                current = catalog.request_json("GET", catalog.view_path(ident.namespace, ident.name), f"view {ident}")
            except NoSuchTableError:
                current = None
            if current is not None:
                self._replace_view(catalog, ident, current, schema, sql, dialect)
                return
        body = {
            "name": ident.name,
            "schema": {**_view_schema_json(schema), "schema-id": 0},
            "view-version": _view_version_json(sql, dialect, ident, 0),
            "properties": {},
        }
        catalog.request_json("POST", f"{catalog.namespace_path(ident.namespace)}/views", f"view {ident}", body)

    @staticmethod
    def _replace_view(
        catalog: SQERestCatalog,
        ident: TableIdent,
        current: Mapping[str, Any],
        schema: pa.Schema,
        sql: str,
        dialect: str,
    ) -> None:
        """A new current version (and schema) on the existing view; a concurrent change is a CommitConflictError."""
        found = current.get("metadata")
        metadata: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        body = {
            "requirements": [{"type": "assert-view-uuid", "uuid": metadata.get("view-uuid")}],
            "updates": [
                {"action": "add-schema", "schema": _view_schema_json(schema)},
                {"action": "add-view-version", "view-version": _view_version_json(sql, dialect, ident, -1)},
                {"action": "set-current-view-version", "view-version-id": -1},
            ],
        }
        catalog.request_json("POST", catalog.view_path(ident.namespace, ident.name), f"view {ident}", body)

    def drop_view(self, ident: TableIdent) -> None:
        catalog = self._view_catalog(ident)
        self._view_call(
            ident,
            lambda: catalog.request_json("DELETE", catalog.view_path(ident.namespace, ident.name), f"view {ident}"),
        )

    def list_views(self, warehouse: str, namespace: tuple[str, ...] | None) -> list[TableIdent]:
        catalog = self.catalog(warehouse)
        if not catalog.advertises(Capability.V1_LIST_VIEWS):
            return []  # a catalog without views has none to list
        namespaces = [namespace] if namespace else self.list_namespaces(warehouse)
        found: list[TableIdent] = []
        for ns in namespaces:
            found.extend(self._views_of(catalog, warehouse, ns))
        return found

    @staticmethod
    def _views_of(catalog: SQERestCatalog, warehouse: str, namespace: tuple[str, ...]) -> list[TableIdent]:
        what = f"views of {'.'.join((warehouse, *namespace))}"
        found: list[TableIdent] = []
        token: str | None = None
        while True:
            path = f"{catalog.namespace_path(namespace)}/views" + (
                f"?pageToken={quote(token, safe='')}" if token else ""
            )
            answer = catalog.request_json("GET", path, what) or {}
            identifiers = answer.get("identifiers")
            if not isinstance(identifiers, list):
                raise CatalogProtocolError(f"the catalog's answer for {what} has no identifiers list")
            for entry in identifiers:
                if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                    found.append(TableIdent(warehouse, tuple(entry.get("namespace") or namespace), entry["name"]))
            token = answer.get("next-page-token")
            if not isinstance(token, str) or not token:
                return found

    def _view_catalog(self, ident: TableIdent) -> SQERestCatalog:
        try:
            return self.catalog(ident.warehouse)
        except NoSuchTableError:
            raise NoSuchViewError(f"{ident}: unknown warehouse {ident.warehouse!r}") from None

    @staticmethod
    def _view_call(ident: TableIdent, call: Callable[[], _T]) -> _T:
        """A view call whose 404 is a NoSuchViewError (the catalog says view, the engine's tree agrees)."""
        try:
            return call()
        except NoSuchViewError:
            raise
        except NoSuchTableError as exc:
            raise NoSuchViewError(f"view {ident} not found", exc.status) from None

    # -- server-side scan planning -----------------------------------------------------------------------------
    def load_table_credentials(self, ident: TableIdent) -> CatalogCredentials | None:
        return self.catalog(ident.warehouse).load_table_credentials(ident.namespace, ident.name)

    def scan_planning(self, warehouse: str) -> ScanPlanningClient | None:
        catalog = self.catalog(warehouse)
        if not catalog.advertises(Capability.V1_SUBMIT_TABLE_SCAN_PLAN, Capability.V1_TABLE_SCAN_PLAN_TASKS):
            return None
        return _RestScanPlanning(catalog)
