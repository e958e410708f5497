"""One full ``SELECT *`` read as a stream, in a process of its own, for ``bench/scan_memory.py``.

    python bench/_peak_rss.py ENGINE CONFIG TABLE

ENGINE is ``sqe`` (default caches), ``sqe-no-cache`` (the byte, decoded and manifest caches off),
``pyiceberg-batches`` (``to_arrow_batch_reader()``) or ``pyiceberg`` (``to_arrow()``, the whole table at once);
CONFIG a principal's SQE config file (the stack's ``analyst``). Everything before the scan (imports, the catalog
client, its token) is done first; then the process's peak resident size is reset to its current size (Linux
``clear_refs``, where allowed) and the scan runs, each batch dropped once counted. Prints one JSON line: rows,
the resident size the peak was reset to, the peak after the scan (KiB) and the seconds the scan took.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from _tables import principal_catalog  # the bench's folder is first on sys.path
from vs_duckdb import NAMESPACE

import sqe.api

_NO_CACHES = {"data_bytes": 0, "decoded_bytes": 0, "manifest_bytes": 0}


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` figure in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise SystemExit(f"/proc/self/status has no {field}")


def reset_peak() -> bool:
    """Make VmHWM the current resident size (Linux 4.0+); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def scan_of(engine: str, config: Path, table: str) -> Callable[[], Iterator[pa.RecordBatch]]:
    """The engine's full scan of ``table``, ready to run: everything it needs before the scan is done here."""
    name = f"{NAMESPACE}.{table}"
    if engine in ("sqe", "sqe-no-cache"):
        session = sqe.api.connect(config, **({"cache": _NO_CACHES} if engine == "sqe-no-cache" else {}))
        session.sql("SELECT 1").fetchall()  # DuckDB's connection and the session's first statement
        return lambda: iter(session.sql(f"SELECT * FROM {name}").reader())
    catalog = principal_catalog(config)
    catalog.load_table(name)  # the token and the client's first request
    if engine == "pyiceberg-batches":
        return lambda: iter(catalog.load_table(name).scan().to_arrow_batch_reader())
    if engine == "pyiceberg":
        return lambda: iter(catalog.load_table(name).scan().to_arrow().to_batches())
    raise SystemExit(f"unknown engine {engine!r}")


def main() -> int:
    engine, config, table = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    scan = scan_of(engine, config, table)
    reset = reset_peak()
    before = status_kib("VmRSS") if reset else status_kib("VmHWM")
    started = time.perf_counter()
    rows = 0
    for batch in scan():
        rows += batch.num_rows
        del batch
    seconds = time.perf_counter() - started
    result = {"rows": rows, "before_kib": before, "peak_kib": status_kib("VmHWM"), "seconds": seconds, "reset": reset}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
