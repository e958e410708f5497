"""Load-table latency of sqe-catalog (200 and 304) and SQE's warm ``count(*)`` per catalog variant, in one run.

Starts the embedded stack (moto S3+STS, sqe-catalog), writes a 1-file table, then starts more sqe-catalog
processes on the same database and store: one with ``metadata_recheck_seconds = 30`` (no HEAD of metadata.json
per load), one with ``credential_cache = false``, one with ``metadata_cache_entries = 0`` (every load reads and
verifies metadata.json again), and with
``--baseline-python`` one run by another checkout's interpreter (e.g. main's ``.venv/bin/python``: the
"before"). Then, in interleaved rounds so that machine noise hits every variant alike, it times per variant:
load-table without delegation (200), with vended credentials (200) and revalidated with ``If-None-Match`` (304),
each as the analyst, and a warm ``SELECT count(*) ... WHERE true`` of an SQE session with
``metadata_revalidate_seconds = 0`` (one 304 round trip per query). Prints medians and ratios to the default.

    .venv/bin/python bench/catalog_load.py [--calls 200] [--rounds 5] [--baseline-python PATH] [--store moto|ceph]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import requests
from pyiceberg.catalog.rest import RestCatalog

import sqe.api
from sqe.session import Session
from sqe_stack import StackInfo, start_stack, stop_stack
from sqe_stack.catalog import catalog_log_path, spawn_catalog, wait_for_catalog
from sqe_stack.provision import Daemon, StackError, free_port, spawn, stop_daemon

PATH = "/v1/demo/namespaces/bench/tables/t"
COUNT = "SELECT count(*) FROM bench.t WHERE true"  # WHERE true: a real scan, not the manifest-count answer
VENDED = {"X-Iceberg-Access-Delegation": "vended-credentials"}


def token(uri: str, client_id: str, secret: str) -> str:
    body = {
        "grant_type": "client_credentials",
        "client_id": client_id,
        "client_secret": secret,
        "scope": "PRINCIPAL_ROLE:ALL",
    }
    response = requests.post(f"{uri}/v1/oauth/tokens", data=body, timeout=10)
    response.raise_for_status()
    return str(response.json()["access_token"])


def timed(run: Callable[[], object], calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return samples


def load_call(session: requests.Session, url: str, headers: dict[str, str], status: int) -> Callable[[], None]:
    def call() -> None:
        response = session.get(url, headers=headers, timeout=10)
        if response.status_code != status:
            raise SystemExit(f"{url}: expected {status}, got {response.status_code}: {response.text[:200]}")

    return call


def count_call(session: Session) -> Callable[[], object]:
    return lambda: session.sql(COUNT).fetchall()


def variant_config(stack_dir: Path, source: Path, name: str, warehouse_keys: str) -> tuple[Path, int]:
    """A copy of the stack's catalog.toml on a free port, with ``warehouse_keys`` added to ``[[warehouses]]``."""
    port = free_port()
    text = re.sub(r"(?m)^port = \d+", f"port = {port}", source.read_text(), count=1)
    text = text.replace("[[warehouses]]", f"[[warehouses]]\n{warehouse_keys}", 1)
    path = stack_dir / f"catalog-{name}.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path, port


def start_variants(
    stack_dir: Path, info: StackInfo, baseline_python: str | None, daemons: list[Daemon]
) -> dict[str, str]:
    """Catalog URI per variant name (the stack's own is ``default``); each process goes into ``daemons`` as it
    starts, so that the caller stops those already running when a later one fails."""
    uris = {"default": info.catalog_uri}
    source = Path(info.catalog_config)
    variants = {
        "recheck-30s": "metadata_recheck_seconds = 30",
        "credential-cache-off": "credential_cache = false",
        "metadata-cache-off": "metadata_cache_entries = 0",
    }
    for name, keys in variants.items():
        config, port = variant_config(stack_dir, source, name, keys)
        work = stack_dir / name
        work.mkdir()
        daemons.append(spawn_catalog(work, config, {}))
        uris[name] = wait_for_catalog(work, port, daemons[-1])
    if baseline_python:
        config, port = variant_config(stack_dir, source, "baseline", "")
        work = stack_dir / "baseline"
        work.mkdir()
        argv = [baseline_python, "-m", "sqe_catalog.cli", "serve", "--config", str(config)]
        # cwd outside any checkout: the baseline interpreter imports its own installed sqe_catalog
        log = catalog_log_path(work)
        daemons.append(spawn("catalog-baseline", argv, log, argv[2:], {"PYTHONUNBUFFERED": "1"}, scrub_aws_env=True))
        uris["baseline"] = wait_for_catalog(work, port, daemons[-1])
    return uris


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200, help="calls per measurement and variant (all rounds)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--baseline-python", help="another checkout's interpreter: its catalog is the 'before'")
    parser.add_argument("--store", default="moto", choices=("moto", "ceph"))
    args = parser.parse_args()
    per_round = max(1, args.calls // args.rounds)
    results: dict[tuple[str, str], list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="sqe-bench-") as tmp:
        os.chdir(tmp)  # spawned interpreters must not import this checkout through the working directory
        stack_dir = Path(tmp) / "stack"
        info = start_stack(stack_dir, store=args.store, serve=False)
        daemons: list[Daemon] = []
        sessions: dict[str, Session] = {}
        try:
            writer = info.principal_credentials("writer")
            catalog = RestCatalog(
                "demo", uri=info.catalog_uri, warehouse="demo", credential=writer.credential, scope="PRINCIPAL_ROLE:ALL"
            )
            catalog.create_namespace("bench")
            schema = pa.schema([("id", pa.int64())])
            catalog.create_table("bench.t", schema=schema).append(pa.table({"id": [1, 2, 3]}, schema=schema))
            uris = start_variants(stack_dir, info, args.baseline_python, daemons)

            analyst = info.principal_credentials("analyst")
            http = requests.Session()
            http.headers["Authorization"] = (
                f"Bearer {token(info.catalog_uri, analyst.client_id, analyst.client_secret)}"
            )
            calls: dict[tuple[str, str], Callable[[], object]] = {}
            for name, uri in uris.items():
                etag = http.get(uri + PATH, headers=VENDED, timeout=10).headers["ETag"]
                calls[(name, "200 plain")] = load_call(http, uri + PATH, {}, 200)
                calls[(name, "200 vended")] = load_call(http, uri + PATH, VENDED, 200)
                calls[(name, "304 vended")] = load_call(http, uri + PATH, {**VENDED, "If-None-Match": etag}, 304)
                overrides = {"catalog__uri": uri, "catalog__metadata_revalidate_seconds": 0}
                session = sessions[name] = sqe.api.connect(info.principal_config("analyst"), **overrides)
                calls[(name, "sqe count(*)")] = count_call(session)
            for call in calls.values():  # warm up every process and session
                timed(call, 5)
            for _ in range(args.rounds):
                for key, call in calls.items():
                    results[key] += timed(call, per_round)
        finally:
            for session in sessions.values():
                session.close()
            for daemon in daemons:
                stop_daemon(daemon)
            stop_stack(stack_dir)
    names = list(dict.fromkeys(name for name, _ in results))
    kinds = list(dict.fromkeys(kind for _, kind in results))
    print(f"median ms of {per_round * args.rounds} calls in {args.rounds} interleaved rounds ({args.store} store)")
    print(f"  {'':14}" + "".join(f"{name:>22}" for name in names))
    for kind in kinds:
        default = median_ms(results[("default", kind)])
        cells = []
        for name in names:
            value = median_ms(results[(name, kind)])
            cells.append(f"{value:8.2f}" + (f" ({value / default:4.2f}x)" if name != "default" else " " * 8))
        print(f"  {kind:14}" + "".join(f"{cell:>22}" for cell in cells))
    print("  (x: variant / default; > 1 means the default is faster)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except StackError as exc:  # a catalog that would not start (e.g. a broken --baseline-python): say which
        sys.exit(f"bench/catalog_load.py: {exc}")
