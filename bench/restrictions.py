"""Cost of read-restrictions: the same SQE scan masked and unmasked in one run, and each action's throughput.

Run: .venv/bin/python bench/restrictions.py [--rows N] [--repeat R] [--files F]

Part 1 builds a local Iceberg table (pyiceberg SqlCatalog, file:// warehouse: no network, so only the engine's
cost is measured), then runs one query per case through an SQE session, with the case's column projection and
without any, alternating the two for ``repeat`` rounds. It prints the best wall time of each and the ratio
masked / unmasked (aim: at most 1.15 for the string actions). The query reads the whole column
(``SELECT col FROM t`` into Arrow), so Parquet decoding, masking and DuckDB's export are all in the time.

Part 2 is ``bench/restrictions_actions.py``: each action alone on one Arrow array, in values per second, on one
core (aim: SHA-256 at least 2 million values per second per core).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from sqe.catalog.base import CacheOutcome, LoadedTable, TableIdent
from sqe.restrictions import apply_action
from sqe.session import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
import restrictions_actions  # the per-action benchmark next to this file
from _tables import ReadOnlyProvider  # bench/_tables.py, beside this script

# (action, column): the string actions first; then one of each other kind.
SCAN_CASES: tuple[tuple[str, str], ...] = (
    ("mask-alphanum", "email"),
    ("show-first-4", "email"),
    ("show-last-4", "email"),
    ("mask-alphanum", "mixed"),
    ("show-last-4", "mixed"),
    ("mask-to-fixed-value", "email"),
    ("replace-with-null", "email"),
    ("sha-256-global", "email"),
    ("sha-256-query-local", "email"),
    ("sha-256-global", "n"),
    ("sha-256-query-local", "l"),
    ("truncate-to-month", "ts"),
)
STRING_ACTIONS = ("mask-alphanum", "show-first-4", "show-last-4", "mask-to-fixed-value", "replace-with-null")


class BenchProvider(ReadOnlyProvider):
    """SQE's TableProvider seam over one local SqlCatalog; every load carries the current restrictions."""

    def __init__(self, catalog: SqlCatalog) -> None:
        self.catalog = catalog
        self.restrictions: Mapping[str, Any] | None = None

    def default_warehouse(self) -> str:
        return "bench"

    def load_table(self, ident: TableIdent, *, bypass_cache: bool = False) -> LoadedTable:
        table = self.catalog.load_table((*ident.namespace, ident.name))
        raw: dict[str, Any] = {"metadata-location": table.metadata_location, "config": {}}
        if self.restrictions is not None:
            raw["read-restrictions"] = self.restrictions
        return LoadedTable(
            ident=ident,
            table=table,
            io=table.io,
            credential_source="none",
            usable_until=None,
            expires_at=None,
            cache_outcome=CacheOutcome.RELOADED,
            raw=raw,
        )


def build_table(root: Path, rows: int, files: int) -> tuple[SqlCatalog, Table]:
    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    catalog.create_namespace("ns")
    data = table_data(rows)
    table = catalog.create_table("ns.t", schema=data.schema)
    step = -(-rows // files)
    for start in range(0, rows, step):
        table.append(data.slice(start, step))
    return catalog, table


def table_data(rows: int) -> pa.Table:
    rng = random.Random(7)
    strings = restrictions_actions.ascii_strings(rows, rng)
    mixed = restrictions_actions.mixed_strings(rows, rng)
    micros = [rng.randint(0, 2 * 10**15) for _ in range(rows)]
    return pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "email": strings.cast(pa.string()),
            "mixed": mixed.cast(pa.string()),
            "n": pa.array([rng.randint(-(2**31), 2**31 - 1) for _ in range(rows)], pa.int32()),
            "l": pa.array([rng.getrandbits(62) for _ in range(rows)], pa.int64()),
            "ts": pa.array(micros, pa.int64()).view(pa.timestamp("us", tz="UTC")),
        }
    )


def field_id(table: Table, column: str) -> int:
    return int(table.schema().find_field(column).field_id)


def timed_scan(session: Session, column: str) -> float:
    start = time.perf_counter()
    result = session.sql(f"SELECT {column} FROM ns.t").arrow()
    elapsed = time.perf_counter() - start
    assert result.num_rows > 0
    return elapsed


def scan_ratios(provider: BenchProvider, table: Table, repeat: int) -> None:
    print(f"{'action':<22} {'column':<8} {'unmasked s':>11} {'masked s':>9} {'ratio':>6}")
    with Session(provider) as session:
        for action, column in SCAN_CASES:
            masked_restrictions = {
                "required-column-projections": [{"field-id": field_id(table, column), "action": action}]
            }
            plain, masked = float("inf"), float("inf")
            timed_scan(session, column)  # warm the page cache and DuckDB
            for _ in range(repeat):
                provider.restrictions = None
                plain = min(plain, timed_scan(session, column))
                provider.restrictions = masked_restrictions
                masked = min(masked, timed_scan(session, column))
            provider.restrictions = None
            print(f"{action:<22} {column:<8} {plain:>11.3f} {masked:>9.3f} {masked / plain:>6.2f}")


def action_throughput(rows: int, repeat: int) -> None:
    data = restrictions_actions.columns(rows)
    salt = restrictions_actions.SALT
    print(f"{'action':<22} {'column':<22} {'values/s':>14} {'values/s/core':>14}")
    for action, column in restrictions_actions.CASES:
        array = data[column]

        def run(action: str = action, array: pa.Array = array) -> object:
            return apply_action(action, array, salt=salt)

        wall, cpu = restrictions_actions.best_seconds(run, repeat)
        print(f"{action:<22} {column:<22} {rows / wall:>14,.0f} {rows / max(cpu, 1e-9):>14,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the scanned table and of each array")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--files", type=int, default=4, help="data files of the scanned table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sqe-bench-restrictions-") as tmp:
        catalog, table = build_table(Path(tmp), args.rows, args.files)
        print(f"== SQE scan, {args.rows:,} rows in {args.files} files: masked vs unmasked (best of {args.repeat})")
        scan_ratios(BenchProvider(catalog), table, args.repeat)
    print(f"\n== each action alone on {args.rows:,} values, one core (best of {args.repeat})")
    action_throughput(args.rows, args.repeat)


if __name__ == "__main__":
    main()
