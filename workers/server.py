"""Starting and stopping ``sqe-worker``: environment lockdown, the gRPC server (limits, TLS, auth), signals."""

from __future__ import annotations

import logging
import os
import signal
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import grpc

from sqe._net import address_host, is_loopback
from sqe.config import CacheConfig, MemoryConfig
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol._proto import worker_pb2_grpc
from sqe.distributed.protocol.ipc import serialize_execute_response
from sqe.errors import ConfigError
from sqe.execution.allocator import Tuning, keep_freed_memory
from workers.auth import BearerTokenInterceptor
from workers.environment import scrub_environment
from workers.service import MIN_CLIENT_PING_MS, ServiceSettings, WorkerService

log = logging.getLogger("sqe.worker")

MIN_MESSAGE_BYTES = 64 * 1024
# Control RPCs (Cancel, RefreshCredentials, Health, Stats) need server threads even when every fragment runs.
CONTROL_THREADS = 4


@dataclass(frozen=True)
class ProcessMemory:
    """The worker process's data-range and decoded-column cache bounds (0: off) and the freed memory its
    allocator keeps for reuse (0: glibc's defaults), in bytes: the engine's ``[cache]`` and ``[memory]``."""

    data_bytes: int = CacheConfig().data_bytes
    decoded_bytes: int = CacheConfig().decoded_bytes
    keep_freed_bytes: int = MemoryConfig().keep_freed_bytes

    def apply(self) -> Tuning:
        """Both are per process: set once, by the process entry point (``serve``), never by a test's server."""
        from sqe.execution.cache import configure_process_caches

        manifests = CacheConfig().manifest_bytes  # workers plan nothing; the engine's default is harmless
        configure_process_caches(data_bytes=self.data_bytes, manifest_bytes=manifests, decoded_bytes=self.decoded_bytes)
        return keep_freed_memory(self.keep_freed_bytes)


@dataclass(frozen=True)
class Keepalive:
    """HTTP/2 keepalive: the worker pings each connection every ``time_ms`` and closes one whose answer takes
    longer than ``timeout_ms``, so a coordinator lost to a partition (or frozen) releases its fragment slots within
    about their sum instead of the operating system's TCP timeouts (hours)."""

    time_ms: int = 30_000
    timeout_ms: int = 10_000

    def __post_init__(self) -> None:
        for name, value in (("--keepalive-ms", self.time_ms), ("--keepalive-timeout-ms", self.timeout_ms)):
            if value < 100:
                raise ConfigError(f"{name} must be at least 100")

    def channel_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.keepalive_time_ms", self.time_ms),
            ("grpc.keepalive_timeout_ms", self.timeout_ms),
            # What gRPC (1.6x and later) actually waits for a ping's answer; its default is a minute.
            ("grpc.http2.ping_timeout_ms", self.timeout_ms),
            # Idle connections too: a dead one is dropped before a call finds it.
            ("grpc.keepalive_permit_without_calls", 1),
            # Keep pinging a stream that sends nothing for a while (gRPC's default stops after two pings).
            ("grpc.http2.max_pings_without_data", 0),
            # The coordinator's own keepalive pings (at most one per 2 s) must never count as abuse.
            ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_MS),
        ]


@dataclass(frozen=True)
class ServerOptions:
    listen: str
    token: str | None = field(repr=False)
    tls_cert: bytes | None = field(default=None, repr=False)
    tls_key: bytes | None = field(default=None, repr=False)
    service: ServiceSettings = field(default_factory=ServiceSettings)
    memory: ProcessMemory = field(default_factory=ProcessMemory)
    keepalive: Keepalive = field(default_factory=Keepalive)

    def __post_init__(self) -> None:
        """Checked here, before anything binds: every ``ServerOptions`` (the CLI's or a test's) obeys it."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together")
        port = self.listen.rpartition(":")[2]
        # gRPC would wrap a port past 65535 into another without a word; int() refuses digits such as "²"
        if port.isdigit() and not (port.isascii() and int(port) <= 65535):
            raise ConfigError(f"--listen {self.listen!r}: port must be from 0 to 65535")
        # The coordinator's token and every ticket's keys arrive on this port: plaintext only on loopback.
        if self.tls_cert is None and not is_loopback(address_host(self.listen)):
            raise ConfigError(
                f"--listen {self.listen!r} is not a loopback address; plaintext is only served on loopback "
                "(give --tls-cert and --tls-key)"
            )
        # TLS authenticates the worker, not its callers: off loopback only the token keeps strangers from sending
        # tickets and credential pushes, so running without one is for loopback experiments only.
        if self.token is None and not is_loopback(address_host(self.listen)):
            raise ConfigError(
                f"--listen {self.listen!r} is not a loopback address; a worker never serves it without a token "
                "(give --token-file)"
            )


def create_server(options: ServerOptions) -> tuple[grpc.Server, WorkerService, int]:
    """A started-ready (not yet started) server bound to ``options.listen``; returns it, its service and port."""
    settings = options.service
    if settings.max_message_bytes < MIN_MESSAGE_BYTES:
        raise ConfigError(f"--max-message-bytes must be at least {MIN_MESSAGE_BYTES}")
    service = WorkerService(settings)
    interceptors = [BearerTokenInterceptor(options.token)] if options.token is not None else []
    server = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=settings.max_fragments + CONTROL_THREADS, thread_name_prefix="sqe-worker-rpc"
        ),
        interceptors=interceptors,
        options=[
            ("grpc.max_send_message_length", settings.max_message_bytes),
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.so_reuseport", 0),
            *options.keepalive.channel_options(),
        ],
    )
    _add_service(service, server)
    port = _bind(server, options)
    return server, service, port


class _HandlerCapture:
    """Stands in for the server while the generated code registers the service, to keep its handler table."""

    def __init__(self) -> None:
        self.service_name = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same table comes through add_registered_method_handlers

    def add_registered_method_handlers(self, service_name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service_name, self.handlers = service_name, dict(handlers)


def _add_service(service: WorkerService, server: grpc.Server) -> None:
    """The generated registration, with ``Execute``'s response serializer swapped for one that sends the
    worker's pre-serialised batch frames as they are (see :mod:`sqe.distributed.protocol.ipc`)."""
    capture = _HandlerCapture()
    worker_pb2_grpc.add_WorkerServicer_to_server(service, capture)
    handlers = capture.handlers
    expected = {method.name for method in pb.DESCRIPTOR.services_by_name["Worker"].methods}
    if set(handlers) != expected:  # the generated registration changed shape: never serve a partial service
        raise RuntimeError(f"the generated Worker registration gave {sorted(handlers)}, not {sorted(expected)}")
    handlers["Execute"] = grpc.unary_stream_rpc_method_handler(
        service.Execute,
        request_deserializer=pb.ScanTicket.FromString,
        response_serializer=serialize_execute_response,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.service_name, handlers),))
    server.add_registered_method_handlers(capture.service_name, handlers)


def _bind(server: grpc.Server, options: ServerOptions) -> int:
    try:
        if options.tls_cert is not None and options.tls_key is not None:
            credentials = grpc.ssl_server_credentials([(options.tls_key, options.tls_cert)])
            port = int(server.add_secure_port(options.listen, credentials))
        else:
            port = int(server.add_insecure_port(options.listen))
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen on {options.listen}: {exc}") from None
    if port == 0:
        raise ConfigError(f"cannot listen on {options.listen}")
    return port


def serve(options: ServerOptions, *, port_file: Path | None = None) -> int:
    """Run until SIGTERM/SIGINT; running fragments are cancelled on the way out. Returns the exit code."""
    removed = scrub_environment(os.environ)
    _one_line_grpc_logs()
    tuning = options.memory.apply()
    server, service, port = create_server(options)
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    server.start()
    tls = "TLS" if options.tls_cert is not None else "plaintext"
    auth = "bearer token" if options.token is not None else "NO AUTHENTICATION (--insecure-no-token)"
    log.info("listening on port %d (%s, %s); removed %d AWS_* variables", port, tls, auth, len(removed))
    memory = options.memory
    log.info(
        "caches: data ranges %d bytes, decoded columns %d bytes; freed memory kept: %d bytes (%s); prefetch %s",
        *(memory.data_bytes, memory.decoded_bytes, memory.keep_freed_bytes, tuning.value),
        "on" if options.service.prefetch else "off",
    )
    log.info("partial aggregation: each fragment's DuckDB takes at most %s", service.databases.describe())
    if port_file is not None:
        try:
            _write_port_file(port_file, port)
        except OSError as exc:
            server.stop(None)
            raise ConfigError(f"cannot write the port file {port_file}: {exc.strerror or exc}") from None
    stop.wait()
    log.info("stopping: cancelling %d running fragment(s)", service.registry.cancel_all())
    server.stop(grace=2.0).wait()
    return 0


class _NoTraceback(logging.Filter):
    """Keeps a record's message, drops its traceback (the record is still logged, on one line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info = None
        record.exc_text = None
        return True


def _one_line_grpc_logs() -> None:
    """grpc logs a full traceback for every request it cannot parse; any client could flood the log with them."""
    logging.getLogger("grpc._common").addFilter(_NoTraceback())


def _write_port_file(path: Path, port: int) -> None:
    """Atomically, so a watcher never reads a half-written port."""
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(f"{port}\n", encoding="utf-8")
    os.replace(scratch, path)
