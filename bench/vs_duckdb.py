"""SQE against DuckDB's own Iceberg reader, pyiceberg and pyarrow on the same REST table (issue 11's measure).

One run brings up the embedded stack (``sqe_stack``: moto S3 + STS and sqe-catalog), writes ``--rows`` rows
(id, x, y, tag) as tables of each ``--files`` count, and times four queries on each:

- ``count``: ``SELECT count(*)``;   ``agg``: ``sum(x), avg(y)``;
- ``filter``: a 1,000-row id range (prunable by file statistics);   ``select*``: every row and column.

Engines, each cold (fresh session / connection / table object, empty caches) and on repeat (same one again).
A cold run never times the catalog handshake (``/v1/config`` and the OAuth token): DuckDB's ATTACH, pyiceberg's
``RestCatalog(...)`` and SQE's connected catalog client all happen before the clock starts:

- SQE: a ``Session`` as ``analyst`` (vended credentials), results as an Arrow table;
- DuckDB 1.5.5 with the ``iceberg`` extension ATTACHed to the same sqe-catalog as the same principal with
  vended credentials, once with its external file cache on (the default) and once off. It runs in a separate
  virtualenv (``--duckdb-venv``, built on first use from the extension wheels; the extensions are installed
  from their local ``.duckdb_extension`` files, nothing is downloaded at query time);
- pyiceberg ``to_arrow()`` and ``to_arrow_batch_reader()`` (same principal, vended credentials);
- pyarrow datasets over exactly the files SQE planned, with the keys SQE's FileIO resolved for them.

Rounds are interleaved (every engine once per round, in rotating order) and each figure is the median of
``--rounds``. Ratios are peer time / SQE time in the same mode (> 1: SQE is faster). S3 requests per query
are counted from the store's own request log (the catalog's metadata reads included), split into HEAD and GET.
Results are cross-checked between engines. The machine may be shared: read ratios, not absolute times.

``--store ceph`` runs the same on Ceph RGW instead of moto. moto answers every ranged GET by reading the whole
object, so on moto a footer GET of a large file costs as much as its data; RGW reads only the range, as S3 does.

    .venv/bin/python bench/vs_duckdb.py [--rows 4000000] [--files 1,16,128] [--rounds 5]
    .venv/bin/python bench/vs_duckdb.py --rows 200000 --files 1,4 --rounds 3      # a quick run
    .venv/bin/python bench/vs_duckdb.py --store ceph --files 1,16 --rounds 3      # on Ceph RGW
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from _tables import (  # bench/_tables.py, beside this script
    chunk,
    principal_catalog,
    principal_settings,
    rest_catalog,
    store_stack,
    vended_filesystem,
)
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.table import Table

from sqe.catalog.rest import RestTableProvider
from sqe.config import SQEConfig, load_config
from sqe.execution.cache import clear_process_caches
from sqe.session import Session
from sqe_stack.ceph import RGW_NAME

NAMESPACE = "bench"
DUCKDB_VERSION = "1.5.5"
DUCKDB_WHEELS = [f"duckdb=={DUCKDB_VERSION}", "pyarrow>=17"] + [
    f"duckdb-extension-{name}=={DUCKDB_VERSION}" for name in ("iceberg", "httpfs", "avro")
]
FILTER_ROWS = 1_000
QUERIES = ("count", "agg", "filter", "select*")
MODES = ("cold", "repeat")
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP')  # moto colours some lines
STORES = ("moto", "ceph")

Answer = tuple[int, tuple[Any, ...]]  # rows, and the values of a one-row result (rounded) for cross-checks


def sql_of(query: str, table: str, filter_low: int) -> str:
    if query == "count":
        return f"SELECT count(*) AS n FROM {table}"
    if query == "agg":
        return f"SELECT CAST(sum(x) AS BIGINT) AS sx, avg(y) AS ay FROM {table}"
    if query == "filter":
        return f"SELECT id, x FROM {table} WHERE id >= {filter_low} AND id < {filter_low + FILTER_ROWS}"
    return f"SELECT * FROM {table}"


def answer_of(table: pa.Table) -> Answer:
    if table.num_rows != 1:
        return table.num_rows, ()
    return 1, tuple(_rounded(v) for v in table.to_pylist()[0].values())


def _rounded(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


# --------------------------------------------------------------------------------------------------- data


def write_table(catalog: RestCatalog, name: str, rows: int, files: int) -> None:
    """One data file per append, all in one transaction."""
    catalog.create_namespace_if_not_exists(NAMESPACE)
    table = catalog.create_table(f"{NAMESPACE}.{name}", schema=chunk(0, 1).schema)
    per_file = -(-rows // files)
    with table.transaction() as tx:
        for start in range(0, rows, per_file):
            tx.append(chunk(start, min(per_file, rows - start)))


# ------------------------------------------------------------------------------------------ S3 requests


class RequestLog:
    """Counts S3 requests from the store's own request log (one line per request, written by the server: moto's
    log, or RGW's, whose beast front end logs an access line per request at its default debug level)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = path.stat().st_size

    def mark(self) -> None:
        time.sleep(0.02)  # the server logs a request just after answering it
        self._offset = self._path.stat().st_size

    def since_mark(self) -> dict[str, int]:
        time.sleep(0.02)
        with self._path.open("rb") as fh:
            fh.seek(self._offset)
            text = fh.read().decode("utf-8", "replace")
        counts = {"HEAD": 0, "GET": 0, "other": 0, "data HEAD": 0, "data GET": 0}
        for method, target in _REQUEST.findall(text):
            if method == "POST" and target == "/":  # STS / IAM, not S3
                continue
            counts[method if method in counts else "other"] += 1
            if target.split("?", 1)[0].endswith(".parquet") and method in ("HEAD", "GET"):
                counts[f"data {method}"] += 1
        return counts


# ----------------------------------------------------------------------------------------------- engines


class Engine:
    """One way of running the four queries; ``run`` times one query and returns (seconds, answer)."""

    name: str

    def run(self, query: str, table: str, files: int, filter_low: int, mode: str) -> tuple[float, Answer]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SQEEngine(Engine):
    name = "sqe"

    def __init__(self, config: SQEConfig) -> None:
        self._config = config
        self._session = self._new_session()

    def _new_session(self) -> Session:
        """A new session with its catalog client connected (config + OAuth token), outside the timed part, as
        DuckDB's ATTACH and pyiceberg's ``RestCatalog(...)`` are for the peers."""
        provider = RestTableProvider(self._config)
        provider.catalog(self._config.catalog.warehouse)
        return Session(provider, self._config, on_close=provider.close)  # its pools close with it, not in a GC

    def run(self, query: str, table: str, files: int, filter_low: int, mode: str) -> tuple[float, Answer]:
        if mode == "cold":
            self._session.close()
            clear_process_caches()
            self._session = self._new_session()
        sql = sql_of(query, f"{NAMESPACE}.{table}", filter_low)
        started = time.perf_counter()
        result = self._session.sql(sql).arrow()
        return time.perf_counter() - started, answer_of(result)

    def planned_files(self, table: str, endpoint: str, region: str) -> tuple[list[str], pafs.S3FileSystem]:
        """The data files SQE plans for ``table`` and an S3 filesystem holding the very keys SQE's FileIO
        resolved for them (so pyarrow reads exactly those files with exactly those credentials)."""
        self._session.sql(f"SELECT count(id) FROM {NAMESPACE}.{table}").arrow()  # scans: count(*) need not
        [stream] = self._session.last_streams
        paths = [task.file.file_path for task in stream.plan.tasks]
        filesystem = vended_filesystem(self._session, paths[0], endpoint, region)
        return paths, filesystem

    def close(self) -> None:
        self._session.close()


class DuckDBEngine(Engine):
    """DuckDB in its own virtualenv, driven through ``bench/_duckdb_peer.py``."""

    def __init__(self, python: Path, extensions: list[str], principal: dict[str, Any], cache: bool) -> None:
        self.name = "duckdb" if cache else "duckdb-cache-off"
        self._open_request = {"op": "open", "extensions": extensions, "cache": cache, **principal}
        peer = Path(__file__).with_name("_duckdb_peer.py")
        self._process = subprocess.Popen(
            [str(python), str(peer)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self._call(self._open_request)

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name}: the DuckDB peer exited (status {self._process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise SystemExit(f"{self.name}: {answer.get('error')}")
        return answer

    def run(self, query: str, table: str, files: int, filter_low: int, mode: str) -> tuple[float, Answer]:
        if mode == "cold":
            self._call(self._open_request)
        answer = self._call({"op": "query", "sql": sql_of(query, f"ice.{NAMESPACE}.{table}", filter_low)})
        values = answer["values"]
        rows = int(answer["rows"])
        return float(answer["seconds"]), (rows, tuple(_rounded(v) for v in values) if values else ())

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps({"op": "close"}) + "\n")
            self._process.stdin.close()
            self._process.wait(timeout=30)


class PyIcebergEngine(Engine):
    def __init__(self, catalog: RestCatalog, batches: bool) -> None:
        self.name = "pyiceberg-batches" if batches else "pyiceberg"
        self._catalog = catalog
        self._batches = batches
        self._tables: dict[str, Table] = {}

    def run(self, query: str, table: str, files: int, filter_low: int, mode: str) -> tuple[float, Answer]:
        started = time.perf_counter()
        if mode == "cold" or table not in self._tables:
            self._tables[table] = self._catalog.load_table(f"{NAMESPACE}.{table}")
        loaded = self._tables[table]
        if query == "count":
            scan = loaded.scan(selected_fields=("id",))
        elif query == "agg":
            scan = loaded.scan(selected_fields=("x", "y"))
        elif query == "filter":
            low = filter_low
            row_filter = f"id >= {low} and id < {low + FILTER_ROWS}"
            scan = loaded.scan(row_filter=row_filter, selected_fields=("id", "x"))
        else:
            scan = loaded.scan()
        data = scan.to_arrow_batch_reader().read_all() if self._batches else scan.to_arrow()
        answer = _python_answer(query, data)
        return time.perf_counter() - started, answer


class PyArrowEngine(Engine):
    name = "pyarrow"

    def __init__(self, datasets: dict[str, Callable[[], ds.Dataset]]) -> None:
        self._factories = datasets
        self._datasets: dict[str, ds.Dataset] = {}

    def run(self, query: str, table: str, files: int, filter_low: int, mode: str) -> tuple[float, Answer]:
        started = time.perf_counter()
        if mode == "cold" or table not in self._datasets:
            self._datasets[table] = self._factories[table]()
        dataset = self._datasets[table]
        if query == "count":
            answer: Answer = (1, (dataset.count_rows(),))
        elif query == "agg":
            answer = _python_answer(query, dataset.to_table(columns=["x", "y"]))
        elif query == "filter":
            expression = (ds.field("id") >= filter_low) & (ds.field("id") < filter_low + FILTER_ROWS)
            answer = _python_answer(query, dataset.to_table(columns=["id", "x"], filter=expression))
        else:
            answer = _python_answer(query, dataset.to_table())
        return time.perf_counter() - started, answer


def _python_answer(query: str, data: pa.Table) -> Answer:
    """What the SQL query would return, computed from the rows a library read."""
    if query == "count":
        return 1, (data.num_rows,)
    if query == "agg":
        return 1, (_rounded(pc.sum(data.column("x")).as_py()), _rounded(pc.mean(data.column("y")).as_py()))
    return data.num_rows, ()


# ------------------------------------------------------------------------------------------- measuring


@dataclass
class Cell:
    """One (table, query, mode, engine): the seconds of every round, the S3 requests of the first."""

    seconds: list[float] = field(default_factory=list)
    requests: dict[str, int] | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def measure(
    engines: Sequence[Engine], tables: dict[int, str], rows: int, rounds: int, log: RequestLog
) -> dict[tuple[int, str, str, str], Cell]:
    cells: dict[tuple[int, str, str, str], Cell] = {}
    for files, table in tables.items():
        filter_low = rows // 2
        for query in QUERIES:
            answers: dict[str, Answer] = {}
            for round_index in range(rounds):
                order = list(engines[round_index % len(engines) :]) + list(engines[: round_index % len(engines)])
                for engine in order:
                    for mode in MODES:
                        cell = cells.setdefault((files, query, mode, engine.name), Cell())
                        log.mark()
                        seconds, answer = engine.run(query, table, files, filter_low, mode)
                        if cell.requests is None:
                            cell.requests = log.since_mark()
                        cell.seconds.append(seconds)
                        answers[engine.name] = answer
            check_agreement(files, query, answers)
            print(f"  measured {files} file(s) {query}", flush=True)
    return cells


def check_agreement(files: int, query: str, answers: dict[str, Answer]) -> None:
    if len(set(answers.values())) != 1:
        raise SystemExit(f"engines disagree on {query} at {files} file(s): {answers}")


# ----------------------------------------------------------------------------------------------- report

PEERS = ("duckdb-cache-off", "duckdb", "pyarrow", "pyiceberg", "pyiceberg-batches")


def report(cells: dict[tuple[int, str, str, str], Cell], tables: dict[int, str]) -> list[str]:
    header = f"{'files':>5} {'query':<8} {'mode':<6} {'SQE ms':>8} {'SQE req':>9} {'data':>7} " + " ".join(
        f"{peer:>17}" for peer in PEERS
    )
    lines = [
        "time ratio peer/SQE (> 1: SQE faster) and S3 requests per query (HEAD+GET) of each engine;",
        "'data': SQE's requests on data files alone",
        header,
        "-" * len(header),
    ]
    for files in tables:
        for query in QUERIES:
            for mode in MODES:
                sqe = cells[(files, query, mode, "sqe")]
                row = f"{files:>5} {query:<8} {mode:<6} {sqe.median * 1000:>8.1f} {_requests(sqe):>9} "
                row += f"{_requests(sqe, 'data '):>7} "
                peers = [cells[(files, query, mode, p)] for p in PEERS]
                row += " ".join(f"{peer.median / sqe.median:>6.2f}x {_requests(peer):>9}" for peer in peers)
                lines.append(row)
    lines.append(worst_line(cells))
    return lines


def _requests(cell: Cell, kind: str = "") -> str:
    """HEAD+GET requests of the cell's first run (``kind="data "``: those on data files only)."""
    counts = cell.requests or {}
    return f"{counts.get(kind + 'HEAD', 0)}+{counts.get(kind + 'GET', 0)}"


def worst_line(cells: dict[tuple[int, str, str, str], Cell]) -> str:
    def worst(peer: str, modes: tuple[str, ...]) -> float:
        return min(
            cell.median / cells[(files, query, mode, "sqe")].median
            for (files, query, mode, engine), cell in cells.items()
            if engine == peer and mode in modes
        )

    pyiceberg = min(worst("pyiceberg", MODES), worst("pyiceberg-batches", MODES))
    return (
        f"worst ratio: duckdb-cache-off={worst('duckdb-cache-off', MODES):.2f} "
        f"duckdb-repeat={worst('duckdb', ('repeat',)):.2f} pyarrow={worst('pyarrow', MODES):.2f} "
        f"pyiceberg={pyiceberg:.2f}"
    )


# --------------------------------------------------------------------------------------------- set-up


def duckdb_python(venv: Path) -> Path:
    """The separate DuckDB virtualenv's python, built with pip on first use (the wheels pin DuckDB 1.5.5)."""
    python = venv / "bin" / "python"
    stamp = venv / f".installed-{DUCKDB_VERSION}"
    if not stamp.exists():
        print(f"building the DuckDB {DUCKDB_VERSION} virtualenv in {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *DUCKDB_WHEELS], check=True)
        stamp.touch()
    return python


def extension_files(python: Path) -> list[str]:
    """Local paths of the httpfs, avro and iceberg ``.duckdb_extension`` files the wheels ship."""
    code = (
        "import importlib, pathlib, json; "
        "print(json.dumps([str(next(pathlib.Path(importlib.import_module('duckdb_extension_' + n).__path__[0])"
        ".rglob('*.duckdb_extension'))) for n in ('httpfs', 'avro', 'iceberg')]))"
    )
    found: list[str] = json.loads(subprocess.run([str(python), "-c", code], check=True, capture_output=True).stdout)
    return found


def request_log_path(stack_dir: Path, store: str) -> Path:
    """The file the store writes a line per request to: moto's log, or the RGW daemon's log under the stack."""
    if store == "moto":
        return stack_dir / "logs" / "moto.log"
    return stack_dir / "ceph" / "log" / f"{RGW_NAME}.log"


def run(args: argparse.Namespace) -> list[str]:
    python = duckdb_python(Path(args.duckdb_venv))
    extensions = extension_files(python)
    engines: list[Engine] = []
    with tempfile.TemporaryDirectory(prefix="sqe-bench-duckdb-") as tmp, store_stack(Path(tmp), args.store) as info:
        writer = principal_catalog(info.principal_config("writer"))
        tables = {files: f"events_{files}" for files in args.files}
        for files, name in tables.items():
            started = time.perf_counter()
            write_table(writer, name, args.rows, files)
            print(f"wrote {args.rows:,} rows in {files} file(s) in {time.perf_counter() - started:.1f} s", flush=True)
        analyst = principal_settings(info.principal_config("analyst"))
        try:
            sqe = SQEEngine(load_config(info.principal_config("analyst"), env={}))
            engines.append(sqe)
            factories: dict[str, Callable[[], ds.Dataset]] = {}
            for name in tables.values():
                paths, filesystem = sqe.planned_files(name, info.s3_endpoint, info.region)

                def factory(paths: list[str] = paths, filesystem: pafs.S3FileSystem = filesystem) -> ds.Dataset:
                    keys = [p.split("://", 1)[1] for p in paths]
                    return ds.dataset(keys, format="parquet", filesystem=filesystem)

                factories[name] = factory
            principal = {k: analyst[k] for k in ("client_id", "client_secret", "scope", "warehouse")}
            principal["catalog_uri"] = analyst["uri"]
            engines += [
                DuckDBEngine(python, extensions, principal, cache=False),
                DuckDBEngine(python, extensions, principal, cache=True),
                PyArrowEngine(factories),
                PyIcebergEngine(rest_catalog(analyst), batches=False),
                PyIcebergEngine(rest_catalog(analyst), batches=True),
            ]
            log = RequestLog(request_log_path(info.dir, args.store))
            cells = measure(engines, tables, args.rows, args.rounds, log)
        finally:
            for engine in engines:
                engine.close()
    return report(cells, tables)


def main(argv: Sequence[str] | None = None) -> int:
    summary = __doc__.splitlines()[0] if __doc__ else None
    parser = argparse.ArgumentParser(prog="bench/vs_duckdb.py", description=summary)
    parser.add_argument("--rows", type=int, default=4_000_000, help="rows in each table (default 4 million)")
    parser.add_argument("--files", default="1,16,128", help="comma-separated data-file counts (default 1,16,128)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median counts (default 5)")
    parser.add_argument("--store", choices=STORES, default="moto", help="the object store (default moto)")
    parser.add_argument(
        "--duckdb-venv",
        default=str(Path(tempfile.gettempdir()) / f"sqe-bench-duckdb-{DUCKDB_VERSION}"),
        help="the separate DuckDB virtualenv (built on first use)",
    )
    args = parser.parse_args(argv)
    try:
        args.files = [int(f) for f in args.files.split(",") if f.strip()]
    except ValueError:
        parser.error("--files takes comma-separated integers")
    if not args.files or min(args.files) < 1 or args.rows < max(args.files) or args.rounds < 1:
        parser.error("--files must be positive and at most --rows; --rounds must be positive")
    lines = run(args)
    print()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
