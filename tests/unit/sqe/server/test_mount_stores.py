"""The per-user mount stores of ``sqe serve`` on a real directory: their names, their move from the 64-bit names of
earlier versions, and the operator's listing and pruning by last use (file times set with ``os.utime``)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from pathlib import Path

import pytest

from sqe.errors import SQEError
from sqe.server.mount_stores import claim_store, legacy_store_path, prune_stores, stale_stores, store_path, stores

DAY = 86400.0


def _old_name(base: Path, user: str, authority: str) -> Path:
    """The name the code before this change gave the store (its formula, written out)."""
    digest = hashlib.sha256(f"{user}\0{authority}".encode()).hexdigest()[:16]
    return base.with_name(f"{base.stem}.{digest}.db")


def _store(path: Path, mounts: int) -> Path:
    con = sqlite3.connect(path)
    with con:
        con.execute("CREATE TABLE external_tables (name TEXT PRIMARY KEY, definition TEXT, sealed_keys BLOB)")
        for n in range(mounts):
            con.execute("INSERT INTO external_tables VALUES (?, '{}', NULL)", (f"ns.t{n}",))
    con.close()
    return path


def _age(path: Path, days: float) -> None:
    then = time.time() - days * DAY
    os.utime(path, (then, then))


def test_store_names_hold_a_whole_digest_and_legacy_names_are_the_old_ones(tmp_path: Path) -> None:
    base = tmp_path / "sqe-external-tables.db"
    digest = store_path(base, "user:alice", "roles").name.split(".")[1]
    assert len(bytes.fromhex(digest)) == 32
    assert legacy_store_path(base, "user:alice", "roles") == _old_name(base, "user:alice", "roles")
    # a user known by an opaque token was keyed by 16 hex digits of its digest then, by the whole digest now
    token_digest = hashlib.sha256(b"opaque").hexdigest()
    legacy = legacy_store_path(base, f"token:{token_digest}", "roles")
    assert legacy == _old_name(base, f"token:{token_digest[:16]}", "roles")


def test_a_legacy_store_moves_to_its_new_name_once_and_never_over_a_newer_one(tmp_path: Path) -> None:
    base = tmp_path / "sqe-external-tables.db"
    legacy = _store(legacy_store_path(base, "user:alice", "roles"), mounts=2)
    path = claim_store(base, "user:alice", "roles")
    assert path == store_path(base, "user:alice", "roles") and not legacy.exists()
    assert [info.mounts for info in stores(base)] == [2]
    # a legacy file showing up beside an existing store (restored from a backup) never replaces it, nor is deleted
    _store(legacy, mounts=5)
    assert claim_store(base, "user:alice", "roles") == path
    assert legacy.exists() and sorted(info.mounts or 0 for info in stores(base)) == [2, 5]


def test_claiming_marks_the_store_as_used_and_listing_does_not(tmp_path: Path) -> None:
    base = tmp_path / "sqe-external-tables.db"
    path = _store(store_path(base, "user:alice", "roles"), mounts=1)
    _age(path, 40)
    assert [info.path for info in stale_stores(base, 30)] == [path]  # listing (and counting mounts) kept its time
    claim_store(base, "user:alice", "roles")
    assert stale_stores(base, 30) == []


def test_pruning_removes_only_stores_unused_for_the_span(tmp_path: Path) -> None:
    base = tmp_path / "sqe-external-tables.db"
    used = _store(store_path(base, "user:alice", "roles"), mounts=1)
    gone = _store(store_path(base, "user:alice", "rotated secret"), mounts=1)
    legacy = _store(legacy_store_path(base, "user:bob", "roles"), mounts=3)
    unrelated = _store(tmp_path / "sqe-external-tables.backup.db", mounts=1)  # not a per-user store's name
    _store(base, mounts=1)  # the base file itself (the engine's own store) is not a per-user store
    for path in (gone, legacy, unrelated, base):
        _age(path, 40)
    _age(used, 2)
    with pytest.raises(SQEError, match="at least 1"):
        prune_stores(base, 0.5)
    assert {info.path for info in prune_stores(base, 30)} == {gone, legacy}
    assert used.exists() and unrelated.exists() and base.exists()
    assert not gone.exists() and not legacy.exists()
