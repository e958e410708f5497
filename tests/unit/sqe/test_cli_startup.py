"""Start-up cost (issue 11 item 4): the paths that need no catalog never import pyiceberg, grpc or boto3.

Each case runs in a fresh interpreter (a subprocess), so modules imported by other tests do not count. The
config names a catalog on a closed port: ``SELECT 1`` succeeding proves no catalog call was made either.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("pyiceberg", "grpc", "boto3", "botocore", "tenacity", "requests")

_PROBE = """
import json, sys
import sqe.cli
try:
    rc = sqe.cli.main(sys.argv[1:])
except SystemExit as exc:  # --help / --version exit through argparse
    rc = exc.code
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(json.loads(HEAVY)))
print(json.dumps({"rc": rc, "heavy": heavy}), file=sys.stderr)
"""


def _run(tmp_path: Path, *argv: str) -> tuple[dict[str, object], str]:
    probe = _PROBE.replace("HEAVY", repr(json.dumps(HEAVY)))
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert isinstance(report, dict)
    return report, done.stdout


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('[catalog]\nuri = "http://127.0.0.1:9"\nwarehouse = "wh"\nclient_id = "u"\nclient_secret = "s"\n')
    return path


def test_select_1_imports_no_catalog_stack(tmp_path: Path, config: Path) -> None:
    report, out = _run(tmp_path, "--config", str(config), "-e", "SELECT 1 AS one, 'x' || 'y' AS two")
    assert report == {"rc": 0, "heavy": []}
    assert "one" in out and "xy" in out


def test_help_and_version_import_no_catalog_stack(tmp_path: Path) -> None:
    for argv in (["--help"], ["--version"]):
        report, out = _run(tmp_path, *argv)
        assert report == {"rc": 0, "heavy": []}, argv
        assert "sqe" in out


def test_table_query_still_reaches_the_catalog(tmp_path: Path, config: Path) -> None:
    """The lazy client is really built on first use: naming a table tries the (closed) catalog and fails typed."""
    report, _ = _run(tmp_path, "--config", str(config), "-e", "SELECT * FROM ns.t")
    assert report["rc"] == 1
    assert "pyiceberg" in report["heavy"]  # type: ignore[operator]
