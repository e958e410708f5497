"""The client side of ``sqe --server grpc://host:port``: a session-shaped object over Flight SQL.

``RemoteSession`` offers what the CLI and the shell use from an embedded ``Session`` (``sql(...).arrow()``,
``interrupt()``, ``list_tables``, ``describe_table``, ``close``), so ``-e``, output formats, the shell, Ctrl-C
and one-line errors behave the same against a server. Credentials come from the user's own config: its
``catalog.token``, or its client id/secret sent once as HTTP Basic (the server exchanges them at the catalog and
answers with the user's bearer token, which this client then uses).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2

from sqe._net import is_loopback
from sqe._text import first_line
from sqe.config import SQEConfig
from sqe.errors import (
    AuthenticationError,
    CatalogUnavailableError,
    ConfigError,
    PermissionDeniedError,
    QueryError,
    SQEError,
)
from sqe.execution.local import QueryCancelledError
from sqe.server._proto import flight_cancel_pb2 as cancel_pb
from sqe.server._proto import flight_sql_pb2 as sql_pb


def _error(exc: flight.FlightError) -> SQEError:
    """A server's Flight error as the SQE error type it names, one line (gRPC's "Detail:" suffix cut)."""
    text = first_line(exc)
    text = text.split(". Detail:", 1)[0]
    if isinstance(exc, flight.FlightCancelledError):
        return QueryCancelledError(text.split(": ", 1)[-1])
    if isinstance(exc, flight.FlightUnauthenticatedError):
        return AuthenticationError(text)
    if isinstance(exc, flight.FlightUnauthorizedError):
        return PermissionDeniedError(text)
    if isinstance(exc, flight.FlightUnavailableError):
        return CatalogUnavailableError(text)
    return QueryError(text)


class _RemoteResult:
    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def arrow(self) -> pa.Table:
        return self._table


_PLAINTEXT_SCHEMES = ("grpc", "grpc+tcp")
_REACHABLE_TIMEOUT_SECONDS = 10.0


def _refuse_plaintext_off_loopback(location: str) -> None:
    """The login sends the user's catalog secret or token: never in plaintext to another machine (an ``sqe serve``
    serves plaintext on loopback only, so such a server is misconfigured or not SQE's)."""
    parts = urlsplit(location)
    if parts.scheme in _PLAINTEXT_SCHEMES and not is_loopback(parts.hostname or ""):
        raise ConfigError(
            f"refusing to log in to {parts.hostname!r} in plaintext ({parts.scheme}://): the catalog credentials would "
            "cross the network readable; use grpc+tls://"
        )


class RemoteSession:
    """One client session on an ``sqe serve`` server (the server keeps its state under our session cookie)."""

    def __init__(self, location: str, config: SQEConfig, *, tls_root_certs: bytes | None = None) -> None:
        _refuse_plaintext_off_loopback(location)
        kwargs: dict[str, Any] = {}
        if tls_root_certs is not None:
            kwargs["tls_root_certs"] = tls_root_certs
        try:
            self._client = flight.FlightClient(location, **kwargs)
        except pa.ArrowException as exc:  # no scheme, a port out of range, a transport Flight lacks
            raise ConfigError(f"server URL {location!r}: {first_line(exc)}") from None
        self._location = location
        self._lock = threading.Lock()
        self._running: flight.FlightInfo | None = None
        self._reader: Any = None
        self._headers = self._login(config)

    def _login(self, config: SQEConfig) -> list[tuple[bytes, bytes]]:
        catalog = config.catalog
        connection = catalog.connection()
        token, secret = connection.token_value(), connection.client_secret_value()
        try:
            if token:
                headers = [(b"authorization", f"Bearer {token}".encode())]
                self._client.list_actions(flight.FlightCallOptions(headers=headers))
                return headers
            if catalog.client_id and secret:
                name, value = self._client.authenticate_basic_token(catalog.client_id, secret)
                return [(name, value)]
        except flight.FlightError as exc:
            raise self._login_error(exc) from None
        raise AuthenticationError("the config names no catalog.token or catalog.client_id/client_secret to log in")

    def _login_error(self, exc: flight.FlightError) -> SQEError:
        """pyarrow's Basic handshake with an address nothing answers fails as an internal error, "Could not finish
        writing before closing"; one plain call then tells an unreachable server (UNAVAILABLE) apart."""
        if isinstance(exc, flight.FlightInternalError):
            try:
                self._client.list_actions(flight.FlightCallOptions(timeout=_REACHABLE_TIMEOUT_SECONDS))
            except flight.FlightUnavailableError as unreachable:
                return CatalogUnavailableError(
                    f"cannot reach the SQE server at {self._location}: {_error(unreachable)}"
                )
            except flight.FlightError:
                pass  # it answers: the handshake's own error stands
        return _error(exc)

    def _options(self) -> flight.FlightCallOptions:
        return flight.FlightCallOptions(headers=self._headers)

    def sql(self, text: str, params: Any = None) -> _RemoteResult:
        if params is not None:
            raise QueryError("parameters are not supported by the remote CLI session")
        wrapper = any_pb2.Any()
        wrapper.Pack(sql_pb.CommandStatementQuery(query=text))
        descriptor = flight.FlightDescriptor.for_command(wrapper.SerializeToString())
        try:
            info = self._client.get_flight_info(descriptor, self._options())
            with self._lock:
                self._running = info
            reader = self._client.do_get(info.endpoints[0].ticket, self._options())
            with self._lock:
                self._reader = reader
            return _RemoteResult(reader.read_all())
        except flight.FlightError as exc:
            raise _error(exc) from None
        finally:
            with self._lock:
                self._running, self._reader = None, None

    def interrupt(self) -> None:
        """Cancel the running query: CancelFlightInfo at the server, and drop our stream."""
        with self._lock:
            info, reader = self._running, self._reader
        if info is None:
            return
        request = cancel_pb.CancelFlightInfoRequest(info=info.serialize())
        action = flight.Action("CancelFlightInfo", request.SerializeToString())
        with contextlib.suppress(flight.FlightError):  # the stream cancel below still stops it
            list(self._client.do_action(action, self._options()))
        if reader is not None:
            reader.cancel()

    def progress(self) -> dict[str, int] | None:
        return None

    def list_tables(self, namespace: str | None = None) -> pa.Table:
        command = sql_pb.CommandGetTables()
        if namespace:
            parts = namespace.split(".")
            if len(parts) not in (1, 2):
                raise QueryError(f"namespace {namespace!r} must be namespace or warehouse.namespace")
            command.db_schema_filter_pattern = parts[-1]
            if len(parts) == 2:
                command.catalog = parts[0]
        table = self._metadata(command)
        return table.rename_columns(["warehouse", "namespace", "table", "type"]).select(
            ["warehouse", "namespace", "table"]
        )

    def describe_table(self, name: str) -> pa.Table:
        schema = self.sql(f"SELECT * FROM {name} LIMIT 0").arrow().schema
        return pa.table({"column": schema.names, "type": [str(t) for t in schema.types]})

    def _metadata(self, command: Any) -> pa.Table:
        wrapper = any_pb2.Any()
        wrapper.Pack(command)
        descriptor = flight.FlightDescriptor.for_command(wrapper.SerializeToString())
        try:
            info = self._client.get_flight_info(descriptor, self._options())
            return self._client.do_get(info.endpoints[0].ticket, self._options()).read_all()
        except flight.FlightError as exc:
            raise _error(exc) from None

    def close(self) -> None:
        self._client.close()
