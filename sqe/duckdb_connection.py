"""DuckDB connections locked down for SQE (see reference/libraries.md section 5), and identifier quoting.

No file system or network access, no extension installs or auto-loading, no replacement scans of Python
variables, and the configuration locked so no statement can undo any of it. Registered Arrow objects still work.
Each database spills into a directory of its own (:func:`_spill_directory`): DuckDB lets SQL read its temporary
directory whatever ``enable_external_access`` says (``read_blob``, ``glob``), so a shared one (DuckDB's default
``.tmp`` in the working directory) handed every ``sqe serve`` user the spilled rows of every other user's query.
Used by SQL sessions and by the restriction kernels' private hashing connection, so it sits below both
(``sqe.restrictions`` must not import ``sqe.execution``).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import duckdb

from sqe._text import first_line
from sqe.errors import QueryError, SQEError

__all__ = [
    "LOCKDOWN_CONFIG",
    "NO_DIRECTORY",
    "DatabaseLimits",
    "close_at_exit",
    "connect_locked_down",
    "fold_row",
    "open_ahead",
    "out_of_memory",
    "quote_ident",
    "quote_qualified",
    "spill_disk_free_bytes",
    "statement_type",
]

LOCKDOWN_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
}


_ahead_lock = threading.Lock()
_ahead: tuple[int, Future[duckdb.DuckDBPyConnection]] | None = None  # (pid that opened it, the opening)


def open_ahead() -> None:
    """Start opening the next database :func:`connect_locked_down` returns, on a background thread.

    Opening an in-memory database costs DuckDB 25-40 ms (its catalog of built-in functions, its thread pool), mostly
    without the GIL, so the ``sqe`` program has it opened while it imports the engine, instead of after.
    Only a program's own process calls this (``sqe.cli.run``), before its first connection: the database is the
    same as one opened on the spot (same configuration, then ``before_lock`` and the lock)."""
    global _ahead
    opening: Future[duckdb.DuckDBPyConnection] = Future()
    with _ahead_lock:
        if _ahead is not None:
            return
        _ahead = (os.getpid(), opening)
    threading.Thread(target=_open_into, args=(opening,), name="sqe-duckdb-open", daemon=True).start()


def _open_into(opening: Future[duckdb.DuckDBPyConnection]) -> None:
    try:
        opening.set_result(_open())
    except BaseException as exc:  # raised to the caller that takes it, as if it had opened the database itself
        opening.set_exception(exc)


def _open() -> duckdb.DuckDBPyConnection:
    # external access is turned off after opening, not by the opening's config: opened with it off, DuckDB allows
    # (and shows every user in ``allowed_paths``) the files ``<working directory>/:memory:*``
    opening = {k: v for k, v in LOCKDOWN_CONFIG.items() if k != "enable_external_access"}
    con = duckdb.connect(":memory:", config={**opening, "temp_directory": _spill_directory()})
    try:
        _hide_the_process_directories(con)
        con.execute("SET GLOBAL enable_external_access = false")
    except BaseException:
        con.close()
        raise
    return con


# Where DuckDB would keep what the lockdown never lets it use (extensions, persistent secrets), instead of under
# the home directory: ``duckdb_settings()``, ``current_setting()`` and DuckDB's errors show a ``sqe serve`` user
# no path of the server's account ($HOME).
NO_DIRECTORY = "/nonexistent"


def _hide_the_process_directories(con: duckdb.DuckDBPyConnection) -> None:
    for setting in ("home_directory", "secret_directory", "extension_directory"):
        con.execute(f"SET GLOBAL {setting} = '{NO_DIRECTORY}'")


_spill_lock = threading.Lock()


@dataclass(frozen=True)
class _SpillRoot:
    """The process's private directory of spill directories."""

    pid: int  # of the process that made it
    path: str  # its name
    fd: int | None  # the directory held open for the process's life, where the system names it by its descriptor
    given: str  # what databases are given: ``/proc/self/fd/<fd>`` (the directory itself), else ``path``


_spill_root: _SpillRoot | None = None
_spill_ids = itertools.count(1)


def _spill_directory() -> str:
    """A spill directory for one database alone: DuckDB creates it on the first spill and removes it when the
    database closes. It lies in a private (0700) directory of this process (:func:`_new_spill_root`), removed at
    exit, so no other account reads it and no other database of the process is allowed it. Databases are given it
    through its open descriptor (``/proc/self/fd/N``), not its name: were it removed while a database lives (a
    temporary-file cleaner) and another account's directory or a symlink put under the name, that database's spill
    fails instead of landing there (its name alone would lead into whatever the name holds then). The next database
    gets a new one, as it does whenever the name holds anything but the directory this process made. A forked
    child makes its own."""
    global _spill_root
    with _spill_lock:
        root = _spill_root
        if root is None or root.pid != os.getpid() or not _still_the_private_directory(root):
            path = _new_spill_root()
            fd, given = _held_open(path)
            root = _spill_root = _SpillRoot(os.getpid(), path, fd, given)
            atexit.register(_remove_spill_root, os.getpid(), path)
        return os.path.join(root.given, f"db-{next(_spill_ids)}")


def _still_the_private_directory(root: _SpillRoot) -> bool:
    if not _is_private_directory(root.path):
        return False
    return root.fd is None or os.path.samestat(os.lstat(root.path), os.fstat(root.fd))


def _held_open(path: str) -> tuple[int | None, str]:
    """The directory ``path`` open, and the name of it through the descriptor (Linux's ``/proc/self/fd``); where
    the system has no such name, no descriptor and ``path``. The descriptor is never closed: a database opened
    before keeps its name, which would lead to whatever file took the number next."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None, path
    given = f"/proc/self/fd/{fd}"
    try:
        held = os.fstat(fd)
        if os.path.samestat(os.stat(given), held) and os.path.samestat(os.lstat(path), held):
            return fd, given
    except OSError:
        pass
    os.close(fd)
    return None, path


def _is_private_directory(path: str) -> bool:
    """A directory itself (not a symlink to one), of this account, that no other account may enter."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def _new_spill_root() -> str:
    """In the working directory, where DuckDB's own default (``.tmp``) spilled: on the disk it spilled to before,
    where the system temporary directory may be held in memory. In the system temporary directory (``TMPDIR``)
    when the working directory takes no new directory, or when another account could rename the private
    directory away and put its own (or a symlink) under its name, where DuckDB would spill."""
    for parent in (os.getcwd, tempfile.gettempdir):
        with contextlib.suppress(OSError):
            place = parent()
            if _others_cannot_replace_entries(place):
                return tempfile.mkdtemp(prefix=".sqe-spill-" if parent is os.getcwd else "sqe-spill-", dir=place)
    raise SQEError(
        "no directory to spill into: neither the working directory nor the temporary directory (TMPDIR) takes a "
        "private directory that no other account can replace (writable by others without the sticky bit)"
    )


def _others_cannot_replace_entries(directory: str) -> bool:
    """No other account may rename or delete what this one makes in ``directory``: it is writable by no other
    account (a group other than the process's own counts as others), or sticky (``/tmp``)."""
    info = os.stat(directory)
    others_write = info.st_mode & stat.S_IWOTH or (info.st_mode & stat.S_IWGRP and info.st_gid != os.getegid())
    return not others_write or bool(info.st_mode & stat.S_ISVTX)


def _remove_spill_root(pid: int, root: str) -> None:
    """At exit, after the databases closed at exit (``atexit`` runs handlers last registered first): what a
    database still open (not closed by its holder) left behind goes too. Only while the name still holds a private
    directory of this account: what another account put there after a removal is not this process's to delete."""
    if os.getpid() == pid and _is_private_directory(root):
        shutil.rmtree(root, ignore_errors=True)


def _opened_ahead_or_now() -> duckdb.DuckDBPyConnection:
    global _ahead
    with _ahead_lock:
        ahead, _ahead = _ahead, None
    if ahead is None or ahead[0] != os.getpid():  # a forked child never waits for its parent's thread
        return _open()
    return ahead[1].result()


def close_at_exit(connection: duckdb.DuckDBPyConnection) -> None:
    """Close ``connection`` when this process exits (an ``atexit`` handler), for a database or cursor a module keeps
    for the process's lifetime. DuckDB removes its spill directory (see :func:`_spill_directory`) only when its
    database closes, and a program's exit finalizes nothing a module holds (``sqe._process``). A forked child
    inherits the handler but not the connection: only the registering process closes it."""
    pid = os.getpid()

    def close() -> None:
        if os.getpid() == pid:
            with contextlib.suppress(duckdb.Error):
                connection.close()

    atexit.register(close)


def connect_locked_down(
    before_lock: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
) -> duckdb.DuckDBPyConnection:
    """An in-memory connection; ``before_lock`` may still change settings before the configuration is locked.
    Its cursors (``con.cursor()``) share the database and its locked settings, each with its own temporary
    schema, so an Arrow object registered on one connection is not visible to another."""
    con = _opened_ahead_or_now()
    try:
        # GLOBAL: also the value of every cursor of this database (a per-connection setting, which a cursor made
        # after the lock below could no longer change)
        con.execute("SET GLOBAL python_enable_replacements = false")
        if before_lock is not None:
            before_lock(con)
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


@dataclass(frozen=True)
class DatabaseLimits:
    """What one database may take of the machine (``sqe serve``: each user engine's), set before the configuration
    is locked, so no statement raises them. DuckDB's own defaults are 80% of the memory, every core and 90% of the
    spill disk's free space for each database: one user's query could take the whole server's."""

    memory_bytes: int  # DuckDB's memory_limit: its buffers (sorts, joins, aggregates); past it, it spills
    threads: int
    spill_bytes: int  # max_temp_directory_size: what the database may spill; 0: nothing

    def apply(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute(f"SET GLOBAL memory_limit = '{int(self.memory_bytes)}B'")
        con.execute(f"SET GLOBAL threads = {int(self.threads)}")
        con.execute(f"SET GLOBAL max_temp_directory_size = '{int(self.spill_bytes)}B'")


def out_of_memory(exc: BaseException) -> bool:
    """DuckDB ran out of the memory or spill space its database may take; after a result's first batch its error
    reaches Python through Arrow's stream, which keeps only its text."""
    return isinstance(exc, duckdb.OutOfMemoryException) or "Out of Memory Error" in first_line(exc)


def spill_disk_free_bytes() -> int:
    """Free space of the file system the databases of this process spill to."""
    return shutil.disk_usage(os.path.dirname(_spill_directory())).free


def statement_type(statement: duckdb.Statement) -> duckdb.StatementType | None:
    """The type DuckDB's parser gave ``statement``, or None for a type DuckDB's Python API has no name for
    (``UPDATE EXTENSIONS``: reading ``.type`` raises ValueError). Callers refuse None like any other type they do
    not run, so such a statement is a typed error, never an untyped one."""
    try:
        return statement.type
    except ValueError:
        return None


def fold_row(con: duckdb.DuckDBPyConnection, expression: str, what: str) -> tuple[object, ...] | None:
    """The row ``SELECT expression`` gives on ``con``, for a user's constant that no parse of their whole statement
    checked (a time-travel value, an option of SQE's own statements, EXECUTE arguments). DuckDB's ``execute`` runs
    every statement a text holds, so ``1; CREATE MACRO ...; SELECT 2`` would run statements SQE refuses: anything
    but one SELECT is a QueryError naming ``what``, before any of it runs. DuckDB's own errors are raised as is."""
    text = f"SELECT {expression}"
    statements = con.extract_statements(text)
    if len(statements) != 1 or statement_type(statements[0]) != duckdb.StatementType.SELECT:
        raise QueryError(f"{what}: expected one expression, found several statements")
    return con.execute(text).fetchone()


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_qualified(*parts: str) -> str:
    return ".".join(quote_ident(p) for p in parts)
