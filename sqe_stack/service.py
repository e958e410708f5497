"""The stack's SQE service: the reader principal ``sqe-engine``, ``sqe serve`` acting as it, and scan workers.

Restricted tables are served only to a trusted reader acting for an end user, so the stack runs the engine the
way a deployment does: ``sqe stack up`` creates the reader principal (through the catalog's own admin store, like
the other demo principals), writes ``server.toml`` (0600: it holds the reader secret) next to a user-less engine
config, starts ``--workers N`` ``sqe-worker`` processes sharing one random coordinator token (0600 file), and
then ``sqe serve`` with those workers. Every process is a :class:`~sqe_stack.provision.Daemon` recorded in
``stack.json``, so ``stack down`` stops it and ``stack status`` shows it; ``stack.json`` names the server URL and
the reader's config, never a secret.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqe._machine import memory_share, spill_share
from sqe.server.config import ServerConfig
from sqe_stack.catalog import (
    PrincipalCredentials,
    PrincipalSpec,
    engine_settings_text,
    principal_store,
    provision_principal,
)
from sqe_stack.ceph import CEPH_CLIENT_ENV
from sqe_stack.provision import LOOPBACK, Daemon, free_ports, spawn, toml_str, wait_until, write_private

READER = "sqe-engine"
SERVER_CONFIG = "server.toml"
SERVER_ENGINE_CONFIG = "server-engine.toml"
WORKER_TOKEN = "worker.token"
_START_TIMEOUT = 60.0
WORKER_MAX_FRAGMENTS = 8  # sqe-worker's own default, passed so the limits below divide by what the workers run


@dataclass(frozen=True)
class Service:
    """What :func:`start_service` started: the server's URL and the workers' addresses."""

    url: str
    workers: tuple[str, ...]


def create_reader_principal(catalog_config: Path) -> PrincipalCredentials:
    """The reader principal ``sqe-engine`` (no grants of its own: it only acts for end users)."""
    with principal_store(catalog_config, "creating the reader principal") as store:
        return provision_principal(store, PrincipalSpec(READER, reader=True))


def server_engine_config_text(catalog_uri: str, s3_endpoint: str, workers: Sequence[str], token_file: Path) -> str:
    """The engine settings every user session of the server shares: no user credential at all."""
    header = (
        "# Engine settings of the stack's `sqe serve`, written by `sqe stack up`. No credential: every user\n"
        "# session runs on that user's delegated token (see server.toml).\n"
    )
    text = header + engine_settings_text(catalog_uri, s3_endpoint)
    if workers:
        token = token_file.read_text(encoding="utf-8").strip()
        addresses = ", ".join(toml_str(address) for address in workers)
        text += f"\n[coordinator]\nworkers = [{addresses}]\ntoken = {toml_str(token)}\n"
    return text


def server_config_text(reader: PrincipalCredentials, port: int, workers: int = 0) -> str:
    text = f"""# `sqe serve` of the stack, written by `sqe stack up` (0600: holds the reader secret).
[server]
engine_config = {toml_str(SERVER_ENGINE_CONFIG)}
listen = {toml_str(f"{LOOPBACK}:{port}")}
reader_client_id = {toml_str(reader.client_id)}
reader_client_secret = {toml_str(reader.client_secret)}
"""
    return text + (engine_limits_text() if workers else "")


def engine_limits_text() -> str:
    """The server's engines' side of the machine when workers run beside them: each of ``max_concurrent_queries``
    engines gets its share of that side."""
    memory, spill = _side_share(ServerConfig.model_fields["max_concurrent_queries"].default)
    return f"engine_memory_bytes = {memory}\nengine_spill_bytes = {spill}\n"


# The stack's workers and ``sqe serve``'s engines run on this one machine: with workers, each side gets half of what
# one process would take by default (half the memory and half the spill disk), so together they take that much.
# Left to their defaults, the workers' databases and the server's engines would each take half the memory.
_SIDES_WITH_WORKERS = 2


def _side_share(parts: int) -> tuple[int, int]:
    """(memory, spill) bytes of one of ``parts`` databases on one side of the machine; the spill disk is the one
    the stack's processes spill to (this directory)."""
    parts *= _SIDES_WITH_WORKERS
    return memory_share(parts), spill_share(shutil.disk_usage(os.getcwd()).free, parts)


def service_env() -> dict[str, str]:
    """Environment of the server and its workers: unbuffered output, and the RGW write fix (pyarrow's S3 layer
    reads it once, at start), so an INSERT through the server works on Ceph as on moto (moto accepts both)."""
    return {"PYTHONUNBUFFERED": "1", **CEPH_CLIENT_ENV}


def worker_limit_flags(workers: int) -> list[str]:
    """The workers share this one machine with each other and with ``sqe serve``: each fragment's
    partial-aggregation database gets its share of all ``workers`` x ``WORKER_MAX_FRAGMENTS`` of the workers' side
    (a worker's own default divides the whole by its fragments only, so N workers would together take N halves of
    the memory and of the spill disk)."""
    memory, spill = _side_share(max(1, workers) * WORKER_MAX_FRAGMENTS)
    flags = {
        "--max-fragments": WORKER_MAX_FRAGMENTS,
        "--aggregate-memory-bytes": memory,
        "--aggregate-spill-bytes": spill,
    }
    return [part for flag, value in flags.items() for part in (flag, str(value))]


def _spawn_worker(dir: Path, index: int, port: int, token_file: Path, limits: list[str]) -> Daemon:
    listen = f"{LOOPBACK}:{port}"
    argv = [sys.executable, "-m", "workers.cli", "--listen", listen, "--token-file", str(token_file), *limits]
    return spawn(
        f"worker-{index}",
        argv,
        dir / "logs" / f"worker-{index}.log",
        markers=("workers.cli", listen),
        env=service_env(),
        scrub_aws_env=True,  # workers read with the credentials the server pushes, never ambient ones
    )


def _spawn_server(dir: Path, config: Path, port_file: Path) -> Daemon:
    argv = [sys.executable, "-m", "sqe.cli", "serve", "--config", str(config), "--port-file", str(port_file)]
    return spawn(
        "server",
        argv,
        dir / "logs" / "server.log",
        markers=("sqe.cli", "serve", str(config)),
        env=service_env(),
        scrub_aws_env=True,
    )


def _listening(port_file: Path) -> bool:
    return port_file.is_file() and port_file.read_text(encoding="utf-8").strip().isdigit()


def start_service(
    dir: Path,
    reader: PrincipalCredentials,
    catalog_uri: str,
    s3_endpoint: str,
    workers: int,
    started: list[Daemon],
) -> Service:
    """Start ``workers`` workers, then ``sqe serve`` wired to them; every process is appended to ``started``."""
    ports = free_ports(workers + 1)
    token_file = dir / WORKER_TOKEN
    addresses: list[str] = []
    if workers:
        write_private(token_file, secrets.token_urlsafe(32) + "\n")
        limits = worker_limit_flags(workers)
        for index, port in enumerate(ports[1:], start=1):
            started.append(_spawn_worker(dir, index, port, token_file, limits))
            addresses.append(f"{LOOPBACK}:{port}")
    write_private(
        dir / SERVER_ENGINE_CONFIG, server_engine_config_text(catalog_uri, s3_endpoint, addresses, token_file)
    )
    config = dir / SERVER_CONFIG
    write_private(config, server_config_text(reader, ports[0], workers))
    port_file = dir / "server.port"
    port_file.unlink(missing_ok=True)
    started.append(_spawn_server(dir, config, port_file))
    hint = f" (see {dir / 'logs' / 'server.log'})"
    wait_until(lambda: _listening(port_file), "sqe serve", timeout=_START_TIMEOUT, watch=started[-1:], log_hint=hint)
    return Service(url=f"grpc://{LOOPBACK}:{ports[0]}", workers=tuple(addresses))
