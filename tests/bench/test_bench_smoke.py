"""Every script in ``bench/`` still runs: each as a real process on the smallest inputs that reach all its parts.

Nothing else runs the benchmarks, so they rot unseen (``bench/restrictions.py`` once died in its second part
after a helper's return type changed). A case passes when the script exits as expected with no traceback and
prints its tables: each pattern must match a whole line of its output. Timings are printed by the scripts and never
checked; only the shape of a line (a number where a number belongs) is.

The scripts that start the embedded stack (moto + sqe-catalog of their own: a child process cannot share this
session's) take 5-11 s of CPU each on these inputs; no process they start may outlive them. Too slow even when
tiny, so only their imports and argument parsing run: ``vs_duckdb.py`` (builds a DuckDB 1.5.5 virtualenv on first
use), ``scan_memory.py`` (a fresh process per engine and table size: 20 s of CPU) and ``soak.py`` (Ceph;
``tests/soak`` runs its code under faults). No ``--store ceph`` run is made here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TIMEOUT = 150  # seconds a script may run; its tiny run takes a tenth of that on an idle machine

BENCH = Path(__file__).resolve().parents[2] / "bench"
F = r"\d+\.\d+"  # a printed figure: its value is never checked
N = r"[\d,]+"  # a count or a rate with thousands separators
PYTHON = "{python}"  # this interpreter, as the "other checkout" of the scripts that compare two


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
    Case(  # the baseline catalog's start is run by the next case; its column is printed as the others are
        "catalog_load.py",
        "--calls 2 --rounds 1",
        (
            r"median ms of 2 calls in 1 interleaved rounds \(moto store\)",
            r"\s+default\s+recheck-30s\s+credential-cache-off\s+metadata-cache-off",
            rf"\s+304 vended\s+{F}(\s+{F} \({F}x\)){{3}}",
            rf"\s+sqe count\(\*\)\s+{F}(\s+{F} \({F}x\)){{3}}",
        ),
        stack=True,
    ),
    Case(  # a baseline that will not start: the variant catalogs already running are stopped all the same
        "catalog_load.py",
        "--calls 2 --rounds 1 --baseline-python /bin/false",
        (r"bench/catalog_load\.py: catalog-baseline exited during start-up .*",),
        exit_code=1,
        stack=True,
    ),
    Case(
        "process_start.py",
        f"--rounds 1 --baseline-python {PYTHON}",
        (
            r"whole processes, medians of 1 \(wall\)",
            *(
                rf"\s+{name}\s+ready\s+\d+ ms\s+gone after SIGTERM\s+\d+ ms\s+baseline \d+ / \d+ ms; "
                rf"baseline/this: ready {F}x, gone {F}x"
                for name in ("sqe-catalog", "sqe-worker")
            ),
        ),
        stack=True,
    ),
    Case(  # --baseline-python runs the same cold starts under another interpreter: process_start.py's case has one
        "query_overhead.py",
        "--runs 1 --cold-runs 1",
        (
            r"cold start \(whole process, median of 1; wall, then CPU\)",
            rf"\s+sqe -e 'SELECT 1'\s+{F} ms\s+cpu \d+ ms",
            rf"\s+tiny scan, metadata_revalidate_seconds = 30\s+{F} ms\s+vs 0: {F}x",
            rf"ratios: sqe-strict/duckdb={F}x sqe-revalidate-30/duckdb={F}x select-1/duckdb={F}x",
        ),
        stack=True,
    ),
    Case(
        "passthrough.py",
        "--rows 400 --files 1 --rounds 1",
        (
            r"400 rows in 1 file\(s\), medians of 1 interleaved rounds",
            r"query\s+time\s+pass-through\s+duckdb\s+scan only\s+duckdb/pass",
            rf"not/like cpu(\s+{F}s){{3}}\s+{F}x",
        ),
        stack=True,
    ),
    Case(
        "scan.py",
        "--rows 400 --files 1 --repeat 1",
        (
            r"store\s+query\s+engine\s+rows\s+seconds\s+Mrows/s\s+SQE/pyarrow\s+SQE/pyiceberg",
            *(rf"{store}\s+full-row scan\s+sqe\s+400(\s+{F}){{2}}(\s+{F}x){{2}}" for store in ("local", "moto")),
            r"ratios: SQE's rows/s divided by the baseline's.*",
        ),
        stack=True,
    ),
    Case(
        "server.py",
        "--rows 400 --repeat 1",
        (
            rf"full scan\s+rows=\s+400\s+flight\s+{N} rows/s\s+embedded\s+{N} rows/s\s+flight/embedded {F}",
            rf"tiny query flight\s+median {F} ms \(50 runs\)",
        ),
        stack=True,
    ),
    Case(
        "distributed.py",  # paced scans of 1 lifetime of 1 s, 6 files: the pace spreads one file over each slot
        "--files 6 --rows 50 --runs 1 --lifetime 1 --lifetimes 1",
        (
            r"6 files x 50 rows \(moto store\), median of 1 runs:",
            rf"\s+ratio distributed / local: {F}x\s+\({F} M rows/s\)",
            *(
                rf"paced scan: {F} s = {F} credential lifetimes of 1 s, 6 files in \d+ fragments, {n} running at a time"
                for n in (2, 6)
            ),
            rf"\s+AssumeRole calls\s+\d+\s+\({F} per lifetime\)",
        ),
        stack=True,
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


def _run(case: Case, cwd: Path) -> tuple[int, str, str]:
    # A user's shell has no AWS keys; this session may hold bogus ones or the Ceph client's settings. TMPDIR
    # marks every process the script starts (see _left_running).
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {"TMPDIR": str(cwd)}
    args = [sys.executable if arg == PYTHON else arg for arg in case.args.split()]
    command = [sys.executable, str(BENCH / case.script), *args]
    with subprocess.Popen(command, cwd=cwd, env=env, stdout=PIPE, stderr=PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # KeyboardInterrupt: the script's own finally stops its stack
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            pytest.fail(f"{case.script} ran longer than {TIMEOUT} s; output:\n{out}\n{err[-3000:]}")
    return proc.returncode, out, err


def _left_running(tmpdir: Path) -> list[str]:
    """Processes still running with the script's TMPDIR in their environment (killed: they are the test's)."""
    marker = f"TMPDIR={tmpdir}\0".encode()
    left = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes():
                left.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return left


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=f"{c.script} {c.args}", marks=[pytest.mark.e2e] if c.stack else []) for c in CASES],
)
def test_bench_script_runs_on_tiny_inputs(case: Case, tmp_path: Path) -> None:
    try:
        code, out, err = _run(case, tmp_path)
    finally:
        left = _left_running(tmp_path)
    assert left == [], "processes outlived the script"
    assert code == case.exit_code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    output = out + err
    for line in case.lines:
        assert re.search(rf"^{line}$", output, re.MULTILINE), f"no line matching {line!r} in:\n{output}"
