"""The ``sqe`` command: run SQL (``-e`` or an interactive shell) and manage the local stack (``sqe stack``)."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from sqe.errors import SQEError

if TYPE_CHECKING:
    import pyarrow as pa

    from sqe.session import Session

FORMATS = ("table", "csv", "json", "parquet")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sqe",
        description="Credential-aware SQL over Iceberg tables. `sqe stack up|down|status` manages the local stack; "
        "`sqe serve --config server.toml` runs the Flight SQL service.",
    )
    parser.add_argument("--config", "-c", help="SQE config file (config.toml)")
    parser.add_argument("-e", "--execute", metavar="SQL", help="run these statements and exit")
    parser.add_argument("--format", "-f", choices=FORMATS, default="table")
    parser.add_argument("--output", "-o", help="write results to this file instead of stdout")
    parser.add_argument("--debug", action="store_true", help="show details (tracebacks) on errors")
    parser.add_argument("--server", metavar="URL", help="run against an `sqe serve` server (grpc:// or grpc+tls://)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "stack":
        from sqe.stack.cli import main as stack_main

        return stack_main(argv[1:])
    if argv and argv[0] == "serve":
        from sqe.server.serve import main as serve_main

        return serve_main(argv[1:])
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, stream=sys.stderr)
    if args.format == "parquet" and not args.output:
        print("sqe: --format parquet needs --output PATH", file=sys.stderr)
        return 2
    try:
        session = _connect_remote(args.config, args.server) if args.server else _connect(args.config)
    except SQEError as exc:
        return _report(exc, args.debug)
    try:
        if args.execute is not None:
            return run_statements(session, args.execute, args.format, args.output, args.debug)
        from sqe.shell import Shell

        return Shell(session, debug=args.debug).run()
    finally:
        session.close()


def _connect(config_path: str | None) -> Session:
    from sqe.api import connect

    return connect(config=config_path)


def _connect_remote(config_path: str | None, server: str) -> Session:
    """A session on an `sqe serve` server, logged in with the config's own catalog credentials."""
    from typing import cast

    from sqe.config import load_config
    from sqe.server.client import RemoteSession

    return cast("Session", RemoteSession(server, load_config(config_path)))


def run_statements(session: Session, text: str, fmt: str, output: str | None, debug: bool) -> int:
    from sqe.sqltext import split_statements

    for statement in split_statements(text):
        try:
            table = run_with_progress(session, statement)
        except SQEError as exc:
            return _report(exc, debug)
        except KeyboardInterrupt:
            print("sqe: query cancelled", file=sys.stderr)
            return 130
        if table is not None:
            write_result(table, fmt, output)
    return 0


def run_with_progress(session: Session, statement: str) -> pa.Table | None:
    """Run one statement; Ctrl-C interrupts the query. A progress line shows on a TTY after one second."""
    result: dict[str, object] = {}

    def work() -> None:
        try:
            result["table"] = session.sql(statement).arrow()
        except BaseException as exc:
            result["error"] = exc

    worker = threading.Thread(target=work, name="sqe-query", daemon=True)
    started = time.monotonic()
    worker.start()
    progress = _Progress(sys.stderr, started)
    try:
        while worker.is_alive():
            worker.join(0.1)
            progress.tick(session)
    except KeyboardInterrupt:
        session.interrupt()
        worker.join(5)
        progress.clear()
        raise
    progress.clear()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result.get("table")  # type: ignore[return-value]


class _Progress:
    def __init__(self, stream: TextIO, started: float) -> None:
        self._stream = stream
        self._started = started
        self._shown = False
        self._enabled = stream.isatty()

    def tick(self, session: Session) -> None:
        elapsed = time.monotonic() - self._started
        if not self._enabled or elapsed < 1.0:
            return
        stats = getattr(session, "progress", lambda: None)()
        text = f"\r[{elapsed:6.1f}s] "
        if stats:
            text += f"files {stats.get('files_done', 0)}/{stats.get('files_total', '?')}  " + (
                f"{stats.get('bytes_done', 0) / 1e6:.1f} MB"
            )
        self._shown = True  # before writing: a Ctrl-C right after the write must still clear the line
        self._stream.write(text)
        self._stream.flush()

    def clear(self) -> None:
        if self._shown:
            self._stream.write("\r\033[K")
            self._stream.flush()


def write_result(table: pa.Table, fmt: str, output: str | None) -> None:
    from sqe.formatting import write_table

    if output:
        path = Path(output)
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, path)
            return
        with path.open("w", encoding="utf-8", newline="") as fh:
            write_table(table, fmt, fh)
        return
    write_table(table, fmt, sys.stdout)


def _report(exc: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    print(f"sqe: error: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
