"""``PreparedStatement.execute_many`` of ``INSERT INTO t VALUES ($1, $2, $3)``: rows per second, old and new path.

A real local Iceberg table (pyiceberg SqlCatalog on SQLite + file://, as the unit tests use). For each batch size
the same rows are inserted twice into fresh tables of one session: once one DuckDB execution per parameter row
(``Session.columnar_batches = False``, the path every batch took before), once as one INSERT over the rows as
Arrow columns. Each batch is one Iceberg commit either way, and the time includes it.

    .venv/bin/python bench/execute_many.py [--rows 1000 10000] [--runs 3]

Timings are printed (median of ``--runs``), never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqe.session import Session  # noqa: E402
from tests.unit.sqe.iceberg_local import LocalProvider  # noqa: E402


def seconds(session: Session, rows: list[list[object]], *, columnar: bool, runs: int) -> float:
    session.columnar_batches = columnar
    samples = []
    for run in range(runs):
        table = f"ns.t_{'new' if columnar else 'old'}_{len(rows)}_{run}"
        session.sql(f"CREATE TABLE {table} (id BIGINT, name VARCHAR, score DOUBLE)")
        insert = session.prepare(f"INSERT INTO {table} VALUES ($1, $2, $3)")
        started = time.perf_counter()
        count = insert.execute_many(rows).fetchall()
        samples.append(time.perf_counter() - started)
        if count != [(len(rows),)]:
            raise SystemExit(f"{table}: inserted {count}, expected {len(rows)}")
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        provider = LocalProvider(Path(root), warehouses=("wh",))
        provider.catalogs["wh"].create_namespace("ns")
        session = Session(provider)
        try:
            seconds(session, [[0, "warm-up", 0.0], [1, None, None]], columnar=True, runs=1)  # imports, first plan
            print(f"{'rows':>8} {'old rows/s':>12} {'new rows/s':>12} {'speed-up':>9}")
            for count in args.rows:
                rows: list[list[object]] = [[i, f"name {i}", i * 0.5 if i % 7 else None] for i in range(count)]
                old = seconds(session, rows, columnar=False, runs=args.runs)
                new = seconds(session, rows, columnar=True, runs=args.runs)
                print(f"{count:>8} {count / old:>12,.0f} {count / new:>12,.0f} {old / new:>8.1f}x")
        finally:
            session.close()


if __name__ == "__main__":
    main()
