"""The ``sqe`` command: run SQL (``-e`` or an interactive shell) and manage the local stack (``sqe stack``)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

from sqe import __version__
from sqe._process import Started, nothing, run_program
from sqe._text import first_line
from sqe.console import report_error, run_with_progress, write_result
from sqe.errors import ConfigError, QueryError, SQEError

if TYPE_CHECKING:
    from sqe.session import Session

FORMATS = ("table", "csv", "json", "parquet")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sqe",
        description="Credential-aware SQL over Iceberg tables. `sqe stack up|down|status` manages the local stack; "
        "`sqe serve --config server.toml` runs the Flight SQL service.",
    )
    parser.add_argument("--version", action="version", version=f"sqe {__version__}")
    parser.add_argument("--config", "-c", help="SQE config file (config.toml)")
    parser.add_argument("-e", "--execute", metavar="SQL", help="run these statements and exit")
    parser.add_argument("--format", "-f", choices=FORMATS, default="table")
    parser.add_argument("--output", "-o", help="write results to this file instead of stdout")
    parser.add_argument(
        "--null", metavar="TEXT", help="show NULL as TEXT in the table format (default NULL; grey on a terminal)"
    )
    parser.add_argument("--debug", action="store_true", help="show details (tracebacks) on errors")
    parser.add_argument("--server", metavar="URL", help="run against an `sqe serve` server (grpc:// or grpc+tls://)")
    return parser


def run() -> NoReturn:
    """The ``sqe`` program (its console script and ``python -m sqe.cli``): :func:`main` as this whole process."""
    run_program(lambda started: main(started=started, whole_process=True))


def main(argv: list[str] | None = None, *, started: Started = nothing, whole_process: bool = False) -> int:
    """``started``: called once start-up is over (the session connected, or a subcommand's server set up).
    ``whole_process``: this call is the process (``run``), so the session's database may open ahead."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "stack":
        started()
        return _stack(argv[1:])
    if argv and argv[0] == "serve":
        from sqe.server.serve import main as serve_main

        return serve_main(argv[1:], started=started)
    args = _parser().parse_args(argv)
    try:
        return _run_sql(args, started, whole_process)
    except KeyboardInterrupt:  # while starting up or writing a result: the query's own Ctrl-C is handled below
        print("sqe: cancelled", file=sys.stderr)
        return 130


def _run_sql(args: argparse.Namespace, started: Started, whole_process: bool) -> int:
    """``-e`` or the interactive shell, on a session made from ``--config`` (or on ``--server``)."""
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, stream=sys.stderr)
    # gRPC (the --server client's, the scan workers' channels) logs a failed TLS handshake (an untrusted
    # certificate, a peer that speaks no TLS) at INFO on stderr, two lines ahead of our own one-line error; an
    # operator's GRPC_VERBOSITY still wins. gRPC reads it when it starts, after this.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if args.format == "parquet" and not args.output:
        print("sqe: --format parquet needs --output PATH", file=sys.stderr)
        return 2
    if args.null is not None and args.execute is not None and args.format != "table":
        print(f"sqe: --null applies to the table format, not --format {args.format}", file=sys.stderr)
        return 2
    if whole_process and not args.server:
        from sqe.duckdb_connection import open_ahead

        open_ahead()  # the session's database opens while the engine is imported
    try:
        session = _connect_remote(args.config, args.server) if args.server else _connect(args.config)
    except SQEError as exc:
        return report_error(exc, args.debug)
    started()
    try:
        if args.execute is not None:
            return run_statements(session, args.execute, args.format, args.output, args.debug, null=args.null)
        from sqe.shell import Shell

        return Shell(session, debug=args.debug, null=args.null).run()
    except BrokenPipeError:
        # The reader went away (`sqe -e ... | head`): stop quietly, with SIGPIPE's status. stdout now points at
        # /dev/null, so the interpreter's last flush of it does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    finally:
        session.close()


def _stack(argv: list[str]) -> int:
    """``sqe stack ...``: the local dev stack is its own package (``sqe_stack``), imported only for this."""
    try:
        from sqe_stack.cli import main as stack_main
    except ImportError as exc:
        missing = ConfigError(f"sqe stack needs the stack extra: pip install 'sqe[stack]' ({first_line(exc)})")
        return report_error(missing, debug=False)
    return stack_main(argv)


def _connect(config_path: str | None) -> Session:
    from sqe.api import connect

    return connect(config=config_path)


def _connect_remote(config_path: str | None, server: str) -> Session:
    """A session on an `sqe serve` server, logged in with the config's own catalog credentials."""
    from typing import cast

    from sqe.config import load_config
    from sqe.server.client import RemoteSession

    return cast("Session", RemoteSession(server, load_config(config_path)))


def run_statements(
    session: Session, text: str, fmt: str, output: str | None, debug: bool, *, null: str | None = None
) -> int:
    from sqe.sqltext import split_statements

    results = 0
    for statement in split_statements(text):
        try:
            table = run_with_progress(session, statement)
        except SQEError as exc:
            return report_error(exc, debug)
        except KeyboardInterrupt:
            print("sqe: query cancelled", file=sys.stderr)
            return 130
        if table is not None:
            try:
                write_result(table, fmt, output, after_another=results > 0, null=null)
                results += 1
            except SQEError as exc:  # a result the format cannot hold
                return report_error(exc, debug)
            except OSError as exc:
                if not output:
                    raise  # stdout: a closed pipe, which main handles
                return report_error(QueryError(f"cannot write {output}: {exc.strerror or exc}"), debug)
    return 0


if __name__ == "__main__":
    run()
