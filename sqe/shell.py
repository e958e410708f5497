"""The interactive SQL shell: history, multi-line statements, backslash commands, Ctrl-C cancels the query."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sqe._text import terminal_line
from sqe.console import run_with_progress, write_result
from sqe.errors import SQEError
from sqe.sqltext import is_complete, split_statements

if TYPE_CHECKING:
    from sqe.session import Session

HELP = """\
  \\dt [NAMESPACE]   list tables
  \\d TABLE          describe a table (columns, types, masks)
  \\timing           toggle timing of statements
  \\q                quit
Statements end with ';'. Ctrl-C cancels the running query; Ctrl-D quits."""


class Shell:
    def __init__(self, session: Session, *, debug: bool = False) -> None:
        self.session = session
        self.debug = debug
        self.timing = False
        self.history = Path(os.environ.get("SQE_HISTORY", Path.home() / ".sqe_history"))

    def run(self) -> int:
        self._setup_readline()
        print("sqe shell. \\? for help, \\q to quit.", file=sys.stderr)
        buffer: list[str] = []
        while True:
            try:
                line = input("sqe> " if not buffer else "...> ")
            except EOFError:
                print(file=sys.stderr)
                break
            except KeyboardInterrupt:
                buffer = []
                print("^C", file=sys.stderr)
                continue
            buffer.append(line)
            text = "\n".join(buffer)
            if not is_complete(text):
                continue
            buffer = []
            if self.handle(text.strip()) == "quit":
                break
        self._save_history()
        return 0

    def handle(self, text: str) -> str | None:
        if text.startswith("\\"):
            return self.command(text)
        for statement in split_statements(text):
            self.run_statement(statement)
        return None

    def run_statement(self, statement: str) -> None:
        started = time.monotonic()
        try:
            table = run_with_progress(self.session, statement)
        except KeyboardInterrupt:
            print("query cancelled", file=sys.stderr)
            return
        except SQEError as exc:
            print(f"error: {terminal_line(exc)}", file=sys.stderr)
            return
        if table is not None:
            write_result(table, "table", None)
        if self.timing:
            print(f"Time: {(time.monotonic() - started) * 1000:.1f} ms", file=sys.stderr)

    def command(self, text: str) -> str | None:
        parts = text.rstrip(";").split()
        name, args = parts[0], parts[1:]
        try:
            if name in ("\\q", "\\quit"):
                return "quit"
            if name == "\\timing":
                self.timing = not self.timing
                print(f"Timing is {'on' if self.timing else 'off'}.", file=sys.stderr)
            elif name == "\\dt":
                from sqe.formatting import render_table

                sys.stdout.write(render_table(self.session.list_tables(args[0] if args else None)))
            elif name == "\\d" and args:
                from sqe.formatting import render_table

                sys.stdout.write(render_table(self.session.describe_table(args[0])))
            else:
                print(HELP, file=sys.stderr)
        except SQEError as exc:
            print(f"error: {terminal_line(exc)}", file=sys.stderr)
        return None

    def _setup_readline(self) -> None:
        try:
            import readline
        except ImportError:  # pragma: no cover - platform without readline
            return
        with contextlib.suppress(OSError):
            readline.read_history_file(self.history)
        readline.set_history_length(1000)

    def _save_history(self) -> None:
        try:
            import readline

            readline.write_history_file(self.history)
        except (ImportError, OSError):
            pass
