"""The ``sqe`` CLI in a pseudo-terminal against moto + sqe-catalog: Ctrl-C cancels a long query but not the shell,
and the progress line shows on a TTY only.

Each run gets a fresh pty as its controlling terminal, so ``\\x03`` written to the master reaches the process as
SIGINT through the line discipline, exactly as a user's Ctrl-C would.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

import pytest

import sqe.api
from tests.conftest import BOGUS_AWS_ENV, pyiceberg_catalog, write_sqe_config
from tests.helpers.waiting import wait_until

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e]

ROWS = 100_000
# 10^10 pairs, and `a.x + b.x < 0` never holds on non-negative x, so DuckDB must test every pair: minutes of work.
SLOW_QUERY = "SELECT count(*) AS n FROM {table} a, {table} b WHERE a.x + b.x < 0"
PROGRESS = re.compile(rb"\r\[\s*(\d+\.\d)s\]")  # the frame sqe.console._Progress writes
ERASE_LINE = b"\r\x1b[K"  # how the progress line is cleared
PROMPT = b"sqe> "
CANCEL_WITHIN = 3.0  # seconds from Ctrl-C to "query cancelled" (an abandoned query thread takes 5)
# Runs in the child: become the session's controlling terminal (stdin is the pty slave), then exec the real CLI.
# Takes the pty as the controlling terminal, and gives SIGINT its default disposition as a login shell does: a
# test run started from a background shell inherits SIGINT ignored, and a Python started so raises no
# KeyboardInterrupt for a Ctrl-C (these tests then fail on their harness, not on the shell).
TAKE_TTY = (
    "import fcntl, os, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@dataclass(frozen=True)
class Setup:
    config: Path
    table: str

    @property
    def slow_query(self) -> str:
        return SLOW_QUERY.format(table=self.table)


@pytest.fixture(scope="module")
def setup(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory
) -> Setup:
    namespace = f"tty_{uuid.uuid4().hex[:6]}"
    pyiceberg_catalog(catalog_server, engine_writer).create_namespace(namespace)
    config = write_sqe_config(
        tmp_path_factory.mktemp("tty") / "sqe.toml", catalog_server.url, engine_writer, catalog_server.moto
    )
    table = f"{namespace}.nums"
    with sqe.api.connect(config) as session:
        session.sql(f"CREATE TABLE {table} AS SELECT range AS x FROM range({ROWS})")
    return Setup(config, table)


@dataclass
class Terminal:
    """A running ``sqe`` whose controlling terminal is a pty; everything it writes to the pty lands in ``seen``."""

    proc: subprocess.Popen[bytes]
    master: int
    seen: bytearray = field(default_factory=bytearray)
    mark: int = 0  # searches start here, so a repeated prompt is found afresh

    @property
    def text(self) -> str:
        return self.seen.decode("utf-8", errors="replace")

    def type(self, line: str) -> None:
        os.write(self.master, line.encode())

    def wait_for(self, pattern: bytes | re.Pattern[bytes], timeout: float) -> re.Match[bytes] | bytes:
        """Read until ``pattern`` shows after the mark (then move the mark past it); fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            found = self._search(pattern)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._read(remaining):
                pytest.fail(f"no {pattern!r} within {timeout} s; the terminal showed:\n{self.text}")

    def _search(self, pattern: bytes | re.Pattern[bytes]) -> re.Match[bytes] | bytes | None:
        if isinstance(pattern, bytes):
            at = self.seen.find(pattern, self.mark)
            if at < 0:
                return None
            self.mark = at + len(pattern)
            return pattern
        match = pattern.search(self.seen, self.mark)
        if match is not None:
            self.mark = match.end()
        return match

    def _read(self, timeout: float) -> bool:
        """Append what is there within ``timeout``; False once the child has closed the terminal."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: every slave descriptor is closed
            return False
        self.seen += chunk
        return bool(chunk)

    def exit_code(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.1)
        return self.proc.wait(timeout=0.1)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self.master)


def spawn(setup: Setup, home: Path, *args: str, stderr: IO[bytes] | None = None) -> Terminal:
    """``python -m sqe.cli --config F ARGS`` with stdin/stdout (and stderr unless given) on a fresh pty."""
    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))  # wide: no wrapped lines
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SQE_", "AWS_"))}
    env.update(BOGUS_AWS_ENV, TERM="dumb", SQE_HISTORY=str(home / "history"))
    command = [sys.executable, "-c", TAKE_TTY, "-m", "sqe.cli", "--config", str(setup.config), *args]
    try:
        proc = subprocess.Popen(
            command,
            stdin=slave,
            stdout=slave,
            stderr=slave if stderr is None else stderr,
            start_new_session=True,
            env=env,
        )
    finally:
        os.close(slave)
    return Terminal(proc, master)


@pytest.fixture()
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def seconds_shown(frame: re.Match[bytes] | bytes) -> float:
    assert isinstance(frame, re.Match)
    return float(frame.group(1))


def test_ctrl_c_cancels_the_query_not_the_shell(setup: Setup, tmp_path: Path, terminals: list[Terminal]) -> None:
    shell = spawn(setup, tmp_path)
    terminals.append(shell)
    shell.wait_for(PROMPT, timeout=30)
    shell.type(setup.slow_query + ";\r")
    assert seconds_shown(shell.wait_for(PROGRESS, timeout=20)) >= 1.0
    shell.type("\x03")
    pressed = time.monotonic()
    shell.wait_for(ERASE_LINE + b"query cancelled", timeout=CANCEL_WITHIN)  # the progress line is wiped first
    assert time.monotonic() - pressed < CANCEL_WITHIN
    shell.wait_for(PROMPT, timeout=10)
    shell.type(f"SELECT count(*) AS small FROM {setup.table} WHERE x < 7;\r")
    shell.wait_for(re.compile(rb"\| small\s*\|[\s\S]*\| 7\s*\|"), timeout=20)  # the shell runs queries again
    shell.wait_for(PROMPT, timeout=10)
    shell.type("\\q\r")
    assert shell.exit_code(timeout=15) == 0, shell.text
    assert "Traceback" not in shell.text and "error" not in shell.text


def _table_requests(log: str, table: str) -> int:
    namespace, name = table.split(".")
    return log.count(f"/namespaces/{namespace}/tables/{name}")


def test_progress_shows_on_a_tty_only(
    setup: Setup, catalog_server: CatalogServer, tmp_path: Path, terminals: list[Terminal]
) -> None:
    on_tty = spawn(setup, tmp_path, "-e", setup.slow_query)
    terminals.append(on_tty)
    started = time.monotonic()
    assert seconds_shown(on_tty.wait_for(PROGRESS, timeout=30)) >= 1.0
    until_progress = time.monotonic() - started
    on_tty.type("\x03")
    on_tty.wait_for(ERASE_LINE + b"sqe: query cancelled", timeout=CANCEL_WITHIN)
    assert on_tty.exit_code(timeout=10) == 130, on_tty.text

    # The same command with stderr in a file: past the point where the TTY run showed progress, nothing on stderr.
    stderr_path = tmp_path / "stderr"
    before = _table_requests(catalog_server.settled_log_text(), setup.table)
    with stderr_path.open("wb") as stderr:
        off_tty = spawn(setup, tmp_path, "-e", setup.slow_query, stderr=stderr)
    terminals.append(off_tty)
    # Its statement has begun once it asked the catalog for the table (a slower start-up must not shorten the wait).
    wait_until(lambda: _table_requests(catalog_server.log_text(), setup.table) > before, "the query never began")
    time.sleep(until_progress + 2.0)
    assert off_tty.proc.poll() is None and stderr_path.read_bytes() == b""
    off_tty.type("\x03")
    assert off_tty.exit_code(timeout=CANCEL_WITHIN + 5) == 130
    assert stderr_path.read_text() == "sqe: query cancelled\n"  # the only line: no progress frame before it
    assert b"\r[" not in off_tty.seen


def test_history_keeps_no_statement_naming_a_secret(setup: Setup, tmp_path: Path, terminals: list[Terminal]) -> None:
    """A statement with keys in clear, typed over two lines, stays out of the history file; the file is the
    user's only, even when it existed before with wider permissions."""
    history = tmp_path / "history"
    history.write_text("SELECT 'older' AS kept;\n")
    history.chmod(0o644)
    shell = spawn(setup, tmp_path)
    terminals.append(shell)
    shell.wait_for(PROMPT, timeout=30)
    shell.type(f"SELECT count(*) AS n FROM {setup.table} WHERE x < 3;\r")
    shell.wait_for(PROMPT, timeout=20)
    shell.type("CREATE EXTERNAL TABLE ext.leak (id BIGINT) STORED AS PARQUET LOCATION 's3://nowhere/leak'\r")
    shell.wait_for(b"...> ", timeout=10)
    shell.type("  WITH (access_key_id = 'AKIDLEAK', secret_access_key = 'HUSH-HUSH-KEY');\r")
    shell.wait_for(PROMPT, timeout=20)
    shell.type("SET password_of_mine = 'HUSH-HUSH-PASSWORD';\r")
    shell.wait_for(PROMPT, timeout=20)
    shell.type("\\q\r")
    assert shell.exit_code(timeout=15) == 0, shell.text
    kept = history.read_text()
    assert "SELECT 'older' AS kept;" in kept and f"FROM {setup.table} WHERE x < 3;" in kept
    assert "HUSH-HUSH" not in kept and "AKIDLEAK" not in kept and "ext.leak" not in kept
    assert history.stat().st_mode & 0o777 == 0o600


def test_ctrl_c_while_a_result_is_written_stops_it_not_the_shell(
    setup: Setup, tmp_path: Path, terminals: list[Terminal]
) -> None:
    shell = spawn(setup, tmp_path)
    terminals.append(shell)
    shell.wait_for(PROMPT, timeout=30)
    shell.type("SELECT range AS n FROM range(2000000);\r")
    shell.wait_for(re.compile(rb"\| 1\d{4} +\|"), timeout=60)  # the rows are scrolling by (the query is done)
    shell.type("\x03")
    shell.wait_for(b"output cancelled", timeout=CANCEL_WITHIN)
    shell.wait_for(PROMPT, timeout=10)
    shell.type("SELECT 7 AS seven;\r")
    shell.wait_for(re.compile(rb"\| 7 +\|"), timeout=20)
    shell.type("\\q\r")
    assert shell.exit_code(timeout=15) == 0, shell.text[-2000:]
    assert "Traceback" not in shell.text
