"""Console output shared by the ``sqe`` command and its interactive shell: run one statement with a progress
line and Ctrl-C, write a result, report an error on one line.

``sqe.cli`` and ``sqe.shell`` both import this module and never each other.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from sqe._text import first_line, terminal_line
from sqe.errors import QueryError

if TYPE_CHECKING:
    import pyarrow as pa

    from sqe.session import Session


def run_with_progress(session: Session, statement: str) -> pa.Table | None:
    """Run one statement; Ctrl-C interrupts the query. A progress line shows on a TTY after one second. None: the
    statement has no result to show (PREPARE and DEALLOCATE answer a table without columns, which the table
    format drew as an empty box, CSV as a blank line, and a Parquet ``--output`` kept instead of the rows)."""
    result: dict[str, object] = {}
    # Not Thread.join/is_alive: on Python 3.11 a Ctrl-C arriving inside join() marks the thread stopped while it
    # still runs, and the caller would then close the session under the query.
    done = threading.Event()

    def work() -> None:
        try:
            result["table"] = session.sql(statement).arrow()
        except BaseException as exc:
            result["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=work, name="sqe-query", daemon=True)
    started = time.monotonic()
    worker.start()
    progress = _Progress(sys.stderr, started)
    try:
        while not done.wait(0.1):
            progress.tick(session)
    except KeyboardInterrupt:
        session.interrupt()
        done.wait(5)
        progress.clear()
        raise
    progress.clear()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    table: pa.Table | None = result.get("table")  # type: ignore[assignment]
    return table if table is not None and table.num_columns > 0 else None


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
        stats = session.progress()
        text = f"\r[{elapsed:6.1f}s] "
        if stats and "files_total" not in stats:  # a row-filtered table: file and byte counts are withheld
            text += f"{stats.get('rows_produced', 0):,} rows"
        elif stats:
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


def write_result(
    table: pa.Table, fmt: str, output: str | None, *, after_another: bool = False, null: str | None = None
) -> None:
    """``table`` to ``output`` (else stdout). ``after_another``: an earlier statement's result is already there;
    text formats add this one after it, as on stdout; a Parquet file holds one table: the last statement's (so
    ``INSERT ...; SELECT ...`` keeps the rows, not the insert's count). ``null``: the table format's NULL text
    (``--null``); on a colour terminal a NULL is grey too."""
    from sqe.formatting import write_table

    if output:
        path = Path(output)
        if fmt == "parquet":
            _write_parquet(table, path)
            return
        with path.open("a" if after_another else "w", encoding="utf-8", newline="") as fh:
            write_table(table, fmt, fh, null=null)
        return
    write_table(table, fmt, sys.stdout, null=null, grey_null=_colour_terminal(sys.stdout))


def _colour_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal that takes colours: not when NO_COLOR is set (no-color.org) or TERM is
    dumb."""
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _write_parquet(table: pa.Table, path: Path) -> None:
    """``table`` as a Parquet file; a column of a type Parquet cannot hold (a UNION, a map of DuckDB's NULL type) or
    a value it cannot (a seconds timestamp past its milliseconds' range) is a :class:`QueryError`, naming the column
    when its type is the cause, not a traceback (pyarrow removes the file it began)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pq.write_table(table, path)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as exc:
        column = next((field for field in table.schema if not _parquet_holds(field)), None)
        what = f"column {column.name!r} of type {column.type}" if column else "this result"
        raise QueryError(f"--format parquet cannot hold {what}: {first_line(exc)}") from None


def _parquet_holds(field: pa.Field) -> bool:
    """Whether Parquet has a type for ``field``: tried on an empty column, so nothing is written but a footer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pq.write_table(pa.schema([field]).empty_table(), pa.BufferOutputStream())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return False
    return True


def report_error(exc: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"sqe: error: {terminal_line(exc)}", file=sys.stderr)
    return 1
