"""The per-user external-table (mount) stores of ``sqe serve``: their names, their upgrade, their upkeep.

Beside ``[external_tables] path`` (say ``sqe-external-tables.db``) each (user, authority) has a SQLite store of its
own, ``sqe-external-tables.<digest>.db``, the digest being :func:`~sqe.server.identity.identity_digest` of the user
key and the authority. Earlier versions named it by 16 hex digits (64 bits, which two owners could share): the first
time its owner comes back, such a store is moved to its new name (:func:`claim_store`), once and atomically.

The server marks a store as used (its modification time) when a client session first uses it and then at most once
an hour while it does, so an operator can tell stores of authorities that are gone (a rotated secret, an opaque token
re-issued: nothing reads them again) by when they were last used: :func:`stale_stores`, which ``sqe serve
--list-external-stores`` shows and ``--prune-external-stores DAYS`` removes. Nothing is deleted by the server itself.

Age alone cannot keep a prune off a store in use: an owner coming back between the prune's check and its unlink
would lose every mount. So a client session holds its store (:class:`StoreHold`: a shared ``flock`` on the file)
while it lives, and a prune deletes only a store it can lock exclusively, re-reading its age under that lock. Only
regular files named exactly as stores are listed or pruned; a symlink is never followed.

File names are digests of digests; no token, authority or user key is ever logged or shown.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import hashlib
import logging
import os
import re
import sqlite3
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sqe._text import counted, iso_utc
from sqe.errors import SQEError
from sqe.server.identity import identity_digest

log = logging.getLogger(__name__)

_LEGACY_DIGITS = 16  # hex digits of a store name before 128-bit names (its digest was 64 bits)
_DIGEST = re.compile(r"[0-9a-f]{16}|[0-9a-f]{64}")  # a store name's digest: legacy or whole, nothing between
MARK_INTERVAL_SECONDS = 3600.0  # how often a client session in use marks its store as used again
MIN_PRUNE_DAYS = 1.0  # a store in use is marked at least hourly: pruning what went unused for a day spares it
_DAY = 86400.0


def store_path(base: str | Path, user: str, authority: str) -> Path:
    """The store of ``user`` under ``authority`` beside ``base`` (``[external_tables] path``)."""
    return _named(Path(base), identity_digest(f"{user}\0{authority}"))


def legacy_store_path(base: str | Path, user: str, authority: str) -> Path:
    """The name earlier versions gave that store: 16 hex digits of SHA-256 over the user key of then, which for a
    user known only by an opaque token held 16 hex digits of the token's digest (now it holds the whole digest)."""
    then = f"token:{user[6:22]}" if user.startswith("token:") else user
    return _named(Path(base), hashlib.sha256(f"{then}\0{authority}".encode()).hexdigest()[:_LEGACY_DIGITS])


def _named(base: Path, digest: str) -> Path:
    return base.with_name(f"{base.stem}.{digest}{base.suffix}")


@dataclass
class _Held:
    fd: int  # open on the store's file, with a shared flock on it
    holders: int


# The stores this process holds, by path: one descriptor each, closed only when its last holder lets go. Closing a
# descriptor on a SQLite file drops every POSIX lock this process holds on it (SQLite's own, under a connection in
# use), so a store in use is never opened and closed again here, only when no session of this process uses it.
_HELD: dict[Path, _Held] = {}
_HELD_LOCK = threading.Lock()
_CLAIM_ATTEMPTS = 8  # each lost race is another process's move or prune of this store finishing


class StoreHold:
    """A client session's hold on its store: a shared advisory lock (``flock``) on the store file for as long as the
    session uses it. A prune takes an exclusive lock before it deletes a store and skips one it cannot lock, so a
    store is never deleted under a session using it, however old its modification time. Locks are per open file
    (not POSIX record locks), so they neither touch nor are touched by SQLite's own locks on the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._released = False

    def __repr__(self) -> str:
        return f"StoreHold({self.path.name!r}, released={self._released})"

    def mark_used(self) -> None:
        """Set the store's modification time to now: its last use, which listing and pruning go by."""
        try:
            os.utime(self.path)
        except OSError as exc:  # a read-only directory: the store still serves, only its use goes unmarked
            log.warning("cannot mark an external-table store as used: %s", exc.strerror or type(exc).__name__)

    def release(self) -> None:
        """Let go (once); the lock goes with the last hold of this process on the store."""
        with _HELD_LOCK:
            if self._released:
                return
            self._released = True
            held = _HELD[self.path]
            held.holders -= 1
            if held.holders == 0:
                del _HELD[self.path]
                os.close(held.fd)


def claim_store(base: str | Path, user: str, authority: str) -> StoreHold | None:
    """Hold the owner's store (moved from its legacy name first when only that exists) and mark it as used now;
    None when the owner has no store yet (the first CREATE EXTERNAL TABLE makes it: claim again after)."""
    path = store_path(base, user, authority)
    with _HELD_LOCK:  # one claim at a time in this process: a second descriptor on a store would break its locks
        held = _HELD.get(path)
        if held is None:
            fd = _hold_shared(path, legacy_store_path(base, user, authority))
            if fd is None:
                return None
            held = _HELD[path] = _Held(fd, 0)
        held.holders += 1
    hold = StoreHold(path)
    hold.mark_used()
    return hold


def _hold_shared(path: Path, legacy: Path) -> int | None:
    """A descriptor holding a shared lock on the store at ``path``, moved from ``legacy`` first when only that
    exists; None when neither exists."""
    for _ in range(_CLAIM_ATTEMPTS):
        fd = _locked_shared(path)
        if fd is not None:
            return fd
        fd = _locked_shared(legacy)
        if fd is None:
            if path.exists():
                continue  # made or moved here meanwhile: lock it
            return None
        try:
            moved = _moved(fd, legacy, path)
        except BaseException:
            os.close(fd)
            raise
        if moved:
            return fd
        os.close(fd)  # not moved by us (moved or made by another process): lock it under its new name
    raise SQEError("cannot take hold of an external-table store: it keeps being moved or removed meanwhile")


def _locked_shared(path: Path) -> int | None:
    """``path`` opened and share-locked; None when absent, or removed or replaced before the lock was had."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SQEError(f"cannot open the external-table store: {exc.strerror}") from None
    try:
        _lock_shared(fd)
        if _same_file(fd, path):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)  # pruned (or replaced) between our open and our lock: what is there now is another file
    return None


def _lock_shared(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a prune checks and deletes this very file
    except OSError as exc:  # a filesystem without flock: a prune cannot lock the store either, so never deletes it
        log.warning("cannot lock an external-table store: %s", exc.strerror or type(exc).__name__)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed nor replaced since it was opened)."""
    opened = os.fstat(fd)
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


def _moved(fd: int, legacy: Path, path: Path) -> bool:
    """Move the share-locked ``legacy`` to ``path`` when ``path`` does not exist yet; whether it moved.

    A hard link then an unlink: the link fails when ``path`` exists (a store made meanwhile is never replaced) and
    when ``legacy`` is gone (another process moved it), so the move happens once, and the store is never missing
    from both names. A filesystem without hard links gets a rename, which only runs when ``path`` does not exist.
    The lock stays on the file under its new name, so a prune never deletes it halfway.
    """
    if path.exists():
        return False  # moved or made meanwhile
    _settle(legacy)
    try:
        os.link(legacy, path)
    except (FileExistsError, FileNotFoundError):
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise SQEError(f"cannot move an external-table store to its new name: {exc.strerror}") from None
        return _renamed_unless_present(legacy, path)
    if _same_file(fd, legacy):
        legacy.unlink(missing_ok=True)
    log.info("moved an external-table store from its 64-bit name to its new one")
    return True


def _settle(legacy: Path) -> None:
    """Finish what a crash left of a transaction on ``legacy`` under its own name, before it moves.

    SQLite finds a hot journal (``-journal``) by the database's file name: one left beside the old name would not
    be found under the new one, and the store would read with half a transaction written (or as malformed).
    Reading it rolls the journal back where it is (stores are never in WAL mode: nothing here sets it)."""
    try:
        con = sqlite3.connect(legacy)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            con.close()
    except sqlite3.Error as exc:  # locked by a writer, or not a store: the call fails rather than lose the mounts
        raise SQEError(f"cannot move an external-table store to its new name: {exc}") from None


def _renamed_unless_present(legacy: Path, path: Path) -> bool:
    if path.exists():
        return False
    try:
        os.rename(legacy, path)
    except FileNotFoundError:
        return False
    return True


@dataclass(frozen=True)
class StoreInfo:
    """One store beside the base path: its file, when it was last used (epoch seconds) and how many mounts."""

    path: Path
    last_used: float
    mounts: int | None  # None: the file does not read as a store
    legacy: bool = False  # named by 16 hex digits, as versions before whole digests named stores


def stores(base: str | Path) -> list[StoreInfo]:
    """Every per-user store beside ``base``, least recently used first: regular files named exactly as a store is
    (a symlink, a directory or a pipe of such a name is left alone, never followed nor opened)."""
    base = Path(base)
    found = []
    for path in base.parent.glob(f"{_glob_escape(base.stem)}.*{_glob_escape(base.suffix)}"):
        digest = path.name[len(base.stem) + 1 : len(path.name) - len(base.suffix)]
        if not _DIGEST.fullmatch(digest):
            continue
        try:
            status = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(status.st_mode):
            found.append(StoreInfo(path, status.st_mtime, _mounts(path), legacy=len(digest) == _LEGACY_DIGITS))
    return sorted(found, key=lambda info: (info.last_used, info.path.name))


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _mounts(path: Path) -> int | None:
    """The number of mounts in ``path``, read only (its modification time stays its last use)."""
    try:
        con = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
        try:
            return int(con.execute("SELECT count(*) FROM external_tables").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return None


def stale_stores(base: str | Path, days: float, now: float | None = None) -> list[StoreInfo]:
    """The stores not used for ``days`` days or more."""
    cutoff = _cutoff(days, now)
    return [info for info in stores(base) if info.last_used <= cutoff]


def _cutoff(days: float, now: float | None) -> float:
    return (time.time() if now is None else now) - days * _DAY


@dataclass(frozen=True)
class Pruned:
    """What a prune did: the stores it deleted, and how many it kept as a server's client session holds them."""

    removed: list[StoreInfo]
    in_use: int


def prune_stores(base: str | Path, days: float) -> Pruned:
    """Delete the stores not used for ``days`` days (at least :data:`MIN_PRUNE_DAYS`) that no session holds."""
    if not days >= MIN_PRUNE_DAYS:
        raise SQEError(
            f"--prune-external-stores takes a number of days of at least {MIN_PRUNE_DAYS:g} (a store in use is "
            f"marked as used every {MARK_INTERVAL_SECONDS / 3600:g} hour, so a shorter span could remove it)"
        )
    cutoff = _cutoff(days, None)
    removed, in_use = [], 0
    for info in stale_stores(base, days):
        outcome = _remove_unless_used(info.path, cutoff)
        if outcome is _Outcome.REMOVED:
            removed.append(info)
        in_use += outcome is _Outcome.IN_USE
    return Pruned(removed, in_use)


class _Outcome(enum.Enum):
    REMOVED = "removed"
    IN_USE = "in use"  # a client session holds it
    KEPT = "kept"  # used since it was listed, gone, or no longer a regular file


def _remove_unless_used(path: Path, cutoff: float) -> _Outcome:
    """Delete the store at ``path`` under an exclusive lock, when no session holds it and it is still unused
    since ``cutoff``: a session taking it meanwhile waits for the lock, then finds it gone (deleted before it was
    used) rather than losing it after it took it. A symlink is never followed, nor anything but a file opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # gone, or a symlink put there since it was listed
        return _Outcome.KEPT
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _Outcome.KEPT
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _Outcome.IN_USE
        except OSError:  # no flock here: whether a session holds it cannot be told, so it is kept
            return _Outcome.KEPT
        # under the lock: its age again (a session may have marked it and let go since it was listed)
        if not _same_file(fd, path) or os.fstat(fd).st_mtime > cutoff:
            return _Outcome.KEPT
        path.unlink()
        for side in _SIDE_FILES:  # what a crash left beside it: of no use without it
            Path(f"{path}{side}").unlink(missing_ok=True)
        return _Outcome.REMOVED
    finally:
        os.close(fd)


_SIDE_FILES = ("-journal", "-wal", "-shm")


def describe(info: StoreInfo, now: float) -> str:
    """One line of ``--list-external-stores``: file, last use, mounts (never an owner: names are digests)."""
    days = max(0.0, (now - info.last_used) / _DAY)
    mounts = "not readable as a store" if info.mounts is None else counted(info.mounts, "mount")
    legacy = ", 64-bit name of an earlier version (its owner has not come back since)" if info.legacy else ""
    return f"{info.path.name}  last used {iso_utc(info.last_used, zulu=True)} ({days:.1f} days ago), {mounts}{legacy}"
