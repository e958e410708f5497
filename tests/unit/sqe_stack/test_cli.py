"""``sqe stack ...`` reaches the stack package through the engine's CLI (a lazy import in ``sqe.cli``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sqe.cli import main


def test_sqe_stack_dispatches_to_the_stack_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stack", "status", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"sqe stack status: no stack in {tmp_path.resolve()} (stack.json not found)"


def test_sqe_stack_usage_errors_come_from_the_stack_parser(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stack", "sideways"]) == 2
    assert "usage: sqe stack" in capsys.readouterr().err


def test_a_stack_dir_that_cannot_be_made_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing starts: a file where the directory should be (or no permission) is refused first."""
    taken = tmp_path / "a-file"
    taken.write_text("")
    for where in (taken, taken / "below"):
        assert main(["stack", "up", "--dir", str(where)]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"sqe stack up: cannot use {where} as the stack directory: "), err
