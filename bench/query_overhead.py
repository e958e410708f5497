"""Per-query and start-up cost of SQE (issue 11 item 4), against same-run baselines.

Starts the embedded stack (moto S3+STS, sqe-catalog; no server), creates a 3-row table, then measures:

- cold start: whole processes (``python -m sqe.cli``, which is what the ``sqe`` script runs) for ``--help``,
  ``-e "SELECT 1"`` and ``-e "<tiny table query>"``, median of ``--cold-runs``; with ``--baseline-python`` the
  same commands under another interpreter (e.g. a checkout of main) and the ratios baseline / this;
- warm tiny query in one session (``--runs`` repetitions after a warm-up, median): ``SELECT 1``, then
  ``SELECT count(*) FROM t WHERE true`` (``WHERE true``: a real scan, not the manifest-count answer) with
  ``metadata_revalidate_seconds`` 0 (every query revalidates: one catalog 304) and 30 (no round trip), and the
  same query on a 3-row in-memory DuckDB table as the floor; ratios SQE / DuckDB.

    .venv/bin/python bench/query_overhead.py [--runs 50] [--cold-runs 5] [--baseline-python PATH]

Run it under another checkout's interpreter to get that checkout's warm numbers (a config key it does not know
prints ``n/a``). Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

import sqe.api
from sqe.errors import ConfigError
from sqe_stack import start_stack, stop_stack

TABLE = "bench.t3"
TINY = f"SELECT count(*) FROM {TABLE} WHERE true"


def median_ms(run: Callable[[], object], runs: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def cold_ms(python: str, argv: list[str], runs: int) -> tuple[float, float]:
    """Median wall and CPU (user + system) milliseconds of a whole ``python -m sqe.cli ARGV`` process (after one
    warm-up run for the page cache and the bytecode). CPU time is the steadier figure on a shared machine."""
    # An installed package has its bytecode; a PYTHONDONTWRITEBYTECODE inherited from the shell would leave an
    # editable checkout compiling every module from source on each start (measured: +0.3 s for `-e 'SELECT 1'`).
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    samples, cpu = [], []
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(  # cwd: not a checkout, so each interpreter imports its own installed sqe
            [python, "-m", "sqe.cli", *argv],
            capture_output=True,
            text=True,
            check=False,
            cwd=tempfile.gettempdir(),
            env=env,
        )
        elapsed = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"{python} -m sqe.cli {' '.join(argv)} failed: {done.stderr.strip()[:300]}")
        if i:
            samples.append(elapsed)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(samples) * 1000, statistics.median(cpu) * 1000


def warm_session_ms(config: Path, sql: str, runs: int, **overrides: object) -> float | None:
    try:
        session = sqe.api.connect(config, **overrides)
    except ConfigError:
        return None  # an older checkout without this key
    with session:
        return median_ms(lambda: session.sql(sql).fetchall(), runs)


def duckdb_floor_ms(runs: int) -> float:
    con = duckdb.connect()
    con.execute("CREATE TABLE t3 AS SELECT * FROM (VALUES (1, 'a'), (2, 'b'), (3, 'c')) v(id, name)")
    return median_ms(lambda: con.execute("SELECT count(*) FROM t3 WHERE true").fetchall(), runs)


def row(label: str, value: float | None, note: str = "") -> None:
    shown = f"{value:9.1f} ms" if value is not None else "      n/a   "
    print(f"  {label:<52}{shown}  {note}")


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50, help="warm repetitions (median)")
    parser.add_argument("--cold-runs", type=int, default=5, help="cold process starts per command (median)")
    parser.add_argument("--baseline-python", help="another interpreter (e.g. main's .venv/bin/python) to compare")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sqe-bench-overhead-") as tmp:
        info = start_stack(Path(tmp) / "stack", serve=False)
        try:
            admin = info.principal_config("admin")
            with sqe.api.connect(admin) as session:
                session.sql("CREATE SCHEMA IF NOT EXISTS bench")
                session.sql(f"CREATE TABLE {TABLE} AS SELECT * FROM (VALUES (1, 'a'), (2, 'b'), (3, 'c')) v(id, name)")
            commands = {
                "--help": ["--help"],
                "-e 'SELECT 1'": ["--config", str(admin), "-e", "SELECT 1"],
                f"-e '{TINY}'": ["--config", str(admin), "-e", TINY],
            }
            print(f"cold start (whole process, median of {args.cold_runs}; wall, then CPU)")
            for label, argv in commands.items():
                wall, cpu = cold_ms(sys.executable, argv, args.cold_runs)
                note = f"cpu {cpu:.0f} ms"
                if args.baseline_python:
                    base_wall, base_cpu = cold_ms(args.baseline_python, argv, args.cold_runs)
                    note += (
                        f"; baseline wall {base_wall:.0f} ms, cpu {base_cpu:.0f} ms; baseline/this: "
                        f"wall {ratio(base_wall, wall)} cpu {ratio(base_cpu, cpu)}"
                    )
                row(f"sqe {label}"[:52], wall, note)

            print(f"warm, one session (median of {args.runs})")
            select_1 = warm_session_ms(admin, "SELECT 1", args.runs)
            strict = warm_session_ms(admin, TINY, args.runs)
            fresh = warm_session_ms(admin, TINY, args.runs, catalog__metadata_revalidate_seconds=30)
            floor = duckdb_floor_ms(args.runs)
            row("SELECT 1", select_1)
            row("tiny scan, metadata_revalidate_seconds = 0 (304)", strict)
            row("tiny scan, metadata_revalidate_seconds = 30", fresh, f"vs 0: {ratio(fresh, strict)}")
            row("DuckDB in-memory 3-row table (floor)", floor)
            print(
                f"ratios: sqe-strict/duckdb={ratio(strict, floor)} sqe-revalidate-30/duckdb={ratio(fresh, floor)} "
                f"select-1/duckdb={ratio(select_1, floor)}"
            )
        finally:
            stop_stack(Path(tmp) / "stack")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
