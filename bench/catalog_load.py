"""Load-table latency of sqe-catalog with and without its vended-credential cache, in one run.

Starts the embedded stack (moto S3+STS, sqe-catalog), then a second sqe-catalog process on the same database
with ``credential_cache = false``. Times 200 load-table calls (analyst, vended-credentials) against each, plus
200 calls without delegation as the no-STS baseline, and prints medians and ratios.

    .venv/bin/python bench/catalog_load.py [--calls 200] [--store moto|ceph]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import requests
from pyiceberg.catalog.rest import RestCatalog

from sqe_stack import start_stack, stop_stack
from sqe_stack.catalog import spawn_catalog, wait_for_catalog
from sqe_stack.provision import free_port, stop_daemon


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


def time_loads(session: requests.Session, url: str, calls: int, headers: dict[str, str]) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        response = session.get(url, headers=headers, timeout=10)
        samples.append(time.perf_counter() - started)
        response.raise_for_status()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--store", default="moto", choices=("moto", "ceph"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sqe-bench-") as tmp:
        stack_dir = Path(tmp) / "stack"
        info = start_stack(stack_dir, store=args.store)
        second = None
        try:
            writer = info.principal_credentials("writer")
            catalog = RestCatalog(
                "demo", uri=info.catalog_uri, warehouse="demo", credential=writer.credential, scope="PRINCIPAL_ROLE:ALL"
            )
            catalog.create_namespace("bench")
            schema = pa.schema([("id", pa.int64())])
            catalog.create_table("bench.t", schema=schema).append(pa.table({"id": [1, 2, 3]}, schema=schema))

            # A second catalog process, same database and store, with the credential cache switched off.
            config_text = Path(info.catalog_config).read_text()
            port = free_port()
            config_text = re.sub(r"(?m)^port = \d+", f"port = {port}", config_text, count=1)
            config_text = config_text.replace("[[warehouses]]", "[[warehouses]]\ncredential_cache = false", 1)
            nocache_config = stack_dir / "catalog-nocache.toml"
            nocache_config.write_text(config_text)
            nocache_config.chmod(0o600)
            second = spawn_catalog(stack_dir, nocache_config, {})
            nocache_uri = wait_for_catalog(stack_dir, port, second)

            analyst = info.principal_credentials("analyst")
            bearer = token(info.catalog_uri, analyst.client_id, analyst.client_secret)
            path = "/v1/demo/namespaces/bench/tables/t"
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {bearer}"
            vended = {"X-Iceberg-Access-Delegation": "vended-credentials"}
            for uri in (info.catalog_uri, nocache_uri):  # warm up both processes
                time_loads(session, uri + path, 5, vended)
            plain = time_loads(session, info.catalog_uri + path, args.calls, {})
            cached = time_loads(session, info.catalog_uri + path, args.calls, vended)
            uncached = time_loads(session, nocache_uri + path, args.calls, vended)
        finally:
            if second is not None:
                stop_daemon(second)
            stop_stack(stack_dir)
    med = {
        name: statistics.median(s) * 1000
        for name, s in (("no delegation", plain), ("vended, cache on", cached), ("vended, cache off", uncached))
    }
    print(f"load-table latency, median of {args.calls} calls ({args.store} store):")
    for name, value in med.items():
        print(f"  {name:18s} {value:7.2f} ms")
    print(f"  ratio cache off / cache on: {med['vended, cache off'] / med['vended, cache on']:.2f}x")
    print(f"  ratio cache on / no delegation: {med['vended, cache on'] / med['no delegation']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
