"""``sqe serve`` start-up failures end the process with one ``sqe serve: error:`` line, never a traceback.

The real program in a subprocess; the engine config names a catalog on a closed port (start-up calls none).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path


def _configs(tmp_path: Path, listen: str, extra: str = "", *, own_key: bool = False) -> Path:
    engine = tmp_path / "engine.toml"
    engine.write_text(
        '[catalog]\nuri = "http://127.0.0.1:9"\nwarehouse = "wh"\nclient_id = "u"\nclient_secret = "s"\n'
        f"{'' if own_key else 'require_vended_credentials = true'}\n"
    )
    server = tmp_path / "server.toml"
    server.write_text(f'[server]\nengine_config = "{engine}"\nlisten = "{listen}"\n{extra}')
    return server


def _serve(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqe.cli", "serve", *argv], capture_output=True, text=True, timeout=60, check=False
    )


def _error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "ArrowException" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


def test_a_port_in_use_is_one_error_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        line = _error_line(_serve("--config", str(_configs(tmp_path, listen))))
    assert line.startswith(f"sqe serve: error: cannot listen on {listen}"), line


def test_unusable_tls_material_is_one_error_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    config = _configs(tmp_path, "127.0.0.1:0", f'tls_cert = "{junk}"\ntls_key = "{junk}"\n')
    line = _error_line(_serve("--config", str(config)))
    assert line.startswith("sqe serve: error: cannot listen on 127.0.0.1:0"), line


def test_a_port_file_that_cannot_be_written_is_one_error_line(tmp_path: Path) -> None:
    port_file = tmp_path / "missing" / "port"
    line = _error_line(_serve("--config", str(_configs(tmp_path, "127.0.0.1:0")), "--port-file", str(port_file)))
    assert line.startswith(f"sqe serve: error: cannot write the port file {port_file}: "), line


def test_a_server_that_may_read_with_its_own_key_does_not_start(tmp_path: Path) -> None:
    """Found by review: without require_vended_credentials a file a table's manifests name outside the catalog's
    vended prefixes is read with the server's [storage] key (or ambient AWS credentials), so a user who may commit
    to some table could have the server read another table's files raw. Refused before anything is contacted."""
    line = _error_line(_serve("--config", str(_configs(tmp_path, "127.0.0.1:0", own_key=True))))
    assert line.startswith(
        "sqe serve: error: sqe serve reads for many users: its engine config must turn on [catalog] "
        "require_vended_credentials (without it"
    ), line
