"""Cold scans of one large data file with and without the parallel prefetch of its column chunks, paired.

The stack (``--store moto`` or ``ceph``; ``sqe_stack``) holds a table of ``--rows`` rows (id, x, y, tag) in
``--files`` data files; each is larger than the range cache keeps whole, so it is read range by range. Each round
runs ``agg`` (``sum(x), avg(y)``) and ``select*`` cold (new session, every process cache emptied) once per
variant, in rotating order: ``--parts 0,16`` is the prefetch off (each range fetched when pyarrow asks, one after
another as pyarrow asks; reads close together as one merged read) and on (``[cache] prefetch = true``) with parts
of at most 16 MiB (the default; another N sets the module's part size, for tuning only). Printed: each median and
off / variant (> 1: faster than without the prefetch), the ratio of the medians and the median of each round's
own ratio (runs of one round are back to back, so that one cancels slow drifts in the machine's load). Answers
are cross-checked.

``--remote-like MS,MBPS`` reads through ``bench/_remote_like.py``, a relay adding MS milliseconds to each request
and limiting each connection's answers to MBPS MB/s: a store reached over a network, where a GET's time is
latency and per-connection throughput rather than the loopback store's CPU. moto reads the whole object for every
ranged GET, so there more, smaller GETs cost more. The machine may be shared: read the ratios, not the times.

    .venv/bin/python bench/prefetch.py [--store ceph] [--rows 4000000] [--files 1] [--group-rows 1048576]
        [--rounds 7] [--parts 0,16]
    .venv/bin/python bench/prefetch.py --store ceph --remote-like 20,100
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from _tables import chunk, principal_catalog, store_stack  # bench/_tables.py, beside this script
from pyiceberg.catalog.rest import RestCatalog
from vs_duckdb import NAMESPACE, STORES, SQEEngine

import sqe.execution.cached_files as cached_files
from sqe.config import load_config

QUERIES = ("agg", "select*")


def measure(
    engines: dict[bool, SQEEngine], table: str, rounds: int, variants: list[int]
) -> dict[tuple[str, int], list[float]]:
    """``variants``: 0 is the prefetch off (the engine with ``[cache] prefetch = false``), any other the prefetch
    on with parts of at most that many MiB. ``engines``: by their prefetch setting."""
    times: dict[tuple[str, int], list[float]] = {}
    default_part = cached_files.PREFETCH_PART_BYTES
    try:
        for round_index in range(rounds):
            for query in QUERIES:
                shift = round_index % len(variants)
                answers = []
                for variant in variants[shift:] + variants[:shift]:
                    cached_files.PREFETCH_PART_BYTES = (variant << 20) or default_part  # tuning runs only
                    seconds, answer = engines[variant > 0].run(query, table, 1, 0, "cold")
                    times.setdefault((query, variant), []).append(seconds)
                    answers.append(answer)
                if len(set(answers)) != 1:
                    raise SystemExit(f"{query}: answers differ with and without the prefetch")
    finally:
        cached_files.PREFETCH_PART_BYTES = default_part
    return times


def write_table(catalog: RestCatalog, name: str, rows: int, files: int, group_rows: int) -> None:
    """As ``vs_duckdb.write_table`` (one data file per append, in one transaction), with row groups of at most
    ``group_rows`` rows (pyiceberg's ``write.parquet.row-group-limit``)."""
    catalog.create_namespace_if_not_exists(NAMESPACE)
    properties = {"write.parquet.row-group-limit": str(group_rows)}
    table = catalog.create_table(f"{NAMESPACE}.{name}", schema=chunk(0, 1).schema, properties=properties)
    per_file = -(-rows // files)
    with table.transaction() as tx:
        for start in range(0, rows, per_file):
            tx.append(chunk(start, min(per_file, rows - start)))


@contextlib.contextmanager
def remote_like(endpoint: str, latency_ms: float, mbps: float, workdir: Path) -> Iterator[str]:
    """The store's endpoint behind bench/_remote_like.py (a request waits ``latency_ms``, each connection's
    answers flow at ``mbps`` MB/s), in a process of its own."""
    port_file = workdir / "remote-like.port"
    relay = Path(__file__).with_name("_remote_like.py")
    upstream = urlsplit(endpoint).netloc
    command = [sys.executable, str(relay), "--upstream", upstream, "--port-file", str(port_file)]
    command += ["--latency", str(latency_ms / 1000), "--mbps", str(mbps)]
    process = subprocess.Popen(command)
    try:
        while not (port_file.is_file() and port_file.read_text()):
            if process.poll() is not None:
                raise SystemExit("the remote-like relay did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/prefetch.py", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--store", choices=STORES, default="moto")
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--files", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--group-rows", type=int, default=1 << 20, help="rows per row group (default 1048576)")
    parser.add_argument(
        "--remote-like", default="", metavar="MS,MBPS", help="through a relay: MS per request, MBPS per connection"
    )
    default_parts = f"0,{cached_files.PREFETCH_PART_BYTES >> 20}"
    parser.add_argument("--parts", default=default_parts, help="variants: 0 = prefetch off, N = on with N MiB parts")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sqe-bench-prefetch-") as tmp, store_stack(Path(tmp), args.store) as info:
        table = f"events_{args.files}"
        started = time.perf_counter()
        write_table(principal_catalog(info.principal_config("writer")), table, args.rows, args.files, args.group_rows)
        print(f"wrote {args.rows:,} rows in {args.files} file(s) in {time.perf_counter() - started:.1f} s", flush=True)
        variants = [int(v) for v in args.parts.split(",")]
        with contextlib.ExitStack() as stack:
            overrides = {}
            if args.remote_like:
                latency_ms, mbps = (float(v) for v in args.remote_like.split(","))
                relay = remote_like(info.s3_endpoint, latency_ms, mbps, Path(tmp))
                overrides["storage.endpoint"] = stack.enter_context(relay)
            engines = {}
            for prefetch in (False, True):
                config = load_config(
                    info.principal_config("analyst"), env={}, overrides={**overrides, "cache.prefetch": prefetch}
                )
                engines[prefetch] = SQEEngine(config)
                stack.callback(engines[prefetch].close)
                engines[prefetch].run("agg", table, 1, 0, "cold")  # warm-up: imports, connections
            times = measure(engines, table, args.rounds, variants)
    shaped = f" behind a relay of {args.remote_like} (ms per request, MB/s per connection)" if args.remote_like else ""
    print(f"\n{args.store}{shaped}, {args.rows:,} rows in {args.files} file(s), cold, medians of {args.rounds} rounds")
    print(f"{'query':<8} {'variant':>10} {'ms':>8} {'off/this':>9} {'paired':>7}")
    for query in QUERIES:
        offs = times[(query, 0)]
        off = statistics.median(offs) * 1000
        for variant in variants:
            these = times[(query, variant)]
            this = statistics.median(these) * 1000
            paired = statistics.median(a / b for a, b in zip(offs, these, strict=True))  # the same round's pair
            name = f"{variant} MiB" if variant else "off"
            print(f"{query:<8} {name:>10} {this:8.0f} {off / this:9.2f} {paired:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
