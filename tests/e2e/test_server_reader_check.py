"""``sqe serve`` logs in as its reader identity once at start.

Found by review: a server with a wrong reader secret started and listened, and every user's first call then failed
with the catalog's refusal of the reader. Now a refused reader ends the start with one typed line naming the reader
client id (never its secret); a catalog that cannot be reached at start only warns (the reader logs in at the first
user's call). Real sqe-catalog, real ``sqe serve`` subprocess.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CatalogPrincipal, CatalogServer
from tests.e2e.test_server import _write_configs, start_server
from tests.helpers.processes import stop_child

pytestmark = [pytest.mark.e2e]

WRONG_SECRET = "not-the-readers-secret-5c1e"


def test_a_refused_reader_identity_fails_the_start_with_one_line_naming_the_reader(
    catalog_server: CatalogServer, catalog_reader: CatalogPrincipal, tmp_path: Path
) -> None:
    reader = {"reader_client_id": catalog_reader.client_id, "reader_client_secret": WRONG_SECRET}
    config = _write_configs(tmp_path, catalog_server, **reader)
    port_file = tmp_path / "port"
    command = [sys.executable, "-m", "sqe.cli", "serve", "--config", str(config), "--port-file", str(port_file)]
    # Before the fix the server ran on: the timeout ends that as a failure.
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    assert not port_file.exists()  # it never listened
    assert "Traceback" not in done.stderr
    assert WRONG_SECRET not in done.stderr and catalog_reader.client_secret not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    expected = "sqe serve: error: AuthenticationError: the catalog rejected the server's reader identity "
    assert line.startswith(f"{expected}{catalog_reader.client_id!r}"), line


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _log_of_a_start_against(
    catalog_uri: str, catalog_server: CatalogServer, reader: CatalogPrincipal, tmp_path: Path, **catalog: str
) -> str:
    """The log of a server with the right reader whose engine config names ``catalog_uri`` (plus ``catalog`` keys),
    started (it waits for the port) and stopped again."""
    secret = {"reader_client_id": reader.client_id, "reader_client_secret": reader.client_secret}
    config = _write_configs(tmp_path, catalog_server, **secret)
    engine = tmp_path / "engine.toml"
    text = engine.read_text(encoding="utf-8").replace(catalog_server.url, catalog_uri)
    extra = "".join(f"\n{key} = {value}" for key, value in catalog.items())
    engine.write_text(text.replace("[catalog]", f"[catalog]{extra}", 1), encoding="utf-8")
    proc, _ = start_server(tmp_path, config)
    try:
        return (tmp_path / "server.log").read_text(encoding="utf-8")
    finally:
        stop_child(proc)


def test_a_catalog_unreachable_at_start_only_warns_that_the_reader_is_unchecked(
    catalog_server: CatalogServer, catalog_reader: CatalogPrincipal, tmp_path: Path
) -> None:
    """The catalog may come up after the server (or be down for a moment): the server starts, says the reader is
    unchecked, and the reader logs in at the first user's call."""
    unreachable = f"http://127.0.0.1:{_closed_port()}"
    log = _log_of_a_start_against(unreachable, catalog_server, catalog_reader, tmp_path)
    assert f"cannot check the reader identity {catalog_reader.client_id!r} at start" in log, log[-2000:]
    assert catalog_reader.client_secret not in log


def test_a_catalog_that_never_answers_at_start_only_warns_after_its_request_timeout(
    catalog_server: CatalogServer, catalog_reader: CatalogPrincipal, tmp_path: Path
) -> None:
    """A catalog that takes the connection and never answers (a hung catalog, packets dropped on the way back)
    holds the start only for ``[catalog] request_timeout_seconds``: the server then starts and warns, as for an
    unreachable one, and the secret is in no line it wrote."""
    with socket.socket() as silent:  # listens (the kernel completes connects into its backlog), never reads
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        hung = f"http://127.0.0.1:{silent.getsockname()[1]}"
        log = _log_of_a_start_against(hung, catalog_server, catalog_reader, tmp_path, request_timeout_seconds="1")
    assert f"cannot check the reader identity {catalog_reader.client_id!r} at start" in log, log[-2000:]
    assert "ReadTimeout" in log, log[-2000:]
    assert catalog_reader.client_secret not in log
