"""The locked-down DuckDB connection and its cursors (sessions fold constants on a cursor; workers' partial
aggregates run on cursors of one shared database)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from sqe import duckdb_connection
from sqe.distributed.protocol.partial import _connect as partial_connection
from sqe.duckdb_connection import LOCKDOWN_CONFIG, connect_locked_down, open_ahead

LOCKED = ("enable_external_access", "lock_configuration", "python_enable_replacements")


def _settings(con: duckdb.DuckDBPyConnection) -> dict[str, object]:
    return {name: con.execute(f"SELECT current_setting('{name}')").fetchone()[0] for name in LOCKED}  # type: ignore[index]


@pytest.mark.parametrize("which", ["connection", "cursor", "partial aggregate cursor"])
def test_no_connection_or_cursor_reads_a_python_variable(which: str) -> None:
    secret_table = pa.table({"secret": ["do-not-read"]})
    plain = duckdb.connect()
    try:  # the probe is real: an ordinary cursor reads the caller's variable
        assert plain.cursor().sql("SELECT * FROM secret_table").fetchall() == [("do-not-read",)]
    finally:
        plain.close()
    base = connect_locked_down()
    con = {"connection": base, "cursor": base.cursor(), "partial aggregate cursor": partial_connection()}[which]
    try:
        assert _settings(con) == {
            "enable_external_access": False,
            "lock_configuration": True,
            "python_enable_replacements": False,
        }
        with pytest.raises(duckdb.CatalogException, match="secret_table"):
            con.sql("SELECT * FROM secret_table").fetchall()
        with pytest.raises(duckdb.Error):
            con.execute("SET python_enable_replacements = true")
    finally:
        con.close()
        base.close()
    assert secret_table.num_rows == 1


def test_an_object_registered_on_a_connection_is_not_visible_to_its_cursor() -> None:
    con = connect_locked_down()
    cursor = con.cursor()
    try:
        con.register("scan", pa.table({"id": [1, 2, 3]}))
        assert con.execute("SELECT count(*) FROM temp.main.scan").fetchone() == (3,)
        with pytest.raises(duckdb.CatalogException, match="scan"):
            cursor.sql("SELECT count(*) FROM temp.main.scan").fetchall()
    finally:
        cursor.close()
        con.close()


def test_a_database_opened_ahead_is_the_next_connection_and_just_as_locked_down() -> None:
    """The ``sqe`` program opens its session's database on a thread while it imports; the connection it gets is
    the one opened ahead, with ``before_lock`` applied and the configuration locked like any other."""
    open_ahead()
    ahead = duckdb_connection._ahead
    assert ahead is not None
    con = connect_locked_down(lambda c: c.execute("CREATE TABLE made_before_lock AS SELECT 7 AS x"))
    try:
        assert duckdb_connection._ahead is None  # taken: the next connection opens on the spot
        assert con is ahead[1].result()
        assert _settings(con) == {
            "enable_external_access": False,
            "lock_configuration": True,
            "python_enable_replacements": False,
        }
        assert con.execute("SELECT x FROM made_before_lock").fetchall() == [(7,)]
        with pytest.raises(duckdb.Error):
            con.execute("SET enable_external_access = true")
    finally:
        con.close()


def test_a_failure_to_open_ahead_reaches_the_caller_that_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(LOCKDOWN_CONFIG, "no_such_duckdb_setting", 1)  # DuckDB itself refuses to open
    open_ahead()
    with pytest.raises(duckdb.Error, match="no_such_duckdb_setting"):
        connect_locked_down()
    assert duckdb_connection._ahead is None


def _small(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("SET memory_limit = '20MB'")
    con.execute("SET threads = 1")


def _spill_directory(con: duckdb.DuckDBPyConnection) -> str:
    return str(con.execute("SELECT current_setting('temp_directory')").fetchone()[0])  # type: ignore[index]


def test_a_database_cannot_read_what_another_database_spilled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: DuckDB lets SQL read its temporary directory whatever ``enable_external_access`` says
    (``read_blob``, ``glob``), and every database spilled into the working directory's ``.tmp``: one ``sqe serve``
    user read the blocks another user's query spilled. Now each database has a directory of its own, in a private
    directory of the process."""
    monkeypatch.chdir(tmp_path)  # where DuckDB's default spill directory, .tmp, would be
    spilling, spying = connect_locked_down(_small), connect_locked_down()
    try:
        spilling.execute("SELECT count(*) FROM (SELECT * FROM range(3000000) t(x) ORDER BY x DESC)").fetchall()
        spill = Path(_spill_directory(spilling))
        assert spill.is_absolute() and spill != Path(_spill_directory(spying))
        assert any(spill.iterdir()), "the query spilled into its database's own directory"
        assert stat.S_IMODE(spill.parent.stat().st_mode) == 0o700, "no other account lists it"
        assert not (tmp_path / ".tmp").exists()
        pattern = f"SELECT count(*) FROM glob('{spill}/*')"
        assert spilling.execute(pattern).fetchone()[0] > 0  # type: ignore[index]
        for probe in (pattern, f"SELECT content FROM read_blob('{spill}/*')"):
            with pytest.raises(duckdb.PermissionException):
                spying.execute(probe).fetchall()
    finally:
        spilling.close()
        spying.close()
    assert not spill.exists(), "DuckDB removes a database's spill directory when it closes"


def _fresh_spill_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next database makes the process's private directory anew (where the working directory now is)."""
    monkeypatch.setattr(duckdb_connection, "_spill_root", None)


def _named(spill: str) -> Path:
    """A spill directory by the name of the private directory it lies in (databases are given that directory
    through its descriptor, ``/proc/self/fd/N``)."""
    return Path(os.path.realpath(spill))


SPILLING = "SELECT count(*) FROM (SELECT * FROM range(3000000) t(x) ORDER BY x DESC)"


def test_a_database_never_spills_into_a_directory_put_where_its_private_one_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: a database kept the private directory's name, so once the directory was removed (a
    temporary-file cleaner) and another account put its own directory under that name, every later spill of a
    database opened before went into that account's directory. Now databases are given the directory through its
    open descriptor: the removed directory is the one they would spill into, and their spill fails."""
    monkeypatch.chdir(tmp_path)
    _fresh_spill_root(monkeypatch)
    con = connect_locked_down(_small)
    root = _named(_spill_directory(con)).parent
    try:
        shutil.rmtree(root)
        root.mkdir()
        root.chmod(0o777)
        os.chown(root, 65534, 65534)  # the tests run as root: nobody's
        with pytest.raises(duckdb.Error):
            con.execute(SPILLING).fetchall()
        assert not any(root.iterdir()), "nothing of the database is put in the other account's directory"
        spill = _named(duckdb_connection._spill_directory())
        assert spill.parent != root and stat.S_IMODE(spill.parent.stat().st_mode) == 0o700
    finally:
        con.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("planted", ["symlink", "directory of another account", "directory others may enter"])
def test_a_spill_directory_planted_where_the_private_one_was_is_never_used(
    planted: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: once the private directory was gone (a temporary-file cleaner, ``git clean``), anything
    put under its name passed the check that only asked for a directory (``os.path.isdir`` follows a symlink),
    and every later database spilled into it: another account's directory, where it reads the rows spilled.
    Now only a real directory of this account that no other may enter is used; else a new one is made."""
    work, theirs = tmp_path / "work", tmp_path / "theirs"
    work.mkdir()
    theirs.mkdir(mode=0o777)
    monkeypatch.chdir(work)
    _fresh_spill_root(monkeypatch)
    root = _named(duckdb_connection._spill_directory()).parent
    root.rmdir()
    if planted == "symlink":
        root.symlink_to(theirs, target_is_directory=True)
    else:
        root.mkdir(mode=0o755 if planted == "directory others may enter" else 0o700)
        root.chmod(0o755 if planted == "directory others may enter" else 0o700)
        if planted == "directory of another account":
            os.chown(root, 65534, 65534)  # the tests run as root: nobody's
    spill = _named(duckdb_connection._spill_directory())
    assert spill.parent != root and not spill.is_relative_to(theirs)
    assert stat.S_IMODE(os.lstat(spill.parent).st_mode) == 0o700 and not spill.parent.is_symlink()


def test_at_exit_a_directory_another_account_put_under_the_private_ones_name_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: the exit handler removed whatever the private directory's name held by then, so a
    directory another account made there after a removal lost its files to this process (run as root: anyone's)."""
    monkeypatch.chdir(tmp_path)
    _fresh_spill_root(monkeypatch)
    root = _named(duckdb_connection._spill_directory()).parent
    root.rmdir()
    root.mkdir()
    (root / "theirs.txt").write_text("another account's file")
    os.chown(root, 65534, 65534)
    duckdb_connection._remove_spill_root(os.getpid(), str(root))
    assert (root / "theirs.txt").read_text() == "another account's file"
    os.chown(root, os.geteuid(), os.getegid())
    root.chmod(0o700)
    duckdb_connection._remove_spill_root(os.getpid(), str(root))
    assert not root.exists(), "the process's own private directory goes"


def test_a_working_directory_whose_entries_others_may_replace_takes_no_spill_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: in a working directory any account may write to (and without the sticky bit), another
    account may rename the private directory away and put its own under the name DuckDB spills to. Such a
    directory is passed over for the temporary directory; a sticky one (``/tmp``) is used."""
    shared, sticky = tmp_path / "shared", tmp_path / "sticky"
    for directory, mode in ((shared, 0o777), (sticky, 0o1777)):
        directory.mkdir()
        directory.chmod(mode)
    monkeypatch.chdir(shared)
    _fresh_spill_root(monkeypatch)
    assert not _named(duckdb_connection._spill_directory()).is_relative_to(shared.resolve())
    monkeypatch.chdir(sticky)
    _fresh_spill_root(monkeypatch)
    assert _named(duckdb_connection._spill_directory()).parent.parent == sticky.resolve()


def _all_settings(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    rows = con.execute("SELECT name, value FROM duckdb_settings()").fetchall()
    return {str(name): str(value) for name, value in rows}


def test_settings_and_errors_show_no_directory_of_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: ``duckdb_settings()`` and ``current_setting()`` showed every ``sqe serve`` user the
    server's home directory (``secret_directory``, and ``duckdb_extensions()``'s error the extension directory)
    and its working directory (``allowed_paths``: DuckDB allowed ``<working directory>/:memory:`` files). Only the
    database's own spill directory (``temp_directory``, ``allowed_directories``) still names a place."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    con = connect_locked_down()
    try:
        shown = _all_settings(con)
        for name in ("home_directory", "secret_directory", "extension_directory"):
            assert con.execute(f"SELECT current_setting('{name}')").fetchone() == (duckdb_connection.NO_DIRECTORY,)
        telling = {n: v for n, v in shown.items() if str(tmp_path) in v}
        assert set(telling) <= {"temp_directory", "allowed_directories"}, telling
        with pytest.raises(duckdb.Error) as refused:
            con.execute("SELECT * FROM duckdb_extensions()").fetchall()
        assert str(tmp_path) not in str(refused.value)
        with pytest.raises(duckdb.PermissionException):  # external access is off all the same
            con.execute(f"SELECT * FROM read_text('{work}/:memory:')").fetchall()
    finally:
        con.close()


def test_database_limits_hold_and_no_statement_raises_them() -> None:
    limits = duckdb_connection.DatabaseLimits(memory_bytes=32 << 20, threads=1, spill_bytes=0)
    con = connect_locked_down(limits.apply)
    try:
        shown = _all_settings(con)
        limits_shown = (shown["memory_limit"], shown["threads"], shown["max_temp_directory_size"])
        assert limits_shown == ("32.0 MiB", "1", "0 bytes")
        for change in ("SET memory_limit = '10GB'", "RESET threads", "SET GLOBAL max_temp_directory_size = '1TB'"):
            with pytest.raises(duckdb.InvalidInputException, match="locked"):
                con.execute(change)
        with pytest.raises(duckdb.OutOfMemoryException):
            con.execute(
                "SELECT count(*) FROM (SELECT md5(x::VARCHAR) s FROM range(3000000) t(x) ORDER BY s)"
            ).fetchall()
    finally:
        con.close()
