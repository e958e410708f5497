"""Definitions of Hive-style external tables, persisted in a small SQLite file (``[external_tables] path``).

A definition is its name, format, location, columns and partition columns, and where its keys come from:
- ``static``: the engine's ``[storage]`` pair (nothing stored);
- ``env``: the names of two environment variables read at query time (only the names are stored);
- ``sealed``: the mount's own keys, encrypted with Fernet (AES-128-CBC + HMAC-SHA256) under the key in the
  environment variable ``[external_tables] key_env``. Without that variable set, own keys are refused.
Keys are never stored, logged, shown or put in an error in clear; ``ExternalTable``'s repr leaves them out.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sqe._unpicklable import Unpicklable
from sqe.errors import ConfigError, QueryError

if TYPE_CHECKING:  # cryptography only when a mount's keys are sealed or unsealed (start-up cost)
    from cryptography.fernet import Fernet

KeySource = Literal["static", "env", "sealed"]
_SCHEMA = """CREATE TABLE IF NOT EXISTS external_tables (
    name TEXT PRIMARY KEY,
    definition TEXT NOT NULL,
    sealed_keys BLOB
)"""


@dataclass(frozen=True)
class MountKeys(Unpicklable):
    """A mount's own key pair, in memory only while a query reads it."""

    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    _pickle_refusal = "mount keys cannot be pickled"


@dataclass(frozen=True)
class ExternalTable:
    name: str  # warehouse.namespace.table
    file_format: str
    location: str
    columns: tuple[tuple[str, str], ...]  # (name, SQL type)
    partitions: tuple[tuple[str, str], ...]
    key_source: KeySource
    key_env: tuple[str, str] | None = None  # env: the variables holding access key id and secret
    options: Mapping[str, str] = field(default_factory=dict)  # non-secret format options (delim, header, ...)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": self.file_format,
                "location": self.location,
                "columns": self.columns,
                "partitions": self.partitions,
                "key_source": self.key_source,
                "key_env": self.key_env,
                "options": dict(self.options),
            }
        )

    @classmethod
    def from_json(cls, name: str, text: str) -> ExternalTable:
        data = json.loads(text)
        return cls(
            name=name,
            file_format=data["format"],
            location=data["location"],
            columns=tuple((str(n), str(t)) for n, t in data["columns"]),
            partitions=tuple((str(n), str(t)) for n, t in data["partitions"]),
            key_source=data["key_source"],
            key_env=(str(data["key_env"][0]), str(data["key_env"][1])) if data.get("key_env") else None,
            options=dict(data.get("options") or {}),
        )


class ExternalTableStore:
    """The definitions file. Opened lazily: nothing is created until the first CREATE EXTERNAL TABLE."""

    def __init__(self, path: str | Path, key_env: str) -> None:
        self.path = Path(path)
        self._key_env = key_env
        self._lock = threading.Lock()

    def _connect(self, *, create: bool) -> sqlite3.Connection | None:
        if not create and not self.path.exists():
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path)
        con.execute(_SCHEMA)
        if create:
            os.chmod(self.path, 0o600)
        return con

    def create(self, table: ExternalTable, keys: MountKeys | None, *, if_not_exists: bool = False) -> bool:
        """Store ``table``; own ``keys`` are sealed first. False when it existed and ``if_not_exists``."""
        sealed = self._seal(keys) if keys is not None else None
        with self._lock:
            con = self._connect(create=True)
            assert con is not None
            with con:
                exists = con.execute("SELECT 1 FROM external_tables WHERE name = ?", (table.name,)).fetchone()
                if exists:
                    if if_not_exists:
                        return False
                    raise QueryError(f"external table {table.name} already exists")
                con.execute(
                    "INSERT INTO external_tables (name, definition, sealed_keys) VALUES (?, ?, ?)",
                    (table.name, table.to_json(), sealed),
                )
            con.close()
        return True

    def drop(self, name: str) -> bool:
        with self._lock:
            con = self._connect(create=False)
            if con is None:
                return False
            with con:
                dropped = con.execute("DELETE FROM external_tables WHERE name = ?", (name,)).rowcount
            con.close()
        return bool(dropped)

    def get(self, name: str) -> ExternalTable | None:
        row = self._row(name)
        return ExternalTable.from_json(name, row[0]) if row is not None else None

    def all(self) -> list[ExternalTable]:
        with self._lock:
            con = self._connect(create=False)
            if con is None:
                return []
            rows = con.execute("SELECT name, definition FROM external_tables ORDER BY name").fetchall()
            con.close()
        return [ExternalTable.from_json(name, text) for name, text in rows]

    def names(self) -> set[str]:
        return {t.name.lower() for t in self.all()}

    def keys_of(self, table: ExternalTable) -> MountKeys | None:
        """The mount's own keys (None: it reads with the ``[storage]`` pair)."""
        if table.key_source == "static":
            return None
        if table.key_source == "env":
            assert table.key_env is not None
            key_id, secret = (os.environ.get(v) for v in table.key_env)
            if not key_id or not secret:
                raise QueryError(
                    f"external table {table.name} reads its keys from ${table.key_env[0]} and ${table.key_env[1]}, "
                    "which are not both set"
                )
            return MountKeys(key_id, secret)
        row = self._row(table.name)
        if row is None or row[1] is None:
            raise QueryError(f"external table {table.name} has no stored keys")
        return self._unseal(table.name, bytes(row[1]))

    def _row(self, name: str) -> tuple[str, bytes | None] | None:
        with self._lock:
            con = self._connect(create=False)
            if con is None:
                return None
            row = con.execute("SELECT definition, sealed_keys FROM external_tables WHERE name = ?", (name,)).fetchone()
            con.close()
        return (row[0], row[1]) if row is not None else None

    def _fernet(self) -> Fernet:
        from cryptography.fernet import Fernet

        value = os.environ.get(self._key_env)
        if not value:
            raise QueryError(
                f"a mount's own keys are stored encrypted: set ${self._key_env} (a Fernet key) or give the keys "
                "as environment variable names (access_key_id_env, secret_access_key_env)"
            )
        try:
            return Fernet(value.encode())
        except (ValueError, TypeError):
            raise ConfigError(f"${self._key_env} is not a Fernet key (32 bytes, urlsafe base64)") from None

    def _seal(self, keys: MountKeys) -> bytes:
        payload = json.dumps([keys.access_key_id, keys.secret_access_key, keys.session_token]).encode()
        return self._fernet().encrypt(payload)

    def _unseal(self, name: str, sealed: bytes) -> MountKeys:
        from cryptography.fernet import InvalidToken

        try:
            key_id, secret, token = json.loads(self._fernet().decrypt(sealed))
        except InvalidToken:
            raise QueryError(
                f"the stored keys of external table {name} cannot be decrypted with ${self._key_env}"
            ) from None
        return MountKeys(key_id, secret, token)
