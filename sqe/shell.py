"""The interactive SQL shell: history, multi-line statements, backslash commands, Ctrl-C cancels the query."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sqe._text import has_credential_shape, names_secret, terminal_line
from sqe.console import run_with_progress, write_result
from sqe.errors import SQEError
from sqe.sqltext import code_and_pieces, is_complete, split_statements

if TYPE_CHECKING:
    from sqe.session import Session

HELP = """\
  \\dt [NAMESPACE]   list tables
  \\d TABLE          describe a table (columns, types, masks)
  \\timing           toggle timing of statements
  \\q                quit
Statements end with ';'. Ctrl-C cancels the running query; Ctrl-D quits."""

_WORD = re.compile(r"[A-Za-z0-9_]+")

# What one input did: the shell quits, a statement failed, or neither.
Outcome = Literal["quit", "failed"] | None


class Shell:
    def __init__(self, session: Session, *, debug: bool = False, null: str | None = None) -> None:
        self.session = session
        self.debug = debug
        self.null = null  # the table format's NULL text (--null)
        self.timing = False
        self.history = Path(os.environ.get("SQE_HISTORY", Path.home() / ".sqe_history"))

    def run(self) -> int:
        """Read statements until EOF or ``\\q``; a failed statement is reported and the shell carries on.
        Statements piped in (stdin not a terminal) run as a script: no prompts on stdout, a last statement
        without ';' still runs, and the status is 1 if any statement failed."""
        interactive = sys.stdin.isatty()
        self._setup_readline()
        if interactive:
            print("sqe shell. \\? for help, \\q to quit.", file=sys.stderr)
        buffer: list[str] = []
        outcome: Outcome = None
        failed = False
        while outcome != "quit":
            try:
                line = input(("sqe> " if not buffer else "...> ") if interactive else "")
            except EOFError:
                _keep_out_of_history(buffer)
                if interactive:
                    print(file=sys.stderr)
                elif "".join(buffer).strip():
                    failed = self.handle("\n".join(buffer).strip()) == "failed" or failed
                break
            except KeyboardInterrupt:
                _keep_out_of_history(buffer)
                buffer = []
                print("^C", file=sys.stderr)
                continue
            buffer.append(line)
            text = "\n".join(buffer)
            if is_complete(text):
                _keep_out_of_history(buffer)
                buffer = []
                outcome = self.handle(text.strip())
                failed = outcome == "failed" or failed
        self._save_history()
        return 1 if failed and not interactive else 0

    def handle(self, text: str) -> Outcome:
        if text.startswith("\\"):
            return self.command(text)
        outcomes = [self.run_statement(statement) for statement in split_statements(text)]
        return "failed" if "failed" in outcomes else None

    def run_statement(self, statement: str) -> Outcome:
        started = time.monotonic()
        try:
            table = run_with_progress(self.session, statement)
        except KeyboardInterrupt:
            print("query cancelled", file=sys.stderr)
            return "failed"
        except SQEError as exc:
            print(f"error: {terminal_line(exc)}", file=sys.stderr)
            return "failed"
        if table is not None:
            try:
                write_result(table, "table", None, null=self.null)
            except KeyboardInterrupt:  # a long result scrolling by: stop it, keep the shell
                print("\noutput cancelled", file=sys.stderr)
                return "failed"
        if self.timing:
            print(f"Time: {(time.monotonic() - started) * 1000:.1f} ms", file=sys.stderr)
        return None

    def command(self, text: str) -> Outcome:
        parts = text.rstrip(";").split()
        name, args = parts[0], parts[1:]
        try:
            if name in ("\\q", "\\quit"):
                return "quit"
            if name == "\\timing":
                self.timing = not self.timing
                print(f"Timing is {'on' if self.timing else 'off'}.", file=sys.stderr)
            elif name == "\\dt":  # written as a query's result is: --null, grey on a colour terminal
                write_result(self.session.list_tables(args[0] if args else None), "table", None, null=self.null)
            elif name == "\\d" and args:
                write_result(self.session.describe_table(args[0]), "table", None, null=self.null)
            else:
                print(HELP, file=sys.stderr)
        except SQEError as exc:
            print(f"error: {terminal_line(exc)}", file=sys.stderr)
            return "failed"
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
        """Only the user may read the history file, even one made before with wider permissions."""
        try:
            import readline

            os.close(os.open(self.history, os.O_WRONLY | os.O_CREAT, 0o600))
            os.chmod(self.history, 0o600)
            readline.write_history_file(self.history)
        except (ImportError, OSError):
            pass


def _keep_out_of_history(lines: list[str]) -> None:
    """Take a statement naming a secret back out of the readline history, newest line first. Readline added each
    non-empty line unless it repeated the entry before it, so a line not found at the end was never added."""
    if not holds_secret("\n".join(lines)):
        return
    try:
        import readline
    except ImportError:  # pragma: no cover - platform without readline
        return
    for line in reversed(lines):
        newest = readline.get_current_history_length()
        if newest and readline.get_history_item(newest) == line:
            readline.remove_history_item(newest - 1)


def holds_secret(text: str) -> bool:
    """Whether SQL text may carry a credential in clear: a word of its code names one (a comment between words
    separates them, as in DuckDB), or a string, quoted identifier, dollar-quoted string or comment names one or has
    a credential's shape. The history file, which outlives the session, never keeps such a statement."""
    code, pieces = code_and_pieces(text)
    if any(names_secret(word) for word in _WORD.findall(code)):
        return True
    return any(_holds_secret_text(piece) for piece in pieces)


def _holds_secret_text(piece: str) -> bool:
    return any(names_secret(word) for word in _WORD.findall(piece)) or has_credential_shape(piece)
