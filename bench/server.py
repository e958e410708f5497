"""Flight SQL (``sqe serve`` + the ADBC driver) against an embedded ``Session``: scan rate and tiny-query latency.

Starts the embedded stack (moto + sqe-catalog + its ``sqe serve``, acting as reader ``sqe-engine``, so every
Flight query runs on the analyst's delegated token) on loopback, writes ``bench.events``
(``--rows`` rows) as the stack's writer, then, as the analyst, runs the same full scan and the same aggregate
through ADBC and through an embedded session (best of ``--repeat``), and a tiny query (``SELECT 1``) 50 times
each way. Prints rows/s, the Flight/embedded ratio and median latencies; asserts nothing.

    .venv/bin/python bench/server.py [--rows 2000000] [--repeat 3] [--workers N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog

import sqe.api
from sqe.session import Session
from sqe_stack import apply_client_env, start_stack, stop_stack

SCANS = {
    "full scan": "SELECT * FROM bench.events",
    "aggregate": "SELECT region, count(*), sum(amount) FROM bench.events GROUP BY region",
}


def _write_table(info: object, rows: int) -> None:
    writer = info.principal_credentials("writer")  # type: ignore[attr-defined]
    catalog = RestCatalog(
        "bench", uri=info.catalog_uri, warehouse=info.warehouse, credential=writer.credential,  # type: ignore[attr-defined]
        scope="PRINCIPAL_ROLE:ALL", **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
    )  # fmt: skip
    catalog.create_namespace("bench")
    data = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "region": pa.array([("EU", "US", "APAC")[i % 3] for i in range(rows)]),
            "amount": pa.array([(i * 37) % 1000 for i in range(rows)], pa.int64()),
        }
    )
    catalog.create_table("bench.events", schema=data.schema).append(data)


def embedded(session: Session, sql: str) -> int:
    return int(session.sql(sql).arrow().num_rows)


def _best(run: Callable[[], int], repeat: int) -> tuple[float, int]:
    best, rows = float("inf"), 0
    for _ in range(repeat):
        started = time.perf_counter()
        rows = run()
        best = min(best, time.perf_counter() - started)
    return best, rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="scan workers of the stack's server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sqe-bench-server-") as tmp:
        workdir = Path(tmp)
        info = start_stack(workdir / "stack", workers=args.workers)
        apply_client_env(info.store)
        try:
            _write_table(info, args.rows)
            analyst = info.principal_credentials("analyst")
            conn = flightsql.connect(
                info.server_url, db_kwargs={"username": analyst.client_id, "password": analyst.client_secret}
            )
            session = sqe.api.connect(info.principal_config("analyst"))
            cur = conn.cursor()

            def remote(sql: str) -> int:
                cur.execute(sql)
                return int(cur.fetch_arrow_table().num_rows)

            for name, sql in SCANS.items():
                flight_s, rows = _best(partial(remote, sql), args.repeat)
                local_s, _ = _best(partial(embedded, session, sql), args.repeat)
                print(
                    f"{name:10s} rows={rows:>9,d}  flight {args.rows / flight_s:>12,.0f} rows/s   embedded "
                    f"{args.rows / local_s:>12,.0f} rows/s   flight/embedded {local_s / flight_s:.2f}"
                )
            for label, run in (
                ("flight", lambda: remote("SELECT 1")),
                ("embedded", lambda: session.sql("SELECT 1").arrow().num_rows),
            ):
                samples = []
                for _ in range(50):
                    started = time.perf_counter()
                    run()
                    samples.append(time.perf_counter() - started)
                print(f"tiny query {label:8s} median {statistics.median(samples) * 1000:.2f} ms (50 runs)")
            cur.close()
            conn.close()
            session.close()
        finally:
            stop_stack(workdir / "stack")


if __name__ == "__main__":
    main()
