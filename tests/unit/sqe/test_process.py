"""A program's process (``sqe._process``): no collection during start-up, start-up objects frozen, nothing lost.

Each program runs in a fresh interpreter (a subprocess): the collector's state belongs to the process, and the
exit is part of what is tested.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sqe import duckdb_connection
from sqe.cli import main as sqe_main


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """An engine config whose catalog is a closed port: ``SELECT 1`` succeeding shows no catalog call was made."""
    path = tmp_path / "config.toml"
    path.write_text('[catalog]\nuri = "http://127.0.0.1:9"\nwarehouse = "wh"\nclient_id = "u"\nclient_secret = "s"\n')
    return path


def _program(main_body: str, prelude: str = "", cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    source = textwrap.dedent(prelude) + "\nfrom sqe._process import run_program\n\n\ndef main(started):\n"
    source += textwrap.indent(textwrap.dedent(main_body), "    ") + "\n\nrun_program(main)\n"
    return subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


def test_start_up_runs_without_collection_then_started_freezes_it_and_collection_resumes() -> None:
    done = _program(
        """
        import gc
        print(gc.isenabled(), gc.get_freeze_count())
        started()
        print(gc.isenabled(), gc.get_freeze_count() > 0)
        return 3
        """
    )
    assert done.returncode == 3, done.stderr  # main's status is the process's
    assert done.stdout.splitlines() == ["False 0", "True True"]


def test_the_exit_freezes_what_the_program_made_after_start_up_and_still_runs_atexit_handlers() -> None:
    """The exit's last collection is spared (everything is frozen by then), and atexit handlers (log flushing,
    pools, spill directories) still run after it."""
    prelude = """
        import atexit, gc, sys
        atexit.register(lambda: sys.stdout.write(f"at exit: frozen {gc.get_freeze_count() > made_before}\\n"))
        made_before = 0
    """
    body = """
        global made_before, made
        started()
        made_before = gc.get_freeze_count()
        made = [[i] for i in range(1000)]  # made after start-up: not frozen until the exit
        return 0
    """
    done = _program(body, prelude)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["at exit: frozen True"]


@pytest.mark.parametrize("closed_at_exit", [True, False])
def test_a_database_a_module_keeps_leaves_no_spill_directory_at_exit(tmp_path: Path, closed_at_exit: bool) -> None:
    """A program's exit finalizes nothing a module holds, and DuckDB removes a database's spill directory only when
    the database closes: the process-wide database of partial aggregates is closed by ``close_at_exit``, and what
    one left open spilled goes with the process's private directory of spill directories, removed at exit. Nothing
    spills into the working directory (DuckDB's default ``.tmp``, which every database of the process could read)."""
    body = f"""
        global database, cursor
        from sqe.duckdb_connection import close_at_exit, connect_locked_down

        def small(con):
            con.execute("SET memory_limit = '20MB'")
            con.execute("SET threads = 1")

        started()
        database = connect_locked_down(small)
        cursor = database.cursor()
        if {closed_at_exit}:
            close_at_exit(database)
            close_at_exit(cursor)
        cursor.execute("SELECT count(*) FROM (SELECT * FROM range(3000000) t(x) ORDER BY x DESC)").fetchall()
        import os
        spill = cursor.execute("SELECT current_setting('temp_directory')").fetchone()[0]
        print(os.path.realpath(spill), bool(os.listdir(spill)))  # by name: another process's /proc/self differs
        return 0
    """
    done = _program(body, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    spill, spilled = done.stdout.split()
    assert spilled == "True", "the query spilled into its database's own directory"
    assert not Path(spill).exists() and not Path(spill).parent.exists()
    assert not (tmp_path / ".tmp").exists()


def test_an_exception_in_main_propagates_as_usual() -> None:
    done = _program("started()\nraise RuntimeError('boom')")
    assert done.returncode == 1
    assert "RuntimeError: boom" in done.stderr


def test_main_called_as_a_library_leaves_the_collector_alone(config: Path) -> None:
    """Tests and embedding applications call ``main`` in their own process: it must not disable or freeze."""
    frozen = gc.get_freeze_count()
    assert sqe_main(["--config", str(config), "--format", "csv", "-e", "SELECT 1 AS one"]) == 0
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
    assert duckdb_connection._ahead is None  # no database opened ahead for a later, unrelated caller


def test_the_sqe_program_answers_through_its_process_entry(tmp_path: Path, config: Path) -> None:
    # ``python -m sqe.cli`` runs ``run()``; here the same call, with an atexit probe of the collector's state.
    probe = "import atexit, gc, sys; import sqe.cli; "
    probe += "atexit.register(lambda: print('frozen at exit', gc.get_freeze_count() > 0, file=sys.stderr)); "
    probe += "sys.argv[0] = 'sqe'; sqe.cli.run()"
    done = subprocess.run(
        [sys.executable, "-c", probe, "--config", str(config), "--format", "csv", "-e", "SELECT 41 + 1 AS x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["x", "42"]
    assert "frozen at exit True" in done.stderr
