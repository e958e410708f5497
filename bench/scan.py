"""SQE's scan rate against pyarrow and pyiceberg on the same Iceberg table, in one run, for two warehouses.

For each store the same table (``--rows`` rows, default 5 million, in ``--files`` Parquet data files of four
columns: id, x, y, tag) is scanned by

- SQE: a ``Session`` (DuckDB over SQE's streaming scan) running ``SELECT sum(x), count(*) FROM bench.events``
  and a full-row scan ``SELECT * FROM bench.events`` read as an Arrow stream;
- pyarrow: ``pyarrow.dataset`` over exactly the data files SQE planned, with the same credentials (for moto:
  the vended keys SQE's FileIO resolved for those files);
- pyiceberg: ``table.scan().to_arrow()`` (only column x for the aggregate, every column for the full scan).

Stores:

- ``local``: a pyiceberg ``SqlCatalog`` (SQLite + file:// warehouse) behind a small local TableProvider;
- ``moto``: the embedded stack (``sqe_stack.start_stack``: moto S3 + STS and sqe-catalog). The table is written
  by the stack's ``writer`` through vended credentials; every engine reads as ``analyst``.

Each figure is the best of ``--repeat`` runs. Results are cross-checked (same sum and row count everywhere).

    .venv/bin/python bench/scan.py [--rows 5000000] [--files 8] [--stores local,moto] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from _tables import (  # bench/_tables.py, beside this script
    ReadOnlyProvider,
    chunk,
    principal_catalog,
    store_stack,
    vended_filesystem,
)
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from sqe.catalog.base import CacheOutcome, LoadedTable, TableIdent
from sqe.catalog.rest import RestTableProvider
from sqe.config import load_config
from sqe.errors import NoSuchTableError
from sqe.session import Session

NAMESPACE = "bench"
TABLE = "events"
AGG_SQL = f"SELECT sum(x) AS total, count(*) AS n FROM {NAMESPACE}.{TABLE}"
FULL_SQL = f"SELECT * FROM {NAMESPACE}.{TABLE}"


@dataclass(frozen=True)
class Outcome:
    """What a scan found (cross-checked between engines) and how long it took."""

    rows: int
    total: int | None  # sum(x) for the aggregate; None for the full scan
    seconds: float


@dataclass(frozen=True)
class Measured:
    store: str
    query: str
    engine: str
    outcome: Outcome

    @property
    def rows_per_second(self) -> float:
        return self.outcome.rows / self.outcome.seconds


# --------------------------------------------------------------------------------------------------- data


def write_table(catalog: Catalog, rows: int, files: int) -> Table:
    """One append (hence one data file) per chunk."""
    catalog.create_namespace_if_not_exists(NAMESPACE)
    schema = chunk(0, 1).schema
    table = catalog.create_table(f"{NAMESPACE}.{TABLE}", schema=schema)
    per_file = -(-rows // files)
    for start in range(0, rows, per_file):
        table.append(chunk(start, min(per_file, rows - start)))
    return table


# ----------------------------------------------------------------------------------------------- engines


def timed(run: Callable[[], tuple[int, int | None]], repeat: int) -> Outcome:
    best: Outcome | None = None
    for _ in range(repeat):
        started = time.perf_counter()
        rows, total = run()
        outcome = Outcome(rows, total, time.perf_counter() - started)
        if best is None or outcome.seconds < best.seconds:
            best = outcome
    assert best is not None
    return best


def sqe_aggregate(session: Session) -> tuple[int, int | None]:
    [(total, n)] = session.sql(AGG_SQL).fetchall()
    return int(n), int(total)


def sqe_full_scan(session: Session) -> tuple[int, int | None]:
    return sum(batch.num_rows for batch in session.sql(FULL_SQL).reader()), None


def arrow_aggregate(dataset: ds.Dataset) -> tuple[int, int | None]:
    rows = total = 0
    for batch in dataset.to_batches(columns=["x"]):
        rows += batch.num_rows
        total += pc.sum(batch.column(0)).as_py() or 0
    return rows, total


def arrow_full_scan(dataset: ds.Dataset) -> tuple[int, int | None]:
    return sum(batch.num_rows for batch in dataset.to_batches()), None


def iceberg_aggregate(table: Table) -> tuple[int, int | None]:
    data = table.scan(selected_fields=("x",)).to_arrow()
    return data.num_rows, int(pc.sum(data.column("x")).as_py())


def iceberg_full_scan(table: Table) -> tuple[int, int | None]:
    return table.scan().to_arrow().num_rows, None


def measure_all(store: str, session: Session, dataset: ds.Dataset, table: Table, repeat: int) -> list[Measured]:
    engines: dict[str, tuple[Callable[[], tuple[int, int | None]], Callable[[], tuple[int, int | None]]]] = {
        "sqe": (lambda: sqe_aggregate(session), lambda: sqe_full_scan(session)),
        "pyarrow": (lambda: arrow_aggregate(dataset), lambda: arrow_full_scan(dataset)),
        "pyiceberg": (lambda: iceberg_aggregate(table), lambda: iceberg_full_scan(table)),
    }
    results = []
    for engine, (aggregate, full) in engines.items():
        results.append(Measured(store, "sum(x), count(*)", engine, timed(aggregate, repeat)))
        results.append(Measured(store, "full-row scan", engine, timed(full, repeat)))
    check_agreement(results)
    return results


def check_agreement(results: Sequence[Measured]) -> None:
    for query in {m.query for m in results}:
        found = {(m.outcome.rows, m.outcome.total) for m in results if m.query == query}
        if len(found) != 1:
            raise SystemExit(f"engines disagree on {query}: {sorted(found, key=str)}")


def planned_files(session: Session) -> list[str]:
    """The data files SQE planned for the last statement (so pyarrow reads exactly those)."""
    [stream] = session.last_streams
    return [task.file.file_path for task in stream.plan.tasks]


# ------------------------------------------------------------------------------------------ local store


class LocalProvider(ReadOnlyProvider):
    """A TableProvider over a pyiceberg SqlCatalog with a file:// warehouse (no credentials involved)."""

    def __init__(self, catalog: SqlCatalog, warehouse: str = "local") -> None:
        self._catalog = catalog
        self._warehouse = warehouse

    def default_warehouse(self) -> str:
        return self._warehouse

    def load_table(self, ident: TableIdent, *, bypass_cache: bool = False) -> LoadedTable:
        try:
            table = self._catalog.load_table((*ident.namespace, ident.name))
        except Exception:
            raise NoSuchTableError(f"table {ident} does not exist", status=404) from None
        return LoadedTable(ident, table, table.io, "none", None, None, CacheOutcome.RELOADED, raw={})


def run_local(root: Path, rows: int, files: int, repeat: int) -> list[Measured]:
    warehouse = root / "warehouse"
    warehouse.mkdir()
    catalog = SqlCatalog("local", uri=f"sqlite:///{root / 'catalog.db'}", warehouse=f"file://{warehouse}")
    started = time.perf_counter()
    table = write_table(catalog, rows, files)
    print(f"local: wrote {rows:,} rows in {files} files in {time.perf_counter() - started:.1f} s", flush=True)
    with Session(LocalProvider(catalog)) as session:
        sqe_aggregate(session)  # warm-up, and the plan whose files pyarrow reads
        paths = [urlsplit(p).path for p in planned_files(session)]
        dataset = ds.dataset(paths, format="parquet", filesystem=pafs.LocalFileSystem())
        return measure_all("local", session, dataset, table, repeat)


# ------------------------------------------------------------------------------------------- moto store


def run_moto(root: Path, rows: int, files: int, repeat: int) -> list[Measured]:
    with store_stack(root) as info:
        started = time.perf_counter()
        write_table(principal_catalog(info.principal_config("writer")), rows, files)
        print(f"moto: wrote {rows:,} rows in {files} files in {time.perf_counter() - started:.1f} s", flush=True)
        analyst = info.principal_config("analyst")
        table = principal_catalog(analyst).load_table(f"{NAMESPACE}.{TABLE}")
        config = load_config(analyst, env={})
        with Session(RestTableProvider(config), config) as session:
            sqe_aggregate(session)
            paths = planned_files(session)
            filesystem = vended_filesystem(session, paths[0], info.s3_endpoint, info.region)
            dataset = ds.dataset([p.split("://", 1)[1] for p in paths], format="parquet", filesystem=filesystem)
            return measure_all("moto", session, dataset, table, repeat)


# ----------------------------------------------------------------------------------------------- report


def report(results: Sequence[Measured]) -> str:
    header = (
        f"{'store':<6} {'query':<17} {'engine':<10} {'rows':>11} {'seconds':>8} {'Mrows/s':>8} "
        f"{'SQE/pyarrow':>12} {'SQE/pyiceberg':>14}"
    )
    lines = [header, "-" * len(header)]
    for store, query in dict.fromkeys((m.store, m.query) for m in results):
        group = {m.engine: m for m in results if m.store == store and m.query == query}
        sqe = group["sqe"].rows_per_second
        for engine, m in group.items():
            ratios = ("", "")
            if engine == "sqe":
                ratios = (
                    f"{sqe / group['pyarrow'].rows_per_second:.2f}x",
                    f"{sqe / group['pyiceberg'].rows_per_second:.2f}x",
                )
            lines.append(
                f"{store:<6} {query:<17} {engine:<10} {m.outcome.rows:>11,} {m.outcome.seconds:>8.2f} "
                f"{m.rows_per_second / 1e6:>8.2f} {ratios[0]:>12} {ratios[1]:>14}"
            )
    lines.append("ratios: SQE's rows/s divided by the baseline's (above 1: SQE is faster)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/scan.py", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=5_000_000, help="rows in the table (default 5 million)")
    parser.add_argument("--files", type=int, default=8, help="data files (default 8)")
    parser.add_argument("--stores", default="local,moto", help="comma-separated: local, moto")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best counts")
    args = parser.parse_args(argv)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not stores or set(stores) - {"local", "moto"} or args.rows < 1 or args.files < 1 or args.repeat < 1:
        parser.error("--stores takes local and/or moto; --rows, --files and --repeat must be positive")
    runners = {"local": run_local, "moto": run_moto}
    results: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="sqe-bench-scan-") as tmp:
        for store in stores:
            root = Path(tmp) / store
            root.mkdir()
            results += runners[store](root, args.rows, args.files, args.repeat)
    print()
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
