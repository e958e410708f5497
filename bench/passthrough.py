"""Pass-through queries (issue 11 item 1): the same statements with SQE's pass-through on and forced to DuckDB.

One run brings up the embedded stack (moto S3 + STS and sqe-catalog), writes ``--rows`` rows (id, x, y, tag;
``bench/vs_duckdb.py``'s table) in ``--files`` data files, and times, as ``analyst`` with vended credentials:

- ``select*``: ``SELECT * FROM t``;
- ``filter``: ``SELECT id, tag FROM t WHERE x >= 500`` (about half the rows);
- ``limit``: ``SELECT id, x FROM t WHERE x > 100 LIMIT 100000``;
- ``not/like``: ``SELECT id, tag FROM t WHERE tag NOT LIKE 'tag-00%' AND NOT (y < 0.25)`` (a NOT LIKE and a
  NOT over a double: about two thirds of the rows);

each read as an Arrow table (wall time, and process CPU time of all threads), once with
``Session.pass_through`` on and once off (DuckDB imports the scan and exports the result, as before), plus
the bare scan (``ScanStream.reader().read_all()``: the floor). Rounds are interleaved in rotating order;
figures are medians. Results are cross-checked (row counts, schemas, and for the non-LIMIT queries the
sorted rows). The machine may be shared: read the ratios. moto serves S3 from Python in another process, so
wall time mostly measures moto; the CPU time is this process's own work.

    .venv/bin/python bench/passthrough.py [--rows 4000000] [--files 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
from _tables import principal_catalog, store_stack  # the bench's folder
from vs_duckdb import NAMESPACE, write_table

from sqe.catalog.rest import RestTableProvider
from sqe.config import load_config
from sqe.execution.stream import ScanStream
from sqe.session import Session

QUERIES = {
    "select*": "SELECT * FROM {t}",
    "filter": "SELECT id, tag FROM {t} WHERE x >= 500",
    "limit": "SELECT id, x FROM {t} WHERE x > 100 LIMIT 100000",
    "not/like": "SELECT id, tag FROM {t} WHERE tag NOT LIKE 'tag-00%' AND NOT (y < 0.25)",
}
PATHS = ("pass-through", "duckdb", "scan only")


def timed(run: Callable[[], pa.Table]) -> tuple[float, float, pa.Table]:
    """Wall and process CPU seconds (every thread: readers, DuckDB's, the caller's) of one run."""
    started, cpu = time.perf_counter(), time.process_time()
    table = run()
    return time.perf_counter() - started, time.process_time() - cpu, table


def run_one(session: Session, sql: str, path: str, scan: ScanStream) -> tuple[float, float, pa.Table]:
    if path == "scan only":
        return timed(lambda: scan.reader().read_all())
    session.pass_through = path == "pass-through"
    measured = timed(lambda: session.sql(sql).arrow())
    assert session.last_execution_path == ("pass-through" if session.pass_through else "duckdb"), sql
    return measured


def check(query: str, results: dict[str, pa.Table]) -> None:
    fast, duck = results["pass-through"], results["duckdb"]
    assert fast.schema == duck.schema, (query, fast.schema, duck.schema)
    assert fast.num_rows == duck.num_rows, (query, fast.num_rows, duck.num_rows)
    if query != "limit":
        keys = [(name, "ascending") for name in fast.schema.names]
        assert fast.sort_by(keys).equals(duck.sort_by(keys)), query


Times = dict[tuple[str, str, str], list[float]]  # (query, path, "wall" | "cpu") -> seconds per round


def measure(session: Session, table: str, rounds: int) -> Times:
    times: Times = {}
    for query, template in QUERIES.items():
        sql = template.format(t=f"{NAMESPACE}.{table}")
        session.pass_through = False
        session.sql(sql).arrow()  # warm: catalog entry, task cache, footers
        [scan] = session.last_streams
        assert isinstance(scan, ScanStream)
        for round_no in range(rounds):
            order = PATHS[round_no % len(PATHS) :] + PATHS[: round_no % len(PATHS)]
            results: dict[str, pa.Table] = {}
            for path in order:
                wall, cpu, results[path] = run_one(session, sql, path, scan)
                times.setdefault((query, path, "wall"), []).append(wall)
                times.setdefault((query, path, "cpu"), []).append(cpu)
            if round_no == 0:
                check(query, results)
    return times


def report(times: Times) -> list[str]:
    lines = [f"{'query':8s} {'time':5s} {'pass-through':>13s} {'duckdb':>9s} {'scan only':>10s} {'duckdb/pass':>12s}"]
    for query in QUERIES:
        for kind in ("wall", "cpu"):
            median = {path: statistics.median(times[(query, path, kind)]) for path in PATHS}
            ratio = median["duckdb"] / median["pass-through"]
            lines.append(
                f"{query:8s} {kind:5s} {median['pass-through']:12.3f}s {median['duckdb']:8.3f}s "
                f"{median['scan only']:9.3f}s {ratio:11.2f}x"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/passthrough.py", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000, help="rows in the table (default 4 million)")
    parser.add_argument("--files", type=int, default=4, help="data files (default 4)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median counts (default 5)")
    args = parser.parse_args(argv)
    if args.files < 1 or args.rows < args.files or args.rounds < 1:
        parser.error("--files and --rounds must be positive and --files at most --rows")
    with tempfile.TemporaryDirectory(prefix="sqe-bench-passthrough-") as tmp, store_stack(Path(tmp)) as info:
        write_table(principal_catalog(info.principal_config("writer")), "events", args.rows, args.files)
        config = load_config(info.principal_config("analyst"), env={})
        with Session(RestTableProvider(config), config) as session:
            lines = report(measure(session, "events", args.rounds))
    print(f"{args.rows:,} rows in {args.files} file(s), medians of {args.rounds} interleaved rounds")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
