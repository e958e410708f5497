"""The ``sqe serve --config server.toml`` process: load both configs, start the Flight SQL server, stop cleanly.

``--port-file PATH`` writes the bound port (useful with ``listen = "127.0.0.1:0"``). SIGTERM and SIGINT stop the
server: open queries are cancelled and every engine session is closed.

``--list-external-stores`` and ``--prune-external-stores DAYS`` look after the per-user mount stores instead of
serving (:mod:`sqe.server.mount_stores`): a store of an authority that is gone (a rotated secret, an opaque token
issued again) is never read again, and nothing else removes it.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqe._process import Started, nothing
from sqe._text import counted, first_line, terminal_line
from sqe.config import SQEConfig, load_config
from sqe.errors import CatalogError, CatalogUnavailableError, SQEError
from sqe.server import mount_stores
from sqe.server.config import ServerConfig, check_serving_config, load_server_config
from sqe.server.identity import IdentityBroker
from sqe.server.mount_stores import MIN_PRUNE_DAYS

if TYPE_CHECKING:
    from sqe.duckdb_connection import DatabaseLimits

log = logging.getLogger("sqe.server")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sqe serve", description="Run SQE as an Arrow Flight SQL service.")
    parser.add_argument("--config", "-c", required=True, help="server.toml (see config.toml.example, [server])")
    parser.add_argument("--port-file", help="write the bound port to this file once listening")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    upkeep = parser.add_mutually_exclusive_group()
    upkeep.add_argument(
        "--list-external-stores",
        action="store_true",
        help="list the per-user external-table stores with when each was last used, then exit",
    )
    upkeep.add_argument(
        "--prune-external-stores",
        type=float,
        metavar="DAYS",
        help=f"delete the per-user external-table stores unused for DAYS days (at least {MIN_PRUNE_DAYS:g}), then exit",
    )
    return parser


def _tls(config: ServerConfig) -> list[tuple[bytes, bytes]] | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    try:
        return [(Path(config.tls_cert).read_bytes(), Path(config.tls_key).read_bytes())]
    except OSError as exc:
        raise SQEError(f"server.tls_cert/tls_key: cannot read {exc.filename}: {exc.strerror}") from None


def _keep_tracebacks_off_the_wire() -> None:
    """pyarrow's GetSchema handler (unlike GetFlightInfo's) turns a raised FlightError into a status whose detail
    is Python's formatted traceback, sent to the client. Formatting honours ``sys.tracebacklimit``: at 0 the
    detail is the exception's one line. The server's own logs keep whole tracebacks (``_FullTracebackFormatter``).
    """
    sys.tracebacklimit = 0


class _FullTracebackFormatter(logging.Formatter):
    """Log records with their whole traceback, whatever ``sys.tracebacklimit`` says (an explicit limit wins)."""

    def formatException(self, ei: Any) -> str:
        return "".join(traceback.format_exception(ei[0], ei[1], ei[2], limit=_LOG_TRACEBACK_FRAMES)).rstrip("\n")


_LOG_TRACEBACK_FRAMES = 100


def main(argv: list[str], *, started: Started = nothing) -> int:
    """``started``: called once the server is set up, before it serves (see ``sqe._process``)."""
    args = _parser().parse_args(argv)
    # a native crash (DuckDB, Arrow, gRPC) then leaves every thread's Python stack in the log
    faulthandler.enable(file=sys.stderr, all_threads=True)
    _keep_tracebacks_off_the_wire()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_FullTracebackFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    try:
        if args.list_external_stores or args.prune_external_stores is not None:
            return _look_after_stores(args.config, args.prune_external_stores)
        return _serve(args.config, args.port_file, started)
    except SQEError as exc:
        # A catalog's refusal (the reader identity at start) is typed, as the server's errors to clients are.
        typed = f"{type(exc).__name__}: " if isinstance(exc, CatalogError) else ""
        print(f"sqe serve: error: {typed}{terminal_line(exc)}", file=sys.stderr)
        return 1


def _look_after_stores(config_path: str, prune_days: float | None) -> int:
    """List the mount stores, or delete those unused for ``prune_days``; one line each on stdout."""
    base = _stores_base(load_config(load_server_config(config_path).engine_config))
    if base is None:
        print("no [external_tables] path: no external-table stores")
        return 0
    now = time.time()
    if prune_days is None:
        listed = mount_stores.stores(base)
        print(f"{counted(len(listed), 'external-table store')} beside {base}, least recently used first")
        for info in listed:
            print(mount_stores.describe(info, now))
        return 0
    pruned = mount_stores.prune_stores(base, prune_days)
    print(f"removed {counted(len(pruned.removed), 'external-table store')} not used for {prune_days:g} days or more")
    if pruned.in_use:
        print(f"kept {counted(pruned.in_use, 'store')} a running server's client session holds")
    for info in pruned.removed:
        print(mount_stores.describe(info, now))
    return 0


def _stores_base(engine_config: SQEConfig) -> str | None:
    return engine_config.external_tables.path or None


_STALE_DAYS = 30.0  # what the start-up line counts as long unused


def _log_stores(engine_config: SQEConfig) -> None:
    """One line at start: how many mount stores there are and how many went unused for a month (file counts only)."""
    base = _stores_base(engine_config)
    listed = mount_stores.stores(base) if base else []
    if not listed:
        return
    stale = sum(1 for info in listed if info.last_used <= time.time() - _STALE_DAYS * 86400)
    log.info(
        "%s beside %s, %d not used for %g days or more (sqe serve --list-external-stores lists them, "
        "--prune-external-stores DAYS deletes those unused for DAYS days)",
        counted(len(listed), "external-table store"),
        base,
        stale,
        _STALE_DAYS,
    )


def _log_engine_limits(limits: DatabaseLimits | None) -> None:
    if limits is not None:
        log.info(
            "each engine may take %d bytes of memory, %d threads and %d bytes of spill space "
            "([server] engine_memory_bytes, engine_threads, engine_spill_bytes)",
            limits.memory_bytes,
            limits.threads,
            limits.spill_bytes,
        )


def _check_reader(broker: IdentityBroker) -> None:
    """One reader login before listening: a refused reader identity (a wrong or rotated secret, a deleted
    principal) ends the start with one line naming the reader. A catalog not reachable yet (started after the
    server, or down for a moment) only warns: the reader logs in at the first user's call, as it retries anyway."""
    try:
        broker.check_reader()
    except CatalogUnavailableError as exc:
        log.warning(
            "cannot check the reader identity %r at start (%s); it logs in at the first user's call",
            broker.reader_client_id,
            first_line(exc),
        )


def _serve(config_path: str, port_file: str | None, started: Started) -> int:
    from pyarrow import ArrowException

    from sqe.server.flight import SQEFlightServer  # pyarrow.flight only for the server

    server_config = load_server_config(config_path)
    engine_config = load_config(server_config.engine_config)
    check_serving_config(engine_config)  # before anything is contacted
    _log_stores(engine_config)
    broker = IdentityBroker(
        engine_config.catalog.uri,
        engine_config.catalog.warehouse,
        scope=engine_config.catalog.scope,
        reader_client_id=server_config.reader_client_id,
        reader_client_secret=server_config.reader_client_secret_value(),
        timeout=engine_config.catalog.request_timeout_seconds,
        auth_cache_seconds=server_config.auth_cache_seconds,
    )
    _check_reader(broker)
    try:
        server = SQEFlightServer(server_config, engine_config, broker, tls_certificates=_tls(server_config))
    except (OSError, ArrowException) as exc:  # the port is taken, the TLS material is not a key pair, ...
        raise SQEError(f"cannot listen on {server_config.listen}: {first_line(exc)}") from None
    started()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    scheme = "grpc+tls" if server_config.tls else "grpc"
    mode = f"delegating as reader {server_config.reader_client_id!r}" if broker.delegates else "user tokens"
    log.info("listening on %s://%s:%d (%s)", scheme, server_config.host, server.port, mode)
    _log_engine_limits(server.registry.database_limits)
    try:
        if port_file:
            try:
                Path(port_file).write_text(f"{server.port}\n", encoding="utf-8")
            except OSError as exc:
                raise SQEError(f"cannot write the port file {port_file}: {exc.strerror or exc}") from None
        while not stop.wait(0.5):
            pass
    finally:
        log.info("shutting down")
        server.close()
        server.shutdown()
    return 0
