"""``sqe-worker --listen HOST:PORT [--token-file F] [--tls-cert C --tls-key K] [--max-message-bytes N]``.

Fails closed: without a token file the worker refuses to start unless ``--insecure-no-token`` is given, and it
serves plaintext on a loopback ``--listen`` address only (elsewhere ``--tls-cert``/``--tls-key`` are required).
``--data-cache-bytes`` / ``--decoded-cache-bytes`` bound the process's data-range and decoded-column caches
(the engine's ``[cache] data_bytes`` / ``decoded_bytes``; 0 turns one off), ``--prefetch`` is the engine's
``[cache] prefetch`` and ``--keep-freed-bytes`` is the engine's ``[memory] keep_freed_bytes``. ``--keepalive-ms`` /
``--keepalive-timeout-ms``: how often the worker pings each coordinator connection and how long an answer may take
before the connection (and its fragments, with their slots) is dropped. ``--aggregate-memory-bytes`` /
``--aggregate-threads`` / ``--aggregate-spill-bytes`` bound the DuckDB database each running fragment's partial
aggregation gets (``workers.databases``; by default its ``--max-fragments`` share of half the memory and spill disk).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from sqe._machine import MAX_DATABASE_BYTES, MAX_DATABASE_THREADS, MIN_DATABASE_MEMORY_BYTES
from sqe._process import Started, nothing, run_program
from sqe._text import terminal_line
from sqe.errors import ConfigError

if TYPE_CHECKING:
    from workers.server import ServerOptions

# gRPC, pyarrow and the engine are imported inside the functions below, so that a program's start-up (``run``)
# covers them (see ``sqe._process``).


def _parser() -> argparse.ArgumentParser:
    from sqe.config import CacheConfig, MemoryConfig
    from workers.service import DEFAULT_MAX_MESSAGE_BYTES

    parser = argparse.ArgumentParser(prog="sqe-worker", description="SQE distributed scan worker (gRPC).")
    parser.add_argument(
        "--listen", required=True, metavar="HOST:PORT", help="address to listen on (port 0: any; TLS only off loopback)"
    )
    parser.add_argument("--token-file", type=Path, help="file holding the coordinator's bearer token")
    parser.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="accept calls without a token (loopback --listen only; local experiments)",
    )
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate chain; with --tls-key: TLS only")
    parser.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    parser.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES, metavar="N")
    parser.add_argument("--max-fragments", type=int, default=8, help="fragments run at once (default 8)")
    parser.add_argument("--max-files-in-flight", type=int, default=2, help="files read at once per fragment")
    defaults = CacheConfig()
    parser.add_argument(
        "--data-cache-bytes", type=int, default=defaults.data_bytes, metavar="N",
        help=f"data-file byte ranges kept for repeat fragments (default {defaults.data_bytes}; 0: off)",
    )  # fmt: skip
    parser.add_argument(
        "--decoded-cache-bytes", type=int, default=defaults.decoded_bytes, metavar="N",
        help=f"decoded Arrow columns of range-cached files (default {defaults.decoded_bytes}; 0: off)",
    )  # fmt: skip
    parser.add_argument(
        "--prefetch", action="store_true",
        help="fetch a large data file's column chunks in parallel (a remote store; needs the data cache)",
    )  # fmt: skip
    keep = MemoryConfig().keep_freed_bytes
    parser.add_argument(
        "--keep-freed-bytes", type=int, default=keep, metavar="N",
        help=f"freed memory the allocator keeps for reuse (glibc; default {keep}; 0: malloc's defaults)",
    )  # fmt: skip
    parser.add_argument(
        "--keepalive-ms", type=int, default=30_000, metavar="MS",
        help="ping each coordinator connection this often (default 30000)",
    )  # fmt: skip
    parser.add_argument(
        "--keepalive-timeout-ms", type=int, default=10_000, metavar="MS",
        help="drop a connection whose ping goes unanswered this long, freeing its fragments (default 10000)",
    )  # fmt: skip
    parser.add_argument(
        "--aggregate-memory-bytes", type=int, metavar="N",
        help="DuckDB memory of each fragment's partial aggregation (default: half the memory, or of the control "
        "group's limit, divided by --max-fragments; at least 16 MiB)",
    )  # fmt: skip
    parser.add_argument(
        "--aggregate-threads",
        type=int,
        metavar="N",
        help="DuckDB threads of each fragment's partial aggregation (default 1)",
    )
    parser.add_argument(
        "--aggregate-spill-bytes", type=int, metavar="N",
        help="what each fragment's partial aggregation may spill to disk (default: half the spill disk's free "
        "space divided by --max-fragments; 0: never spills)",
    )  # fmt: skip
    parser.add_argument("--pace-ms-per-file", type=int, default=0, help=argparse.SUPPRESS)  # tests only
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def _read_pem(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {path}: {type(exc).__name__}") from None


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    from workers.auth import read_token_file
    from workers.databases import default_limits
    from workers.server import Keepalive, ProcessMemory, ServerOptions
    from workers.service import ServiceSettings

    if args.token_file is None and not args.insecure_no_token:
        raise ConfigError("no --token-file: refusing to start without authentication (or pass --insecure-no-token)")
    if args.token_file is not None and args.insecure_no_token:
        raise ConfigError("--token-file and --insecure-no-token contradict each other")
    for name in ("max_fragments", "max_files_in_flight"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("pace_ms_per_file", "data_cache_bytes", "decoded_cache_bytes", "keep_freed_bytes"):
        if getattr(args, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must not be negative")
    if args.prefetch and args.data_cache_bytes == 0:
        raise ConfigError("--prefetch needs --data-cache-bytes above 0 (prefetched column chunks go into that cache)")
    _check_aggregate_limits(args)
    return ServerOptions(
        listen=args.listen,
        token=read_token_file(args.token_file) if args.token_file is not None else None,
        tls_cert=_read_pem(args.tls_cert, "TLS certificate"),
        tls_key=_read_pem(args.tls_key, "TLS key"),
        service=ServiceSettings(
            max_message_bytes=args.max_message_bytes,
            max_fragments=args.max_fragments,
            max_files_in_flight=args.max_files_in_flight,
            pace_seconds=args.pace_ms_per_file / 1000.0,
            prefetch=args.prefetch,
            aggregate_limits=default_limits(
                args.max_fragments, args.aggregate_memory_bytes, args.aggregate_threads, args.aggregate_spill_bytes
            ),
        ),
        memory=ProcessMemory(args.data_cache_bytes, args.decoded_cache_bytes, args.keep_freed_bytes),
        keepalive=Keepalive(args.keepalive_ms, args.keepalive_timeout_ms),
    )


def _check_aggregate_limits(args: argparse.Namespace) -> None:
    """The bounds ``sqe serve`` checks its engines' limits against: past them DuckDB fails, hangs or aborts."""
    memory, threads, spill = args.aggregate_memory_bytes, args.aggregate_threads, args.aggregate_spill_bytes
    if memory is not None and not MIN_DATABASE_MEMORY_BYTES <= memory <= MAX_DATABASE_BYTES:
        raise ConfigError(
            f"--aggregate-memory-bytes must be at least {MIN_DATABASE_MEMORY_BYTES} (16 MiB) and at most "
            f"{MAX_DATABASE_BYTES}"
        )
    if threads is not None and not 1 <= threads <= MAX_DATABASE_THREADS:
        raise ConfigError(f"--aggregate-threads must be at least 1 and at most {MAX_DATABASE_THREADS}")
    if spill is not None and not 0 <= spill <= MAX_DATABASE_BYTES:
        raise ConfigError(f"--aggregate-spill-bytes must be at least 0 (never spill) and at most {MAX_DATABASE_BYTES}")


def run() -> NoReturn:
    """The ``sqe-worker`` program (its console script and ``python -m workers.cli``) as this whole process."""
    run_program(lambda started: main(started=started))


def main(argv: list[str] | None = None, *, started: Started = nothing) -> int:
    """``started``: called once start-up is over, before the worker serves."""
    from workers.server import serve

    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    try:
        options = options_from_args(args)
        started()
        return serve(options, port_file=args.port_file)
    except ConfigError as exc:
        print(f"sqe-worker: error: {terminal_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    run()
