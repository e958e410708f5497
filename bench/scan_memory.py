"""Peak memory of a full-table scan read as a stream, as the table grows (issue 11: "peak RSS stays bounded by
files in flight, not table size"; measured, not asserted).

One run brings up the embedded stack, writes one table per ``--rows`` figure (id, x, y, tag; ``--rows-per-file``
rows in each data file, so a larger table has more files of the same size), and reads each with a full
``SELECT *`` in a fresh process per engine and table (``bench/_peak_rss.py``), batches dropped as they come:

- ``sqe``: a session as ``analyst`` with its default caches (data-file ranges, decoded columns, manifests: each
  bounded, 256 / 256 / 32 MiB), the result read with ``Result.reader()``;
- ``sqe-no-cache``: the same with those caches off, so only the scan's own buffers remain (4 files in flight,
  8 batches queued);
- ``pyiceberg-batches``: ``to_arrow_batch_reader()``;   ``pyiceberg``: ``to_arrow()`` (the whole table at once).

Each cell is the growth of the process's peak resident size during the scan, in MiB (the peak is reset after
everything before the scan is done). The last line gives each engine's growth from the smallest table to the
largest: flat means bounded by what is in flight, not by the table. Rows are checked against the table.

    .venv/bin/python bench/scan_memory.py [--rows 1000000,8000000] [--rows-per-file 250000] [--store moto]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _tables import principal_catalog, store_stack  # bench/_tables.py, beside this script
from vs_duckdb import STORES, write_table

ENGINES = ("sqe", "sqe-no-cache", "pyiceberg-batches", "pyiceberg")
CHILD = Path(__file__).with_name("_peak_rss.py")


def peak_growth_mib(engine: str, config: Path, table: str, rows: int) -> tuple[float, float]:
    """(peak growth in MiB, seconds) of one streamed full scan in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(CHILD.parent)}
    done = subprocess.run(
        [sys.executable, str(CHILD), engine, str(config), table], capture_output=True, text=True, check=False, env=env
    )
    if done.returncode != 0:
        raise SystemExit(f"{engine} on {table} failed: {done.stderr.strip()[-600:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["rows"] != rows:
        raise SystemExit(f"{engine} read {result['rows']:,} rows of {table}, which holds {rows:,}")
    return (result["peak_kib"] - result["before_kib"]) / 1024, float(result["seconds"])


def run(args: argparse.Namespace) -> list[str]:
    growth: dict[tuple[int, str], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="sqe-bench-memory-") as tmp, store_stack(Path(tmp), args.store) as info:
        writer = principal_catalog(info.principal_config("writer"))
        for rows in args.rows:
            started = time.perf_counter()
            write_table(writer, f"m_{rows}", rows, files_of(rows, args.rows_per_file))
            print(f"wrote {rows:,} rows in {time.perf_counter() - started:.1f} s", flush=True)
        analyst = info.principal_config("analyst")
        for rows in args.rows:
            for engine in ENGINES:
                growth[rows, engine] = peak_growth_mib(engine, analyst, f"m_{rows}", rows)
                print(f"  {rows:>11,} rows  {engine:<18} {growth[rows, engine][0]:8.1f} MiB", flush=True)
    return report(growth, args.rows, args.rows_per_file)


def files_of(rows: int, rows_per_file: int) -> int:
    return max(1, -(-rows // rows_per_file))


def report(growth: dict[tuple[int, str], tuple[float, float]], tables: list[int], rows_per_file: int) -> list[str]:
    head = f"{'rows':>11} {'files':>5}  " + "".join(f"{engine:>19}" for engine in ENGINES)
    lines = ["peak resident growth during one streamed SELECT * (MiB; seconds in brackets)", head, "-" * len(head)]
    for rows in tables:
        cells = "".join(f"{growth[rows, e][0]:>10.1f} ({growth[rows, e][1]:5.2f}s)" for e in ENGINES)
        lines.append(f"{rows:>11,} {files_of(rows, rows_per_file):>5}  {cells}")
    smallest, largest = min(tables), max(tables)
    changes = " ".join(f"{e}={growth[largest, e][0] - growth[smallest, e][0]:+.1f}" for e in ENGINES)
    lines.append(f"growth from {smallest:,} to {largest:,} rows (MiB): {changes}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    summary = __doc__.splitlines()[0] if __doc__ else None
    parser = argparse.ArgumentParser(prog="bench/scan_memory.py", description=summary)
    parser.add_argument("--rows", default="1000000,8000000", help="comma-separated table sizes in rows")
    parser.add_argument("--rows-per-file", type=int, default=250_000, help="rows in each data file (default 250000)")
    parser.add_argument("--store", choices=STORES, default="moto", help="the object store (default moto)")
    args = parser.parse_args(argv)
    try:
        args.rows = sorted({int(r) for r in args.rows.split(",") if r.strip()})
    except ValueError:
        parser.error("--rows takes comma-separated integers")
    if len(args.rows) < 2 or args.rows[0] < 1 or args.rows_per_file < 1:
        parser.error("--rows needs two or more positive sizes; --rows-per-file must be positive")
    print("\n" + "\n".join(run(args)))  # the table after the progress lines
    return 0


if __name__ == "__main__":
    sys.exit(main())
