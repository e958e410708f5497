"""Every way the ``sqe`` program ends on bad input or a lost reader is one line on stderr, never a traceback.

Each case runs the real program (``python -m sqe.cli``) in a subprocess. The config names a catalog on a closed
port: the statements read no table, so no catalog call is made.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('[catalog]\nuri = "http://127.0.0.1:9"\nwarehouse = "wh"\nclient_id = "u"\nclient_secret = "s"\n')
    path.chmod(0o600)  # it holds a secret: readable by others, it would be warned about
    return path


def _sqe(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqe.cli", *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_an_output_file_that_cannot_be_written_is_one_error_line(tmp_path: Path, config: Path, fmt: str) -> None:
    for target in (tmp_path / "missing" / "out.file", tmp_path):  # a missing directory, a directory
        done = _sqe(tmp_path, "-c", str(config), "-e", "SELECT 1 AS one", "-f", fmt, "-o", str(target))
        assert done.returncode == 1
        assert "Traceback" not in done.stderr
        [line] = done.stderr.strip().splitlines()
        assert line.startswith(f"sqe: error: cannot write {target}: ")


@pytest.mark.parametrize(
    ("fmt", "first_line"), [("csv", b"range"), ("json", b'{"range": 0}'), ("table", b"+--------+")]
)
def test_a_reader_that_goes_away_ends_the_program_quietly(
    tmp_path: Path, config: Path, fmt: str, first_line: bytes
) -> None:
    """``sqe -e ... | head -1``: the closed pipe stops the program as SIGPIPE would, with nothing on stderr. The
    table format is one text of megabytes here, written while the reader goes away."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sqe.cli", "-c", str(config), "-e", "SELECT * FROM range(300000)", "-f", fmt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().rstrip() == first_line
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert stderr == ""


def _in_main(pid: int) -> bool:
    """The program's ``main`` runs: its first import of the engine (DuckDB, opened ahead) is mapped."""
    return "duckdb" in Path(f"/proc/{pid}/maps").read_text()


def test_ctrl_c_while_starting_up_is_one_line_not_a_traceback(tmp_path: Path, config: Path) -> None:
    """The Ctrl-C lands while the program still imports the engine (should it land in the query, that is
    handled too)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sqe.cli", "-c", str(config), "-e", "SELECT count(*) FROM range(10000000000)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 30
    while not _in_main(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr in ("sqe: cancelled\n", "sqe: query cancelled\n"), stderr


def test_a_config_holding_a_secret_that_others_may_read_is_warned_about(tmp_path: Path, config: Path) -> None:
    config.write_text(config.read_text().replace('"s"', '"TOP-SECRET-VALUE"'))
    assert _sqe(tmp_path, "-c", str(config), "-e", "SELECT 1 AS one").stderr == ""  # 0600: nothing to say
    config.chmod(0o644)
    done = _sqe(tmp_path, "-c", str(config), "-e", "SELECT 1 AS one")
    assert done.returncode == 0 and "| 1   |" in done.stdout
    [line] = done.stderr.splitlines()
    assert f"{config} holds catalog.client_secret but other users may read it (mode 644): chmod 600" in line
    assert "TOP-SECRET-VALUE" not in line


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serve", "--config", "x\x1b[2J.toml"], "sqe serve: error: config file not found: x\\x1b[2J.toml"),
        (
            ["stack", "status", "--dir", "x\x1b[2J"],
            "sqe stack status: no stack in {tmp}/x\\x1b[2J (stack.json not found)",
        ),
    ],
)
def test_subcommand_errors_escape_control_characters(tmp_path: Path, argv: list[str], expected: str) -> None:
    done = _sqe(tmp_path, *argv)
    assert done.returncode == 1
    assert done.stderr == expected.format(tmp=tmp_path) + "\n"


@pytest.fixture
def not_tls_port() -> Iterator[int]:
    """A loopback port whose listener answers every connection in plain text, so a TLS handshake fails there."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_a_failed_tls_handshake_with_the_server_is_one_error_line(
    tmp_path: Path, config: Path, not_tls_port: int
) -> None:
    """gRPC logged the handshake's failure at INFO on stderr (two lines) ahead of sqe's own error."""
    env = {name: value for name, value in os.environ.items() if name != "GRPC_VERBOSITY"}
    location = f"grpc+tls://127.0.0.1:{not_tls_port}"
    done = subprocess.run(
        [sys.executable, "-m", "sqe.cli", "--server", location, "-c", str(config), "-e", "SELECT 1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"sqe: error: cannot reach the SQE server at {location}: ")
