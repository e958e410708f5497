"""Fuzz cases run in a child process: a segfault or abort in a compiled parser fails the test naming its case
instead of killing pytest, and a case that runs past its time is a hang.

A case module is run as ``python -m MODULE ARGS...``; it prints ``start N`` before case N and one JSON line
``{"case": N, "outcome": "..."}`` after it. An outcome starting with ``bad`` is a defect the module found.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START_SECONDS = 60.0  # the child's imports, before its first case
CASE_SECONDS = 5.0  # a parser that takes longer than this on one small file is a hang


def run_cases(module: str, *args: str) -> dict[int, str]:
    """Each case's outcome; fails on a crash, a hang or an outcome starting with ``bad``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: a child writing much there never blocks
        child = subprocess.Popen(
            [sys.executable, "-m", module, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr
        )
        try:
            outcomes, current = _outcomes(child, module)
        finally:
            child.kill()
            status = child.wait()
        stderr.seek(0)
        errors = stderr.read().decode(errors="replace")
    assert current is None and status == 0, f"case {current} of {module} crashed (status {status}): {errors[-2000:]}"
    bad = {case: outcome for case, outcome in outcomes.items() if outcome.startswith("bad")}
    assert not bad, f"{module}: {bad}"
    return outcomes


def _outcomes(child: subprocess.Popen[bytes], module: str) -> tuple[dict[int, str], int | None]:
    """The child's outcomes until it ends, and the case it was in then (None: between cases). Read from the pipe
    unbuffered, so that what select sees waiting is all there is."""
    assert child.stdout is not None
    fd, pending = child.stdout.fileno(), b""
    outcomes: dict[int, str] = {}
    current: int | None = None
    deadline = time.monotonic() + START_SECONDS
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"case {current} of {module} hung (over {CASE_SECONDS} s)")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return outcomes, current
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.startswith(b"start "):
                current, deadline = int(line.split()[1]), time.monotonic() + CASE_SECONDS
            else:
                result = json.loads(line)
                outcomes[result["case"]] = result["outcome"]
                current = None


def report(case: int, outcome: str) -> None:
    """A case module's line for ``case``."""
    print(json.dumps({"case": case, "outcome": outcome}), flush=True)


def starting(case: int) -> None:
    print(f"start {case}", flush=True)
