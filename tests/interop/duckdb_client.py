"""DuckDB with its iceberg extension as a third-party client of ``sqe-catalog``, in its own environment.

The extension wheels (``duckdb-extension-{httpfs,avro,iceberg}``) exist only for DuckDB 1.5.5 and require exactly
it, while the engine runs its own (newer) DuckDB. So the peer is installed apart (``make duckdb-peer``, part of
``make test``: ``pip install --target .venv/duckdb-peer``) and driven here as a subprocess running
``tests/interop/duckdb_peer.py`` with only that directory importable. The engine's DuckDB never loads in the peer
and the peer's never loads in the test process. Client secrets reach the peer through its environment only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("duckdb_peer.py")
# A bench (or a developer) may point at another peer directory built the same way.
PEER_DIR_VARIABLE = "SQE_DUCKDB_PEER_DIR"
DEFAULT_PEER_DIR = REPO / ".venv" / "duckdb-peer"
MAKE_STEP = "make duckdb-peer"
# httpfs reads and writes S3, avro reads manifests, iceberg speaks REST (the peer loads them in this order).
EXTENSIONS = ("httpfs", "avro", "iceberg")
# what the peer process inherits: enough to run, no cloud credentials (it must use vended ones only)
_INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


class PeerEnvironmentMissing(RuntimeError):
    """The peer directory was never built: the message names the make step that builds it."""


class DuckPeerError(Exception):
    """A statement or request the DuckDB peer refused; ``kind`` is DuckDB's exception class (``CatalogException``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class DuckDBError(DuckPeerError):
    """DuckDB itself raised (the peer's ``duckdb.Error``): a catalog, binder, IO or not-implemented error."""


def peer_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The built peer directory (its ``.installed`` stamp exists), or :class:`PeerEnvironmentMissing`."""
    folder = Path(environ.get(PEER_DIR_VARIABLE) or DEFAULT_PEER_DIR)
    if not (folder / ".installed").is_file():
        raise PeerEnvironmentMissing(
            f"the DuckDB peer environment {folder} is not built: run `{MAKE_STEP}` (part of `make test`)"
        )
    return folder


@dataclass(frozen=True)
class CatalogAttach:
    """One REST catalog for the peer to ATTACH; the client secret travels in the peer's environment."""

    alias: str
    endpoint: str
    warehouse: str
    client_id: str
    client_secret: str
    oauth2_server_uri: str

    @property
    def secret_variable(self) -> str:
        return f"SQE_DUCKDB_PEER_SECRET_{self.alias.upper()}"

    def request(self) -> dict[str, str]:
        return {
            "alias": self.alias,
            "endpoint": self.endpoint,
            "warehouse": self.warehouse,
            "client_id": self.client_id,
            "client_secret_env": self.secret_variable,
            "oauth2_server_uri": self.oauth2_server_uri,
        }


def catalog_attach(server: CatalogServer, principal: CatalogPrincipal, alias: str = "lake") -> CatalogAttach:
    """The server's warehouse as ``alias``: OAuth2 client credentials, vended S3 credentials only."""
    return CatalogAttach(
        alias=alias,
        endpoint=server.url,
        warehouse=server.warehouse,
        client_id=principal.client_id,
        client_secret=principal.client_secret,
        oauth2_server_uri=f"{server.url}/v1/oauth/tokens",
    )


class DuckPeer:
    """A running peer process with one open DuckDB connection (extensions loaded, catalogs attached)."""

    def __init__(self, extension_directory: Path, attach: tuple[CatalogAttach, ...] = ()) -> None:
        folder = peer_dir()
        env = {name: os.environ[name] for name in _INHERITED if name in os.environ}
        env["PYTHONPATH"] = str(folder)
        env.update({entry.secret_variable: entry.client_secret for entry in attach})
        # -s -S: no user or venv site-packages (the engine's DuckDB); -P: not even this script's own folder
        self._process = subprocess.Popen(
            [sys.executable, "-s", "-S", "-P", str(RUNNER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.folder = folder
        try:
            self.info = self._call(
                {
                    "op": "open",
                    "extension_directory": str(extension_directory),
                    "attach": [entry.request() for entry in attach],
                }
            )[0]
        except BaseException:
            self.close()
            raise

    def execute(self, sql: str) -> pa.Table:
        """Runs one statement in the peer; its result as an Arrow table (DML answers a one-row ``Count``)."""
        _, payload = self._call({"op": "query", "sql": sql, "format": "arrow"})
        return pa.ipc.open_stream(payload).read_all()

    def rows(self, sql: str) -> list[dict[str, Any]]:
        return list(self.execute(sql).to_pylist())

    def one(self, sql: str) -> tuple[Any, ...]:
        """The first row of the result as a tuple (like a DB-API ``fetchone``)."""
        first = self.execute(sql).to_pylist()[0]
        return tuple(first.values())

    def _call(self, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps(request).encode("utf-8") + b"\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise DuckPeerError("PeerExited", f"the DuckDB peer exited with status {self._process.wait(timeout=30)}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            error = answer.get("error") or {}
            raised = DuckDBError if error.get("duckdb") else DuckPeerError
            raise raised(str(error.get("type", "PeerRequestError")), str(error.get("message", "")))
        payload = stdout.read(int(answer.get("arrow_bytes", 0)))
        return answer, payload

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                self._call({"op": "close"})
            except (DuckPeerError, OSError, ValueError):
                pass
            finally:
                if self._process.stdin is not None:
                    self._process.stdin.close()
                try:
                    self._process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait(timeout=30)
        if self._process.stdout is not None:
            self._process.stdout.close()

    def __enter__(self) -> DuckPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def offline_duckdb(extension_directory: Path, attach: tuple[CatalogAttach, ...] = ()) -> DuckPeer:
    """A peer DuckDB with httpfs, avro and iceberg installed from the wheels' files (no downloads), ``attach``ed."""
    return DuckPeer(extension_directory, attach)
