"""The per-user external-table (mount) stores of ``sqe serve``: their names, their upgrade, their upkeep.

Beside ``[external_tables] path`` (say ``sqe-external-tables.db``) each (user, authority) has a SQLite store of its
own, ``sqe-external-tables.<digest>.db``, the digest being :func:`~sqe.server.identity.identity_digest` of the user
key and the authority. Earlier versions named it by 16 hex digits (64 bits, which two owners could share): the first
time its owner comes back, such a store is moved to its new name (:func:`claim_store`), once and atomically.

The server marks a store as used (its modification time) when a client session first uses it and then at most once
an hour while it does, so an operator can tell stores of authorities that are gone (a rotated secret, an opaque token
re-issued: nothing reads them again) by when they were last used: :func:`stale_stores`, which ``sqe serve
--list-external-stores`` shows and ``--prune-external-stores DAYS`` removes. Nothing is deleted by the server itself.

File names are digests of digests; no token, authority or user key is ever logged or shown.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from sqe._text import counted, iso_utc
from sqe.errors import SQEError
from sqe.server.identity import identity_digest

log = logging.getLogger(__name__)

_LEGACY_DIGITS = 16  # hex digits of a store name before 128-bit names (its digest was 64 bits)
_DIGEST = re.compile(r"[0-9a-f]{16,64}")
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


def claim_store(base: str | Path, user: str, authority: str) -> Path:
    """The owner's store, moved from its legacy name first when only that exists, and marked as used now."""
    path = store_path(base, user, authority)
    _adopt_legacy(legacy_store_path(base, user, authority), path)
    try:
        os.utime(path)
    except FileNotFoundError:
        pass  # no mount yet: the store is made by the first CREATE EXTERNAL TABLE
    except OSError as exc:  # a read-only directory: the store still serves, only its use goes unmarked
        log.warning("cannot mark an external-table store as used: %s", exc.strerror or type(exc).__name__)
    return path


def _adopt_legacy(legacy: Path, path: Path) -> None:
    """Move ``legacy`` to ``path`` when ``path`` does not exist yet.

    A hard link then an unlink: the link fails when ``path`` exists (a store made meanwhile is never replaced) and
    when ``legacy`` is gone (another thread moved it), so the move happens once, and the store is never missing
    from both names. A filesystem without hard links gets a rename, which only runs when ``path`` does not exist.
    """
    if path.exists() or not legacy.exists():
        return
    try:
        os.link(legacy, path)
    except (FileExistsError, FileNotFoundError):
        return  # made or moved by another thread meanwhile: nothing left to move
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise SQEError(f"cannot move an external-table store to its new name: {exc.strerror}") from None
        _rename_unless_present(legacy, path)
        return
    legacy.unlink(missing_ok=True)
    log.info("moved an external-table store from its 64-bit name to its new one")


def _rename_unless_present(legacy: Path, path: Path) -> None:
    if not path.exists():
        try:
            os.rename(legacy, path)
        except FileNotFoundError:
            return


@dataclass(frozen=True)
class StoreInfo:
    """One store beside the base path: its file, when it was last used (epoch seconds) and how many mounts."""

    path: Path
    last_used: float
    mounts: int | None  # None: the file does not read as a store

    @property
    def legacy(self) -> bool:
        return len(self.path.stem.rsplit(".", 1)[-1]) == _LEGACY_DIGITS


def stores(base: str | Path) -> list[StoreInfo]:
    """Every per-user store beside ``base``, least recently used first."""
    base = Path(base)
    found = []
    for path in base.parent.glob(f"{_glob_escape(base.stem)}.*{_glob_escape(base.suffix)}"):
        digest = path.name[len(base.stem) + 1 : len(path.name) - len(base.suffix)]
        if not _DIGEST.fullmatch(digest):
            continue
        try:
            last_used = path.stat().st_mtime
        except FileNotFoundError:
            continue
        found.append(StoreInfo(path, last_used, _mounts(path)))
    return sorted(found, key=lambda info: (info.last_used, info.path.name))


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _mounts(path: Path) -> int | None:
    """The number of mounts in ``path``, read only (its modification time stays its last use)."""
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            return int(con.execute("SELECT count(*) FROM external_tables").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return None


def stale_stores(base: str | Path, days: float, now: float | None = None) -> list[StoreInfo]:
    """The stores not used for ``days`` days or more."""
    cutoff = (time.time() if now is None else now) - days * _DAY
    return [info for info in stores(base) if info.last_used <= cutoff]


def prune_stores(base: str | Path, days: float) -> list[StoreInfo]:
    """Delete the stores not used for ``days`` days (at least :data:`MIN_PRUNE_DAYS`); the ones deleted."""
    if not days >= MIN_PRUNE_DAYS:
        raise SQEError(
            f"--prune-external-stores takes a number of days of at least {MIN_PRUNE_DAYS:g} (a store in use is "
            f"marked as used every {MARK_INTERVAL_SECONDS / 3600:g} hour, so a shorter span could remove it)"
        )
    removed = []
    for info in stale_stores(base, days):
        if _still_stale(info):  # marked as used since it was listed: a user came back
            info.path.unlink(missing_ok=True)
            Path(f"{info.path}-journal").unlink(missing_ok=True)
            removed.append(info)
    return removed


def _still_stale(info: StoreInfo) -> bool:
    try:
        return info.path.stat().st_mtime <= info.last_used
    except FileNotFoundError:
        return False


def describe(info: StoreInfo, now: float) -> str:
    """One line of ``--list-external-stores``: file, last use, mounts (never an owner: names are digests)."""
    days = max(0.0, (now - info.last_used) / _DAY)
    mounts = "not readable as a store" if info.mounts is None else counted(info.mounts, "mount")
    legacy = ", 64-bit name of an earlier version (its owner has not come back since)" if info.legacy else ""
    return f"{info.path.name}  last used {iso_utc(info.last_used, zulu=True)} ({days:.1f} days ago), {mounts}{legacy}"
