"""The per-user mount stores of ``sqe serve`` on a real directory: their names, their move from the 64-bit names of
earlier versions, and the operator's listing and pruning by last use (file times set with ``os.utime``)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sqe.errors import SQEError
from sqe.server.mount_stores import (
    StoreHold,
    claim_store,
    describe,
    legacy_store_path,
    prune_stores,
    stale_stores,
    store_path,
    stores,
)

DAY = 86400.0


def _old_name(base: Path, user: str, authority: str) -> Path:
    """The name the code before this change gave the store (its formula, written out)."""
    digest = hashlib.sha256(f"{user}\0{authority}".encode()).hexdigest()[:16]
    return base.with_name(f"{base.stem}.{digest}.db")


def _store(path: Path, mounts: int, definition: str = "{}") -> Path:
    con = sqlite3.connect(path)
    with con:
        con.execute("CREATE TABLE external_tables (name TEXT PRIMARY KEY, definition TEXT, sealed_keys BLOB)")
        for n in range(mounts):
            con.execute("INSERT INTO external_tables VALUES (?, ?, NULL)", (f"ns.t{n:03}", definition))
    con.close()
    return path


def _claimed(base: Path, user: str, authority: str) -> StoreHold:
    hold = claim_store(base, user, authority)
    assert hold is not None
    return hold


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
    hold = _claimed(base, "user:alice", "roles")
    path = hold.path
    assert path == store_path(base, "user:alice", "roles") and not legacy.exists()
    assert [info.mounts for info in stores(base)] == [2]
    # a legacy file showing up beside an existing store (restored from a backup) never replaces it, nor is deleted
    _store(legacy, mounts=5)
    again = _claimed(base, "user:alice", "roles")
    assert again.path == path
    assert legacy.exists() and sorted(info.mounts or 0 for info in stores(base)) == [2, 5]
    hold.release()
    again.release()


def test_claiming_marks_the_store_as_used_and_listing_does_not(tmp_path: Path) -> None:
    base = tmp_path / "sqe-external-tables.db"
    path = _store(store_path(base, "user:alice", "roles"), mounts=1)
    _age(path, 40)
    assert [info.path for info in stale_stores(base, 30)] == [path]  # listing (and counting mounts) kept its time
    _claimed(base, "user:alice", "roles").release()
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
    assert {info.path for info in prune_stores(base, 30).removed} == {gone, legacy}
    assert used.exists() and unrelated.exists() and base.exists()
    assert not gone.exists() and not legacy.exists()


# ------------------------------------------------------------------------------------------ found by review


def test_a_store_a_session_holds_is_never_pruned_however_old_and_is_once_let_go(tmp_path: Path) -> None:
    """Found by review: the prune checked a store's age, then deleted it; an owner coming back in between (marking
    it as used, reading it) lost every mount. A session now holds a shared lock on its store and a prune deletes
    only what it can lock exclusively, re-reading the age under that lock."""
    base = tmp_path / "sqe-external-tables.db"
    path = _store(store_path(base, "user:alice", "roles"), mounts=2)
    hold = _claimed(base, "user:alice", "roles")
    second = _claimed(base, "user:alice", "roles")  # another client session of hers: one lock, two holders
    _age(path, 40)  # what a prune saw the instant before her session marked it
    pruned = prune_stores(base, 30)
    assert (pruned.removed, pruned.in_use) == ([], 1) and path.exists()
    hold.release()
    assert prune_stores(base, 30).in_use == 1  # her other session still holds it
    second.release()
    second.release()  # letting go twice is once
    assert [info.path for info in prune_stores(base, 30).removed] == [path] and not path.exists()


_CRASHING_WRITER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA cache_size = 10")  # a small cache: the transaction's pages spill into the file before commit
con.execute("BEGIN")
con.execute("UPDATE external_tables SET definition = 'uncommitted'")
for n in range(2000):
    con.execute("INSERT INTO external_tables VALUES (?, ?, NULL)", (f"uncommitted.t{n}", "x" * 2000))
print("written", flush=True)
time.sleep(600)
"""


def test_a_legacy_store_a_crash_left_mid_transaction_moves_with_its_transaction_rolled_back(tmp_path: Path) -> None:
    """Found by review: the move linked the store to its new name but left its hot journal (``-journal``) under the
    old one, where SQLite no longer looks: the store then read with half a transaction written (rows never
    committed, or a malformed file). The move now lets SQLite roll the journal back where it is, first."""
    base = tmp_path / "sqe-external-tables.db"
    legacy = _store(legacy_store_path(base, "user:alice", "roles"), mounts=200, definition="{}" + " " * 2000)
    writer = subprocess.Popen([sys.executable, "-c", _CRASHING_WRITER, str(legacy)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "written"
    finally:
        writer.kill()  # a crash: no commit, no rollback
        writer.wait()
    assert Path(f"{legacy}-journal").stat().st_size > 0  # a hot journal, as a crash leaves it

    hold = _claimed(base, "user:alice", "roles")
    try:
        con = sqlite3.connect(hold.path)
        try:
            assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            rows = con.execute(
                "SELECT count(*), count(*) FILTER (WHERE definition = 'uncommitted') FROM external_tables"
            )
            assert rows.fetchone() == (200, 0)  # the committed mounts, none as the crashed transaction left them
        finally:
            con.close()
        assert not legacy.exists() and not Path(f"{legacy}-journal").exists()
    finally:
        hold.release()


def test_listing_and_pruning_touch_only_regular_files_named_exactly_as_stores(tmp_path: Path) -> None:
    """Found by review: anything named ``<stem>.<16 to 64 hex>.db`` counted as a store and was followed: a
    directory of such a name made the prune fail with a traceback (after deleting some stores), a symlink was
    followed to read its target and then deleted, and names of 17 to 63 hex digits (no store's) were deleted too."""
    base = tmp_path / "stores" / "sqe-external-tables.db"
    base.parent.mkdir()
    elsewhere = _store(tmp_path / "precious.db", mounts=1)
    stale = _store(store_path(base, "user:alice", "gone"), mounts=1)
    between = _store(base.with_name(f"{base.stem}.{'a' * 32}.db"), mounts=1)
    linked = base.with_name(f"{base.stem}.{'b' * 64}.db")
    linked.symlink_to(elsewhere)
    directory = base.with_name(f"{base.stem}.{'c' * 64}.db")
    directory.mkdir()
    for path in (elsewhere, stale, between, directory):
        _age(path, 40)

    assert [info.path for info in stores(base)] == [stale]
    assert [info.path for info in prune_stores(base, 30).removed] == [stale]
    assert not stale.exists()
    assert between.exists() and linked.is_symlink() and directory.is_dir() and elsewhere.exists()


def test_a_store_under_its_64_bit_name_is_listed_as_such_whatever_the_base_name(tmp_path: Path) -> None:
    """Found by review: the listing told a 64-bit name by the last dotted part of the file's stem, which for a base
    path without a suffix (``stores``) is the base name itself: no store was ever shown as an earlier version's."""
    now = time.time()
    for base in (tmp_path / "plain" / "stores", tmp_path / "dotted" / "sqe-external-tables.db"):
        base.parent.mkdir()
        _store(legacy_store_path(base, "user:bob", "roles"), mounts=1)
        _store(store_path(base, "user:bob", "roles"), mounts=1)
        listed = {info.path.name: describe(info, now) for info in stores(base)}
        assert sum("64-bit name of an earlier version" in line for line in listed.values()) == 1
        assert "earlier version" in listed[legacy_store_path(base, "user:bob", "roles").name]


def test_a_legacy_file_that_is_no_store_is_not_moved_and_the_call_fails_cleanly(tmp_path: Path) -> None:
    """A file under the 64-bit name that SQLite cannot read is left where it is (a typed error, no traceback), and
    no descriptor is left open on it (one per failed call would run the server out of them)."""
    base = tmp_path / "sqe-external-tables.db"
    legacy = legacy_store_path(base, "user:alice", "roles")
    legacy.write_bytes(b"not a database, but long enough to be read as a header by SQLite" * 64)
    for _ in range(3):
        with pytest.raises(SQEError, match="cannot move an external-table store to its new name"):
            claim_store(base, "user:alice", "roles")
    assert legacy.exists() and not store_path(base, "user:alice", "roles").exists()
    assert str(legacy) not in _open_files()


def _open_files() -> set[str]:
    """What this process has open (Linux), by path."""
    opened = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the directory listing's own descriptor, closed since
            opened.add(os.readlink(f"/proc/self/fd/{fd}"))
    return opened
