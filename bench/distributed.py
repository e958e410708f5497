"""Distributed scans: local vs two workers on one query, catalog/STS traffic during a long scan, and efficiency.

Starts the embedded stack (moto by default, or Ceph RGW) with short-lived vended credentials, a second
``sqe-catalog`` process on the same database logging at debug level (so every request and every AssumeRole is
counted from its log), and two ``sqe-worker`` processes on loopback. Then:

1. the same aggregate query locally and on the two workers, median of ``--runs``, printed with the ratio;
2. a paced distributed scan lasting ``--lifetimes`` credential lifetimes, with the number of AssumeRole calls,
   catalog round trips (load-table + credentials endpoint) and pushes, per credential lifetime. The target is one
   refresh per (user, table) per lifetime, however many files, fragments and workers.

    .venv/bin/python bench/distributed.py [--store moto|ceph] [--lifetime 10] [--files 24] [--rows 20000]

``--efficiency`` instead measures what a cluster's scaling can be predicted from, on two cores: the coordinator
pinned to core 0 (``taskset -c 0``) and one ``sqe-worker`` pinned to core 1 run each query through the worker;
the same query then runs locally in a process pinned to core 0, with the data-range and decoded-column caches
warm (a repeat query, as in a session) and off (every run reads and decodes its files: a table larger than
the caches; footers stay cached). Printed per query: rows/s per worker core over
local rows/s per core (target >= 0.9), and the coordinator's and the worker's CPU seconds per million rows
(``resource.getrusage`` of the coordinator process, ``/proc/<pid>/stat`` of the worker). The store and the
catalog are not pinned and share both cores; each timed figure is the median of ``--runs`` after a warm-up.

    .venv/bin/python bench/distributed.py --efficiency [--eff-rows 4000000] [--eff-files 8] [--runs 3]
        [--compare-partial]   # also the same stack with [coordinator] partial_aggregation = false
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog.rest import RestCatalog

from sqe.catalog.rest import RestTableProvider
from sqe.config import SQEConfig, load_config
from sqe.distributed.coordinator import DistributedOptions
from sqe.session import Session
from sqe_stack import StackInfo, apply_client_env, start_stack, stop_stack
from sqe_stack.catalog import spawn_catalog, wait_for_catalog
from sqe_stack.provision import free_port, stop_daemon

QUERY = "SELECT region, count(*) AS n, sum(amount) AS total, max(note) AS last FROM bench.events GROUP BY region"
_REQUEST = re.compile(r"GET /v1/[^ ]+/namespaces/bench/tables/events(/credentials)? -> (\d+)")


def writer_catalog(info: StackInfo) -> RestCatalog:
    """pyiceberg's REST catalog as the stack's ``writer`` principal, with vended credentials."""
    writer = info.principal_credentials("writer")
    return RestCatalog(
        "bench", uri=info.catalog_uri, warehouse=info.warehouse, credential=writer.credential,
        scope="PRINCIPAL_ROLE:ALL", **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
    )  # fmt: skip


def write_table(info: StackInfo, files: int, rows: int) -> None:
    catalog = writer_catalog(info)
    catalog.create_namespace("bench")
    schema = pa.schema([("id", pa.int64()), ("region", pa.string()), ("amount", pa.int64()), ("note", pa.string())])
    catalog.create_table("bench.events", schema=schema)
    for n in range(files):
        ids = pa.array(range(n * rows, (n + 1) * rows), pa.int64())
        data = pa.table(
            {
                "id": ids,
                "region": pa.array([("EU", "US", "APAC")[i % 3] for i in range(rows)]),
                "amount": pa.array([(i * 37) % 1000 for i in range(rows)], pa.int64()),
                "note": pa.array([f"note-{n}-{i}" for i in range(rows)]),
            },
            schema=schema,
        )
        catalog.load_table("bench.events").append(data)  # a fresh load each time: short-lived credentials


def debug_catalog(info: StackInfo, workdir: Path) -> tuple[Any, str, Path]:
    """A second sqe-catalog on the stack's database, logging every request and vend at debug level."""
    text = Path(info.catalog_config).read_text()
    port = free_port()
    text = re.sub(r"(?m)^port = \d+", f"port = {port}", text, count=1)
    text = re.sub(r'(?m)^log_level = "\w+"', 'log_level = "debug"', text, count=1)
    config = workdir / "catalog-debug.toml"
    config.write_text(text)
    config.chmod(0o600)
    (workdir / "logs").mkdir(exist_ok=True)
    daemon = spawn_catalog(workdir, config, {})
    return daemon, wait_for_catalog(workdir, port, daemon), workdir / "logs" / "catalog.log"


def start_workers(
    workdir: Path, token: str, count: int, started: list[tuple[subprocess.Popen[bytes], str]]
) -> list[tuple[subprocess.Popen[bytes], str]]:
    """``count`` workers, each added to ``started`` as it starts (the caller stops them even when a later one
    fails to start)."""
    token_file = workdir / "worker-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    for n in range(count):
        port_file = workdir / f"worker-{n}.port"
        command = [sys.executable, "-m", "workers.cli", "--listen", "127.0.0.1:0", "--token-file", str(token_file)]
        command += ["--port-file", str(port_file), "--max-files-in-flight", "1"]
        with open(workdir / f"worker-{n}.log", "wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        started.append((proc, ""))
        while not port_file.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"sqe-worker {n} did not start")
            time.sleep(0.05)
        started[-1] = (proc, f"127.0.0.1:{port_file.read_text().strip()}")
    return started


def timed(run: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def count_log(log: Path, offset: int) -> dict[str, int]:
    text = log.read_text(errors="replace")[offset:]
    counts = {"load-table": 0, "credentials endpoint": 0, "AssumeRole": text.count("cache=miss")}
    for match in _REQUEST.finditer(text):
        counts["credentials endpoint" if match.group(1) else "load-table"] += 1
    return counts


def main() -> int:
    if sys.argv[1:2] == [PINNED_CHILD]:
        return pinned_child()
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", default="moto", choices=("moto", "ceph"))
    parser.add_argument("--lifetime", type=int, default=10, help="vended credential lifetime, seconds")
    parser.add_argument("--lifetimes", type=float, default=3.0, help="how long the paced scan runs")
    parser.add_argument("--files", type=int, default=24)
    parser.add_argument("--rows", type=int, default=20000, help="rows per file")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--efficiency", action="store_true", help="pinned coordinator + worker vs pinned local")
    parser.add_argument("--eff-rows", type=int, default=4_000_000, help="rows of the --efficiency table")
    parser.add_argument("--eff-files", type=int, default=8, help="data files of the --efficiency table")
    parser.add_argument(
        "--eff-caches", default="both", choices=("warm", "off", "both"),
        help="--efficiency with the data caches warm, off (every run reads the store), or both (default)",
    )  # fmt: skip
    parser.add_argument(
        "--compare-partial",
        action="store_true",
        help="with --efficiency: also run the distributed queries with partial_aggregation = false (paired)",
    )
    args = parser.parse_args()
    apply_client_env(args.store)
    if args.efficiency:
        return efficiency(args)
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="sqe-bench-dist-") as tmp:
        workdir = Path(tmp)
        info = start_stack(workdir / "stack", store=args.store, credential_lifetime=args.lifetime, serve=False)
        catalog_daemon, workers = None, list[tuple[subprocess.Popen[bytes], str]]()
        try:
            write_table(info, args.files, args.rows)
            catalog_daemon, uri, log = debug_catalog(info, workdir)
            start_workers(workdir, token, 2, workers)
            overrides: dict[str, Any] = {"catalog": {"uri": uri}}
            local_config = load_config(info.principal_config("analyst"), env={}, overrides=overrides)
            addresses = [address for _, address in workers]
            overrides["coordinator"] = {"workers": addresses, "token": token}
            dist_config = load_config(info.principal_config("analyst"), env={}, overrides=overrides)
            report(args, local_config, dist_config, log)
        finally:
            for proc, _ in workers:
                proc.terminate()
                proc.wait(10)
            if catalog_daemon is not None:
                stop_daemon(catalog_daemon)
            stop_stack(workdir / "stack")
    return 0


def report(args: argparse.Namespace, local_config: SQEConfig, dist_config: SQEConfig, log: Path) -> None:
    with Session(RestTableProvider(local_config), local_config) as local:
        local.sql(QUERY).arrow()  # warm-up (metadata cache, connections)
        local_s = timed(lambda: local.sql(QUERY).arrow(), args.runs)
    with Session(RestTableProvider(dist_config), dist_config) as dist:
        dist.sql(QUERY).arrow()
        dist_s = timed(lambda: dist.sql(QUERY).arrow(), args.runs)
    total_rows = args.files * args.rows
    print(f"{args.files} files x {args.rows} rows ({args.store} store), median of {args.runs} runs:")
    print(f"  local              {local_s:7.3f} s")
    print(f"  2 workers          {dist_s:7.3f} s")
    print(f"  ratio distributed / local: {dist_s / local_s:.2f}x  ({total_rows / dist_s / 1e6:.2f} M rows/s)")

    # The same long scan in two shapes: 2 fragments at a time, then 6 smaller ones at a time.
    paced_scan(args, dist_config, log, slots=1, files_per_fragment=2)
    paced_scan(args, dist_config, log, slots=3, files_per_fragment=1)


def paced_scan(args: argparse.Namespace, config: SQEConfig, log: Path, *, slots: int, files_per_fragment: int) -> None:
    """A scan paced to last ``--lifetimes`` credential lifetimes; prints catalog and STS traffic per lifetime."""
    files_per_slot = args.files / (2 * slots)
    pace_ms = int(args.lifetimes * args.lifetime * 1000 / files_per_slot)
    options = DistributedOptions(
        slots_per_worker=slots, max_files_per_fragment=files_per_fragment, pace_ms_per_file=pace_ms
    )
    offset = len(log.read_text(errors="replace"))
    started = time.monotonic()
    with Session(RestTableProvider(config), config, distributed=options) as dist:
        dist.sql("SELECT count(*) FROM bench.events WHERE amount >= 0").fetchall()
        elapsed = time.monotonic() - started
        executor = dist.distributed_executor
        assert executor is not None
        stats = executor.stats.snapshot()
        leases = executor.refresher.leases()
        keys = {fp for lease in leases for fp in lease.stats.key_fingerprints}
        worker_keys = sum(s.credential_sets_used for s in executor.worker_stats().values())
    time.sleep(0.5)  # let the catalog flush its log
    counts = count_log(log, offset)
    lifetimes = elapsed / args.lifetime
    round_trips = counts["load-table"] + counts["credentials endpoint"]
    loads, endpoint = counts["load-table"], counts["credentials endpoint"]
    print(f"paced scan: {elapsed:.1f} s = {lifetimes:.1f} credential lifetimes of {args.lifetime} s, "
          f"{args.files} files in {stats['fragments_completed']} fragments, {2 * slots} running at a time")  # fmt: skip
    print(f"  AssumeRole calls       {counts['AssumeRole']:3d}  ({counts['AssumeRole'] / lifetimes:.2f} per lifetime)")
    print(f"  catalog round trips    {round_trips:3d}  ({round_trips / lifetimes:.2f} per lifetime: "
          f"{loads} load-table incl. planning, {endpoint} credentials endpoint)")  # fmt: skip
    print(f"  refreshes pushed       {sum(lease.stats.pushes for lease in leases):3d}  "
          f"({stats['pushes_sent']} RefreshCredentials calls); same set served again by the catalog cache: "
          f"{sum(lease.stats.unchanged for lease in leases)}")  # fmt: skip
    print(f"  distinct access keys   {len(keys):3d}  (coordinator), {worker_keys} key uses summed over workers")


# ------------------------------------------------------------------------------------------------ efficiency

PINNED_CHILD = "_pinned-run"
EFF_TABLE = "bench.eff"
EFF_QUERIES = {
    "aggregate": f"SELECT count(*) AS n, sum(x) AS sx, sum(y) AS sy, max(tag) AS mt FROM {EFF_TABLE}",
    "select *": f"SELECT * FROM {EFF_TABLE}",
    # A simple WHERE: the workers run it after the restrictions (half the rows kept, then a tenth).
    "agg+WHERE": f"SELECT tag, count(*) AS n, sum(x) AS sx FROM {EFF_TABLE} WHERE x >= 3584 GROUP BY tag",
    "sel+WHERE": f"SELECT id, x, tag FROM {EFF_TABLE} WHERE x < 717 AND tag <> 'tag-001'",
    # NOT and a double constant (y = id / 3): on the workers since both joined the simple WHERE
    "agg+NOT": f"SELECT tag, count(*) AS n, sum(x) AS sx FROM {EFF_TABLE} WHERE NOT (y < 200000.5 OR x IN (7, 14)) "
    "GROUP BY tag",
}


def write_efficiency_table(info: StackInfo, files: int, rows: int) -> None:
    """``files`` appends of ``rows / files`` rows: id, x (int64), y (double), tag (one of 100 strings)."""
    catalog = writer_catalog(info)
    catalog.create_namespace("bench")
    tags = pa.array([f"tag-{i:03d}" for i in range(100)])
    per_file = rows // files
    for n in range(files):
        ids = pa.array(range(n * per_file, (n + 1) * per_file), pa.int64())
        data = pa.table(
            {
                "id": ids,
                "x": pc.multiply(pc.bit_wise_and(ids, 1023), 7),
                "y": pc.divide(pc.cast(ids, pa.float64()), 3.0),
                "tag": pc.take(tags, pc.bit_wise_and(ids, 63)),
            }
        )
        if n == 0:
            catalog.create_table(EFF_TABLE, schema=data.schema)
        catalog.load_table(EFF_TABLE).append(data)


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process from ``/proc/<pid>/stat`` (fields 14 and 15, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pinned_child() -> int:
    """Run in a pinned process: the spec (JSON on stdin, it holds the token) says which config and queries.

    Prints one JSON line per query: median wall seconds, rows, this process's CPU seconds and the worker's
    (when a worker pid is given) summed over the timed runs."""
    spec = json.loads(sys.stdin.read())
    apply_client_env(spec["store"])
    overrides: dict[str, Any] = {"catalog": {"uri": spec["catalog_uri"]}}
    if spec.get("caches_off"):
        overrides["cache"] = {"data_bytes": 0, "decoded_bytes": 0}
    options = None
    if spec.get("workers"):
        overrides["coordinator"] = {"workers": spec["workers"], "token": spec["token"]}
        overrides["coordinator"]["partial_aggregation"] = spec.get("partial_aggregation", True)
        options = DistributedOptions(slots_per_worker=spec["slots"])
    config = load_config(Path(spec["config"]), env={}, overrides=overrides)
    worker_pid = spec.get("worker_pid")
    with Session(RestTableProvider(config), config, distributed=options) as session:
        for name, sql in spec["queries"].items():
            rows = session.sql(sql).arrow().num_rows  # warm-up: metadata, connections, footers
            samples = []
            cpu_before = own_cpu_seconds()
            worker_before = proc_cpu_seconds(worker_pid) if worker_pid else 0.0
            for _ in range(spec["runs"]):
                started = time.perf_counter()
                session.sql(sql).arrow()
                samples.append(time.perf_counter() - started)
            result = {
                "query": name,
                "seconds": statistics.median(samples),
                "rows": rows,
                "cpu": own_cpu_seconds() - cpu_before,
                "worker_cpu": (proc_cpu_seconds(worker_pid) - worker_before) if worker_pid else 0.0,
            }
            print(json.dumps(result), flush=True)
    return 0


def run_pinned(core: int, spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    command = ["taskset", "-c", str(core), sys.executable, __file__, PINNED_CHILD]
    done = subprocess.run(command, input=json.dumps(spec), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pinned run failed: {done.stderr.strip().splitlines()[-1:]}")
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {r["query"]: r for r in results}


CACHES_OFF = ["--data-cache-bytes", "0", "--decoded-cache-bytes", "0"]


def start_pinned_worker(
    workdir: Path, token: str, core: int, *, caches_off: bool
) -> tuple[subprocess.Popen[bytes], str]:
    token_file = workdir / "eff-worker-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port_file = workdir / "eff-worker.port"
    port_file.unlink(missing_ok=True)
    command = ["taskset", "-c", str(core), sys.executable, "-m", "workers.cli", "--listen", "127.0.0.1:0"]
    command += ["--token-file", str(token_file), "--port-file", str(port_file), "--log-level", "WARNING"]
    command += CACHES_OFF if caches_off else []
    with open(workdir / "eff-worker.log", "ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError("the pinned sqe-worker did not start")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port_file.read_text().strip()}"


def efficiency(args: argparse.Namespace) -> int:
    token = secrets.token_hex(16)
    modes = {"warm": [False], "off": [True], "both": [False, True]}[args.eff_caches]
    with tempfile.TemporaryDirectory(prefix="sqe-bench-eff-") as tmp:
        workdir = Path(tmp)
        info = start_stack(workdir / "stack", store=args.store, credential_lifetime=3600, serve=False)
        try:
            write_efficiency_table(info, args.eff_files, args.eff_rows)
            for caches_off in modes:
                local, dist, without = efficiency_runs(args, info, workdir, token, caches_off=caches_off)
                print_efficiency(args, local, dist, caches_off=caches_off)
                if without is not None:
                    print("same stack and worker, [coordinator] partial_aggregation = false (workers ship every row):")
                    print_efficiency(args, local, without, caches_off=caches_off)
        finally:
            stop_stack(workdir / "stack")
    return 0


def efficiency_runs(
    args: argparse.Namespace, info: StackInfo, workdir: Path, token: str, *, caches_off: bool
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """The local run and the run through one fresh pinned worker, both with the data caches on or off (and, with
    ``--compare-partial``, the worker run again without partial aggregation)."""
    worker, address = start_pinned_worker(workdir, token, core=1, caches_off=caches_off)
    try:
        spec: dict[str, Any] = {
            "store": args.store,
            "catalog_uri": info.catalog_uri,
            "config": str(info.principal_config("analyst")),
            "queries": EFF_QUERIES,
            "runs": args.runs,
            "caches_off": caches_off,
        }
        local = run_pinned(0, spec)
        remote = {**spec, "workers": [address], "token": token, "slots": 2, "worker_pid": worker.pid}
        dist = run_pinned(0, remote)
        without = run_pinned(0, {**remote, "partial_aggregation": False}) if args.compare_partial else None
    finally:
        worker.terminate()
        worker.wait(10)
    return local, dist, without


def print_efficiency(
    args: argparse.Namespace, local: dict[str, Any], dist: dict[str, Any], *, caches_off: bool
) -> None:
    """Per query: wall rates per core and their ratio, CPU per million rows of each process and their ratio.

    On a shared machine the wall ratio carries everyone else's load; the CPU ratio (local process CPU over
    worker CPU, per row) is what a dedicated worker core would give if the scan is CPU bound. ``workers per
    coordinator core``: how many such workers one coordinator core keeps up with (worker CPU / coordinator CPU
    per row), the first limit of a cluster's scaling."""
    caches = "data caches off (every run reads the store)" if caches_off else "data caches warm"
    print(f"efficiency, {caches}: {args.eff_rows} rows in {args.eff_files} files ({args.store}); coordinator on "
          f"core 0, 1 worker on core 1, local run on core 0; median of {args.runs} runs")  # fmt: skip
    header = f"  {'query':10s} {'local rows/s/core':>17s} {'worker rows/s/core':>18s} {'wall ratio':>10s} "
    header += f"{'CPU ratio':>9s} {'CPU s/M rows: local':>19s} {'worker':>6s} {'coord':>6s} {'workers/coord core':>18s}"
    print(header)
    for name in EFF_QUERIES:
        lo, di = local[name], dist[name]
        if lo["rows"] != di["rows"]:
            raise RuntimeError(f"{name}: local returned {lo['rows']} rows, distributed {di['rows']}")
        rows = args.eff_files * (args.eff_rows // args.eff_files)
        scanned = rows * args.runs / 1e6  # million rows scanned over the timed runs
        local_rate, worker_rate = rows / lo["seconds"], rows / di["seconds"]  # one core each
        local_cpu, worker_cpu, coord_cpu = lo["cpu"] / scanned, di["worker_cpu"] / scanned, di["cpu"] / scanned
        print(f"  {name:10s} {local_rate:17,.0f} {worker_rate:18,.0f} {worker_rate / local_rate:10.2f} "
              f"{_ratio(local_cpu, worker_cpu, 9, 2)} {local_cpu:19.3f} {worker_cpu:6.3f} {coord_cpu:6.3f} "
              f"{_ratio(worker_cpu, coord_cpu, 18, 1)}")  # fmt: skip


def _ratio(numerator: float, denominator: float, width: int, digits: int) -> str:
    """``numerator / denominator``, or ``-`` when a small table's run took less CPU than one clock tick."""
    return f"{numerator / denominator:{width}.{digits}f}" if denominator > 0 else "-".rjust(width)


if __name__ == "__main__":
    sys.exit(main())
