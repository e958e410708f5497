"""Every script in ``bench/`` still runs: each as a real process on the smallest inputs that reach all its parts.

Nothing else runs the benchmarks, so they rot unseen (``bench/restrictions.py`` once died in its second part
after a helper's return type changed). A case passes when the script exits as expected with no traceback and
prints its tables: each pattern must match a whole line of its output. Timings are printed by the scripts and never
checked; only the shape of a line (a number where a number belongs) is.

The scripts that start the embedded stack (moto + sqe-catalog, their own: a child process cannot share this
session's) take 5-12 s of CPU each on these inputs. Too slow even when tiny, so only their argument parsing and
imports are run: ``vs_duckdb.py`` (builds a DuckDB 1.5.5 virtualenv on first use), ``scan_memory.py`` (a fresh
process per engine and table size) and ``soak.py`` (Ceph; ``tests/soak`` runs its code under faults).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

BENCH = Path(__file__).resolve().parents[2] / "bench"
F = r"\d+\.\d+"  # a printed figure: its value is never checked
N = r"[\d,]+"  # a count or a rate with thousands separators


@dataclass(frozen=True)
class Case:
    script: str
    args: str  # split on spaces
    lines: tuple[str, ...]  # regular expressions, each matching one whole line of the output (stderr for errors)
    exit_code: int = 0
    stack: bool = False  # starts the embedded stack (moto + sqe-catalog): an e2e run


CASES = [
    Case(
        "restrictions_actions.py",
        "--rows 200 --repeat 1",
        (
            r"action\s+column\s+values/s\s+values/s/core",
            rf"sha-256-global\s+string ascii\s+{N}\s+{N}",
            rf"baseline copy\s+string ascii\s+{N}\s+{N}",
            r"action\s+column\s+read ms\s+masked ms\s+masked/unmasked\s+cpu ratio",
            rf"mask-alphanum\s+string ascii(\s+{F}){{4}}",
        ),
    ),
    Case(
        "restrictions.py",
        "--rows 200 --repeat 1 --files 1",
        (
            r"== SQE scan, 200 rows in 1 files: masked vs unmasked \(best of 1\)",
            rf"sha-256-query-local\s+email(\s+{F}){{3}}",
            r"== each action alone on 200 values, one core \(best of 1\)",
            r"action\s+column\s+values/s\s+values/s/core",
            rf"sha-256-global\s+string ascii\s+{N}\s+{N}",
        ),
    ),
    Case(
        "execute_many.py",
        "--rows 5 --runs 1",
        (r"\s*rows\s+old rows/s\s+new rows/s\s+speed-up", rf"\s*5\s+{N}\s+{N}\s+{F}x"),
    ),
    Case(
        "glob_match.py",  # HEAD as the reference: any checkout has it
        "--paths 20 --budget 0.001 --ref HEAD",
        (
            r"21 paths; µs per path \(HEAD / working tree / plain re, adversarial re skipped\)",
            rf"typical\s+bucket/exports/\*\.parquet(\s+{F}){{3}}",
            rf"adversarial\s+bucket/exports/\S+(\s+{F}){{2}}\s+-",
        ),
    ),
    Case(
        "distributed.py",  # "off": the mode with branches of its own; tiny, a query may cost the worker 0 CPU ticks
        "--efficiency --eff-rows 2 --eff-files 2 --runs 1 --eff-caches off --compare-partial",
        (
            r"efficiency, data caches off \(every run reads the store\): 2 rows in 2 files \(moto\).*",
            r"\s*query\s+local rows/s/core\s+worker rows/s/core\s+wall ratio\s+CPU ratio.*",
            rf"\s*agg\+NOT\s+{N}\s+{N}\s+{F}\s+({F}|-)\s+{F}\s+{F}\s+{F}\s+({F}|-)",
            r"same stack and worker, \[coordinator\] partial_aggregation = false \(workers ship every row\):",
        ),
        stack=True,
    ),
    Case("vs_duckdb.py", "--files 1,x", (r".*error: --files takes comma-separated integers",), exit_code=2),
    Case("scan_memory.py", "--rows 5", (r".*error: --rows needs two or more positive sizes.*",), exit_code=2),
    Case("soak.py", "--help", (r"usage: soak\.py .*", r"\s*--queries QUERIES")),
]


def _run(case: Case, cwd: Path) -> subprocess.CompletedProcess[str]:
    # A user's shell has no AWS keys; this session may hold bogus ones or the Ceph client's settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    command = [sys.executable, str(BENCH / case.script), *case.args.split()]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=150, check=False)


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=f"{c.script} {c.args}", marks=[pytest.mark.e2e] if c.stack else []) for c in CASES],
)
def test_bench_script_runs_on_tiny_inputs(case: Case, tmp_path: Path) -> None:
    done = _run(case, tmp_path)
    assert done.returncode == case.exit_code, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    output = done.stdout + done.stderr
    for line in case.lines:
        assert re.search(rf"^{line}$", output, re.MULTILINE), f"no line matching {line!r} in:\n{output}"
