"""A DuckDB peer process: DuckDB with its iceberg extension, run apart from the engine's own DuckDB.

The extension wheels exist only for DuckDB 1.5.5 while the engine runs a newer DuckDB, so the peer lives in its own
``pip install --target`` directory (``make duckdb-peer``: ``.venv/duckdb-peer``) and this script runs there as a
subprocess, started as ``python -s -S -P duckdb_peer.py`` with ``PYTHONPATH=<peer dir>``: no site-packages at all,
so only the peer's DuckDB and pyarrow can be imported. ``tests/interop/duckdb_client.py`` drives it; a bench can too.

Protocol: one JSON request per line on stdin, one JSON answer per line on stdout. A ``query`` answer in the ``arrow``
format is followed by ``arrow_bytes`` bytes of an Arrow IPC stream. Requests:

- ``{"op": "open", "extension_directory": ..., "attach": [...], "config": {...}}``: a fresh in-memory DuckDB with
  httpfs, avro and iceberg installed from the wheels' files (no downloads), each ``attach`` entry ATTACHed as a REST
  catalog with OAuth2 client credentials and vended credentials. An entry names the *environment variable* that
  holds its client secret (``client_secret_env``); the secret is never on the command line or in a request.
  Answers the DuckDB version, where it was imported from, and the extension files.
- ``{"op": "query", "sql": ..., "format": "arrow" | "json"}``: runs one statement; ``json`` answers
  ``columns`` and ``values`` (small results), ``arrow`` an IPC stream. Both carry ``rows`` and ``seconds``.
- ``{"op": "close"}``: answers and exits.

A failed request answers ``{"ok": false, "error": {"type": ..., "duckdb": ..., "message": ...}}``: ``type`` is
DuckDB's exception class when ``duckdb`` is true (else ``PeerRequestError``), and every client secret is scrubbed
from the text; the process and its connection stay usable.
"""

from __future__ import annotations

import importlib.resources
import io
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import IO, Any

import duckdb
import pyarrow as pa

# httpfs reads and writes S3, avro reads manifests, iceberg speaks REST: loaded in this order.
EXTENSIONS = ("httpfs", "avro", "iceberg")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SCRUBBED = "***"


class PeerRequestError(Exception):
    """A request the peer refuses before DuckDB sees it (malformed, unknown op, missing secret variable)."""


def extension_file(name: str) -> Path:
    """The ``.duckdb_extension`` file inside the installed ``duckdb_extension_<name>`` wheel."""
    folder = Path(str(importlib.resources.files(f"duckdb_extension_{name}") / "extensions"))
    return folder / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"


def sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def identifier(value: str) -> str:
    if not _IDENTIFIER.fullmatch(value):
        raise PeerRequestError(f"not a plain identifier: {value!r}")
    return value


class Peer:
    """One DuckDB connection at a time, and the client secrets it was given (to scrub them from errors)."""

    def __init__(self) -> None:
        self.connection: duckdb.DuckDBPyConnection | None = None
        # environment variable -> the secret read (and popped) from it, so that a re-``open`` attaches again
        self.secrets: dict[str, str] = {}

    def open(self, request: dict[str, Any]) -> dict[str, Any]:
        self.close()
        config = {
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
            "extension_directory": str(request["extension_directory"]),
            **{str(k): str(v) for k, v in request.get("config", {}).items()},
        }
        con = duckdb.connect(config=config)
        self.connection = con
        for name in EXTENSIONS:
            con.execute(f"INSTALL {sql_literal(str(extension_file(name)))}")
            con.execute(f"LOAD {name}")
        for entry in request.get("attach", []):
            self.attach(con, entry)
        return {
            "duckdb_version": duckdb.__version__,
            "duckdb_file": str(Path(duckdb.__file__).resolve()),
            "extensions": {name: str(extension_file(name)) for name in EXTENSIONS},
        }

    def attach(self, con: duckdb.DuckDBPyConnection, entry: dict[str, Any]) -> None:
        """``CREATE SECRET`` + ``ATTACH`` of one REST catalog: OAuth2 client credentials, vended S3 credentials."""
        alias = identifier(str(entry["alias"]))
        variable = str(entry["client_secret_env"])
        # popped: nothing loaded later (an extension reading the environment) sees it
        client_secret = os.environ.pop(variable, None) or self.secrets.get(variable)
        if not client_secret:
            raise PeerRequestError(f"environment variable {variable} (the client secret of {alias}) is not set")
        self.secrets[variable] = client_secret
        scope = str(entry.get("oauth2_scope", "PRINCIPAL_ROLE:ALL"))
        con.execute(
            f"CREATE OR REPLACE SECRET {alias}_oauth (TYPE iceberg, CLIENT_ID {sql_literal(str(entry['client_id']))}, "
            f"CLIENT_SECRET {sql_literal(client_secret)}, "
            f"OAUTH2_SERVER_URI {sql_literal(str(entry['oauth2_server_uri']))}, OAUTH2_SCOPE {sql_literal(scope)})"
        )
        con.execute(
            f"ATTACH {sql_literal(str(entry['warehouse']))} AS {alias} (TYPE iceberg, SECRET {alias}_oauth, "
            f"ENDPOINT {sql_literal(str(entry['endpoint']))}, ACCESS_DELEGATION_MODE 'vended_credentials', "
            "SUPPORT_NESTED_NAMESPACES true)"
        )

    def query(self, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        if self.connection is None:
            raise PeerRequestError("no open connection: send an open request first")
        started = time.perf_counter()
        con = self.connection.execute(str(request["sql"]))
        reader = con.to_arrow_reader() if hasattr(con, "to_arrow_reader") else con.fetch_record_batch()
        table = reader.read_all()
        seconds = time.perf_counter() - started
        answer: dict[str, Any] = {"rows": table.num_rows, "seconds": seconds}
        if request.get("format", "arrow") == "json":
            answer["columns"] = table.column_names
            answer["values"] = [list(row.values()) for row in table.to_pylist()]
            return answer, b""
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        payload = sink.getvalue()
        answer["arrow_bytes"] = len(payload)
        return answer, payload

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def scrub(self, text: str) -> str:
        for secret in self.secrets.values():
            text = text.replace(secret, _SCRUBBED)
        return text


def handle(peer: Peer, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    op = request.get("op")
    if op == "open":
        return peer.open(request), b""
    if op == "query":
        return peer.query(request)
    if op == "close":
        peer.close()
        return {}, b""
    raise PeerRequestError(f"unknown op {op!r}")


def error_answer(peer: Peer, error: Exception) -> dict[str, Any]:
    from_duckdb = isinstance(error, duckdb.Error)
    kind = type(error).__name__ if from_duckdb or isinstance(error, PeerRequestError) else "PeerRequestError"
    return {"ok": False, "error": {"type": kind, "duckdb": from_duckdb, "message": peer.scrub(str(error))}}


def serve(requests: IO[str], answers: IO[bytes]) -> None:
    peer = Peer()
    for line in requests:
        if not line.strip():
            continue
        payload = b""
        try:
            request = json.loads(line)
            answer, payload = handle(peer, request)
            answer = {"ok": True, **answer}
        except (duckdb.Error, PeerRequestError, KeyError, TypeError, ValueError) as error:
            answer, request = error_answer(peer, error), {}
        answers.write(json.dumps(answer, default=str).encode("utf-8") + b"\n" + payload)
        answers.flush()
        if request.get("op") == "close":
            return


def main() -> None:
    # The answers keep the real stdout; anything else printed (DuckDB, an extension) goes to stderr instead.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin, answers)


if __name__ == "__main__":
    main()
