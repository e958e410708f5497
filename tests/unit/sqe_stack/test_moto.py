"""The moto store's install check: the version range it enforces is the `stack` extra's, and a missing or
unsupported moto is a one-line error naming the extra."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sqe_stack.moto import check_moto_version, moto_requirement, require_moto
from sqe_stack.provision import MissingExtraError, StackError

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_the_checked_range_is_the_stack_extra() -> None:
    with PYPROJECT.open("rb") as fh:
        extras = tomllib.load(fh)["project"]["optional-dependencies"]
    assert extras["stack"] == [moto_requirement()]
    assert not any(dep.startswith("moto") for dep in extras["dev"]), "the stack must not ride on the dev extra"


def test_core_dependencies_do_not_pull_moto() -> None:
    with PYPROJECT.open("rb") as fh:
        dependencies = tomllib.load(fh)["project"]["dependencies"]
    assert not any(dep.startswith("moto") for dep in dependencies)


@pytest.mark.parametrize("version", ["5.2.5", "5.2.6", "5.10.0", "5.99.1.dev3"])
def test_supported_versions_pass(version: str) -> None:
    check_moto_version(version)


@pytest.mark.parametrize("version", [None, "5.2.4", "5.1.9", "4.2.14", "6.0.0", "garbage"])
def test_missing_or_unsupported_moto_names_the_extra(version: str | None) -> None:
    with pytest.raises(MissingExtraError) as info:
        check_moto_version(version)
    message = str(info.value)
    assert isinstance(info.value, StackError)
    assert "pip install 'sqe[stack]'" in message and moto_requirement() in message
    assert len(message.splitlines()) == 1


def test_this_environment_has_the_stack_extra() -> None:
    require_moto()  # the Makefile's venv installs .[dev,stack]
