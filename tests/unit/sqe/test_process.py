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

from sqe.cli import main as sqe_main


def _program(main_body: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    source = textwrap.dedent(prelude) + "\nfrom sqe._process import run_program\n\n\ndef main(started):\n"
    source += textwrap.indent(textwrap.dedent(main_body), "    ") + "\n\nrun_program(main)\n"
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=60, check=False)


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


def test_the_exit_runs_atexit_handlers_and_keeps_what_the_program_closed(tmp_path: Path) -> None:
    """The contract of ``sqe._process``: atexit handlers still run (log flushing, pools), and what the program
    closes before returning is complete."""
    output = tmp_path / "out.txt"
    prelude = """
        import atexit, sys
        atexit.register(lambda: sys.stdout.write("atexit ran\\n"))
    """
    body = f"""
        started()
        with open({str(output)!r}, "w") as out:
            out.write("data")
        return 0
    """
    done = _program(body, prelude)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["atexit ran"]
    assert output.read_text() == "data"


def test_an_exception_in_main_propagates_as_usual() -> None:
    done = _program("started()\nraise RuntimeError('boom')")
    assert done.returncode == 1
    assert "RuntimeError: boom" in done.stderr


def test_main_called_as_a_library_leaves_the_collector_alone(tmp_path: Path) -> None:
    """Tests and embedding applications call ``main`` in their own process: it must not disable or freeze."""
    config = tmp_path / "config.toml"
    config.write_text('[catalog]\nuri = "http://127.0.0.1:9"\nwarehouse = "wh"\nclient_id = "u"\nclient_secret = "s"\n')
    frozen = gc.get_freeze_count()
    assert sqe_main(["--config", str(config), "--format", "csv", "-e", "SELECT 1 AS one"]) == 0
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_the_sqe_program_answers_through_its_process_entry(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[catalog]\nuri = "http://127.0.0.1:9"\nwarehouse = "wh"\nclient_id = "u"\nclient_secret = "s"\n')
    done = subprocess.run(
        [sys.executable, "-m", "sqe.cli", "--config", str(config), "--format", "csv", "-e", "SELECT 41 + 1 AS x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["x", "42"]
