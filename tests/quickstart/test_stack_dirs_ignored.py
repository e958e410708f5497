"""Every stack directory the READMEs tell a user to create in the checkout is ignored by git: it holds the
catalog's S3 key, the principals' client secrets and the worker token, and ``git add -A`` must never take them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "quickstart").glob("**/README.md"))]
STACK_DIR = re.compile(r"--dir ([.\w-]+)")


def _stack_dirs() -> set[str]:
    return {name for doc in DOCS for name in STACK_DIR.findall(doc.read_text(encoding="utf-8"))}


def test_every_stack_dir_the_docs_name_is_ignored_by_git() -> None:
    names = _stack_dirs()
    assert {".stack", ".ceph-stack", ".demo-stack"} <= names, names  # the docs still name them: the test sees them
    probes = [f"{name}/catalog.toml" for name in sorted(names)]
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *probes], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert sorted(done.stdout.split()) == probes, f"not ignored: {sorted(set(probes) - set(done.stdout.split()))}"
