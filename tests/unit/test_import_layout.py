"""The import layout check (``.ci/check_imports.py``): on this repository, and on small trees that break it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "check_imports.py"


def run_check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=60, check=False
    )


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for package in ("sqe", "sqe_catalog", "workers"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").touch()
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_the_repository_has_no_engine_to_worker_import_and_no_cycle() -> None:
    result = run_check(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_module_level_cycle_across_packages_fails(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "sqe/a.py": "from sqe_catalog.b import B\n",
            "sqe_catalog/b.py": "import sqe.c\nB = 1\n",
            "sqe/c.py": "from sqe import a\n",
        },
    )
    result = run_check(root)
    assert result.returncode == 1
    assert "import cycle: sqe.a <-> sqe.c <-> sqe_catalog.b" in result.stdout


def test_deferred_imports_break_no_cycle_but_an_engine_import_of_workers_always_counts(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "sqe/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sqe.b import B\n",
            "sqe/b.py": "from sqe.a import *\nB = 1\n\ndef later() -> None:\n    import workers.service\n",
            "workers/service.py": "import sqe.b\n",
            "sqe/d.py": "from . import b\nfrom .a import *\n",
        },
    )
    result = run_check(root)
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["sqe/b.py:5: sqe imports workers.service"]


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"sqe/a.py": "import sqe.b\n", "sqe/b.py": "X = 1\n", "workers/w.py": "import sqe.a\n"})
    result = run_check(root)
    assert result.returncode == 0, result.stdout
    assert "no cycles" in result.stdout


def test_a_cycle_between_packages_fails_even_without_a_file_cycle(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "sqe/catalog/__init__.py": "",
            "sqe/catalog/a.py": "from sqe.credentials.b import B\nA = 1\n",
            "sqe/credentials/__init__.py": "",
            "sqe/credentials/b.py": "B = 1\n",
            "sqe/credentials/c.py": "from sqe.catalog.a import A\n",
        },
    )
    result = run_check(root)
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["package import cycle: sqe.catalog <-> sqe.credentials"]


def test_the_worker_wire_protocol_lives_in_the_engine() -> None:
    assert (REPO / "sqe" / "distributed" / "protocol" / "ticket.py").is_file()
    assert not (REPO / "workers" / "ticket.py").exists() and not (REPO / "workers" / "_proto").exists()
