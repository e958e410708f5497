"""``make demo``: the embedded stack end to end, through vended credentials only.

1. ``sqe stack up`` (moto S3+STS, sqe-catalog) in a scratch directory;
2. pyiceberg's own RestCatalog, holding no S3 key, creates a table as the writer and reads it as the analyst;
3. SQE queries as two users, writes with INSERT, and shows in EXPLAIN that data came through vended credentials;
4. governed access: the admin restricts the analyst on the table (row filter + mask); through the stack's SQE
   server (acting as reader ``sqe-engine``, scans on a worker) the analyst sees the filtered, masked rows, while
   the analyst's direct pyiceberg load of the same table (own token, capability header copied) is refused;
5. the stack is stopped, whatever happened.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tomllib
from pathlib import Path

import pyarrow as pa

from sqe.vocabulary import ACCESS_DELEGATION_HEADER, CAPABILITIES_HEADER, READ_RESTRICTIONS_V1, VENDED_CREDENTIALS


def _client_props(config_path: Path) -> dict[str, str]:
    with config_path.open("rb") as fh:
        catalog = tomllib.load(fh)["catalog"]
    return {
        "uri": catalog["uri"],
        "warehouse": catalog["warehouse"],
        "credential": f"{catalog['client_id']}:{catalog['client_secret']}",
        "scope": catalog["scope"],
        "oauth2-server-uri": catalog["uri"].rstrip("/") + "/v1/oauth/tokens",
        f"header.{ACCESS_DELEGATION_HEADER}": VENDED_CREDENTIALS,
    }


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def pyiceberg_round_trip(writer_cfg: Path, analyst_cfg: Path) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    _step("pyiceberg RestCatalog as 'writer' (no S3 key of its own): create demo.sales.orders, append 3 rows")
    writer = RestCatalog("demo", **_client_props(writer_cfg))
    import sqe.api

    with sqe.api.connect(writer_cfg) as session:  # the namespace comes from SQL, as in any engine
        session.sql("CREATE SCHEMA IF NOT EXISTS demo.sales")
    schema = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64())])
    table = writer.create_table_if_not_exists("sales.orders", schema=schema)
    table.append(
        pa.table(
            {"id": [1, 2, 3], "customer": ["ada", "grace", "linus"], "amount": [12.5, 40.0, 7.25]},
            schema=schema,
        )
    )
    print(f"   data files written with vended write credentials under {table.location()}")
    _step("pyiceberg RestCatalog as 'analyst': read it back with vended read credentials")
    analyst = RestCatalog("demo", **_client_props(analyst_cfg))
    from sqe.formatting import render_table

    rows = analyst.load_table("sales.orders").scan().to_arrow().sort_by("id")
    print(render_table(rows), end="")


def sqe_queries(writer_cfg: Path, analyst_cfg: Path) -> None:
    import sqe.api
    from sqe.formatting import render_table

    _step("SQE as 'writer': INSERT INTO demo.sales.orders")
    with sqe.api.connect(writer_cfg) as writer:
        writer.sql("INSERT INTO demo.sales.orders VALUES (4, 'margaret', 99.0)")
        print(render_table(writer.sql("SELECT count(*) AS orders FROM demo.sales.orders").arrow()), end="")
    _step("SQE as 'analyst': aggregate, then EXPLAIN shows the credential source")
    with sqe.api.connect(analyst_cfg) as analyst:
        query = "SELECT customer, sum(amount) AS total FROM demo.sales.orders GROUP BY customer ORDER BY total DESC"
        print(render_table(analyst.sql(query).arrow()), end="")
        print_explained_tables(analyst.sql("EXPLAIN " + query).arrow())
        _step("SQE as 'analyst': a write is refused (the analyst has read grants only)")
        try:
            analyst.sql("INSERT INTO demo.sales.orders VALUES (5, 'eve', 1.0)")
            print("   UNEXPECTED: the write succeeded")
        except Exception as exc:  # the demo shows the one-line error the user would see
            print(f"   refused: {str(exc).splitlines()[0]}")


def print_explained_tables(explained: pa.Table) -> None:
    """EXPLAIN's table sections, one ``table  property  value`` line each; DuckDB's plan is left out (its rows of
    box-drawing lines tell nothing about credentials)."""
    from sqe.session import explain_sections

    for table, properties in explain_sections(explained).items():
        for name, value in properties.items():
            print(f"   {table}  {name:24s} {value}")


# demo.sales.orders field ids: 1 id, 2 customer, 3 amount
ANALYST_RESTRICTIONS = {
    "required-row-filter": {"type": "in", "child": {"type": "reference", "id": 2}, "values": ["ada", "margaret"]},
    "required-column-projections": [{"field-id": 3, "action": "replace-with-null"}],
}


def restrict_analyst(catalog_config: Path) -> None:
    """What ``sqe-catalog admin set-restrictions`` does for the analyst on demo.sales.orders, in this process."""
    from sqe_stack.catalog import set_restrictions

    set_restrictions(catalog_config, "analyst", ("sales",), "orders", ANALYST_RESTRICTIONS)


def governed_access(catalog_config: Path, analyst_cfg: Path, server_url: str) -> None:
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import ForbiddenError

    from sqe.config import load_config
    from sqe.formatting import render_table
    from sqe.server.client import RemoteSession

    _step("admin: restrict 'analyst' on demo.sales.orders (rows of ada and margaret only, amount masked to NULL)")
    restrict_analyst(catalog_config)
    _step(f"SQE server {server_url} as 'analyst' (the server exchanges the analyst's token as reader sqe-engine)")
    remote = RemoteSession(server_url, load_config(analyst_cfg))
    try:
        print(render_table(remote.sql("SELECT * FROM demo.sales.orders ORDER BY id").arrow()), end="")
    finally:
        remote.close()
    _step("pyiceberg as 'analyst' directly, capability header copied: refused by the catalog")
    props = {**_client_props(analyst_cfg), f"header.{CAPABILITIES_HEADER}": READ_RESTRICTIONS_V1}
    try:
        RestCatalog("bypass", **props).load_table("sales.orders")
        print("   UNEXPECTED: the catalog served the restricted table to the analyst's own token")
    except ForbiddenError as exc:
        print(f"   refused (403): {str(exc).splitlines()[0]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sqe_stack.demo")
    parser.add_argument("--dir", default=".demo-stack")
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    args = parser.parse_args(argv)
    from sqe_stack import start_stack, stop_stack

    stack_dir = Path(args.dir).resolve()
    if stack_dir.exists():
        stop_stack(stack_dir)
        shutil.rmtree(stack_dir)
    _step(f"sqe stack up --dir {stack_dir} --store moto --workers 1")
    info = start_stack(stack_dir, store="moto", workers=1)
    print(f"   catalog {info.catalog_uri}, S3/STS {info.s3_endpoint}")
    print(f"   SQE server {info.server_url} (reader sqe-engine), worker {', '.join(info.workers)}")
    try:
        writer_cfg, analyst_cfg = info.principal_config("writer"), info.principal_config("analyst")
        pyiceberg_round_trip(writer_cfg, analyst_cfg)
        sqe_queries(writer_cfg, analyst_cfg)
        governed_access(info.catalog_config, analyst_cfg, info.server_url)
    finally:
        if not args.keep:
            _step("sqe stack down")
            stop_stack(stack_dir)
    print("\ndemo finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
