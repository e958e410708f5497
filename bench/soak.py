"""Soak under faults: the SQE service on Ceph RGW with 5-second credentials, three users, a seeded fault schedule.

World (all on 127.0.0.1, started here; the test starts no Ceph of its own but passes the session's as
``SoakConfig.running_store``): Ceph RGW (mon + memstore OSD + radosgw with STS) → ``sqe-catalog``
(credential lifetime 5 s, debug request log) → a fault proxy *process* in front of it → ``sqe serve`` acting as a
trusted reader, with 2 ``sqe-worker`` processes. Users: ``full`` (unrestricted), ``rowf`` (row filter on
``region``), ``mask`` (``ssn`` hashed / nulled). Each user has client threads of its own, each with its own ADBC
and pyarrow.flight connection, issuing scans, joins, aggregates, prepared statements and INSERTs into the user's
own table. A fault injector, on a schedule drawn from ``--seed``, SIGKILLs and restarts a worker, queues 503 and
429 bursts and slow answers in the proxy, revokes and restores ``full``'s read grant, switches a user's
read-restrictions between two versions, and restarts the catalog.

The oracle never uses SQE: the raw data files are read with pyarrow and the store's root key; the restriction
semantics come from the conformance suite's reference code (``tests/conformance/restriction_fixtures.py``:
SHA-256 encodings) and plain Python for the filter. Restriction versions are tracked on a timeline: version k is
*in force* from the moment the admin command installing it starts until the command replacing it has returned.
A query whose window (first request sent → last byte received) overlaps the in-force interval of a version may
legitimately show that version; a result is wrong only if it matches none of them. A row the user may never see
(an unmasked value, a filtered-out row, a row served while the grant was revoked) counts as unrestricted.

    python bench/soak.py --queries 1000 [--seed 17] [--clients-per-user 2]

``run_soak`` is what ``tests/soak/test_soak_short.py`` runs (fewer queries, a time budget).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import secrets
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from google.protobuf import any_pb2

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqe.errors import SQEError  # noqa: E402
from sqe.server import errors as _server_errors  # noqa: E402, F401  (registers the server's error types)
from sqe.server._proto import flight_sql_pb2 as sql_pb  # noqa: E402
from sqe_stack import client_env  # noqa: E402
from sqe_stack.catalog import (  # noqa: E402
    BUCKET,
    REGION,
    WAREHOUSE,
    WAREHOUSE_LOCATION,
    Grant,
    PrincipalCredentials,
    PrincipalSpec,
    create_principal,
    server_settings,
    spawn_catalog,
    wait_for_catalog,
    warehouse_settings,
    write_catalog_config,
)
from sqe_stack.provision import Daemon, StoreHandle, create_bucket, free_ports, spawn, stop_daemon, wait_until  # noqa: E402
from sqe_stack.service import server_config_text, server_engine_config_text, service_env  # noqa: E402
from tests.conformance.restriction_fixtures import sha256_string  # noqa: E402
from tests.helpers.fault_proxy import FaultProxyProcess  # noqa: E402

CREDENTIAL_LIFETIME = 5
NAMESPACE = "soak"
USERS = ("full", "rowf", "mask")
PEOPLE_ROWS = 240
ORDER_ROWS = 2400
REGIONS = ("EU", "US", "UK", "APAC")

# Two versions per restricted user; the injector switches between them (field ids: 1 id, 2 name, 3 region, 4 ssn).
RESTRICTION_VERSIONS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "rowf": (
        {"required-row-filter": {"type": "in", "child": {"type": "reference", "id": 3}, "values": ["EU"]}},
        {"required-row-filter": {"type": "in", "child": {"type": "reference", "id": 3}, "values": ["EU", "UK"]}},
    ),
    "mask": (
        {"required-column-projections": [{"field-id": 4, "action": "sha-256-global"}]},
        {
            "required-column-projections": [
                {"field-id": 4, "action": "replace-with-null"},
                {"field-id": 2, "action": "sha-256-global"},
            ]
        },
    ),
}


# ------------------------------------------------------------------------------------------------ oracle


def apply_restriction(rows: list[dict[str, Any]], restriction: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The reference semantics: the row filter on raw values, then the masks (conformance reference encodings)."""
    if restriction is None:
        return [dict(r) for r in rows]
    by_id = {1: "id", 2: "name", 3: "region", 4: "ssn"}
    row_filter = restriction.get("required-row-filter")
    kept = rows
    if row_filter is not None:
        assert row_filter["type"] == "in"
        column, allowed = by_id[row_filter["child"]["id"]], set(row_filter["values"])
        kept = [r for r in rows if r[column] is not None and r[column] in allowed]
    out = []
    for row in kept:
        masked = dict(row)
        for projection in restriction.get("required-column-projections", []):
            column = by_id[projection["field-id"]]
            if projection["action"] == "replace-with-null":
                masked[column] = None
            elif projection["action"] == "sha-256-global":
                masked[column] = None if row[column] is None else sha256_string(row[column])
            else:
                raise ValueError(f"the soak oracle has no reference for {projection['action']}")
        out.append(masked)
    return out


@dataclass
class Timeline:
    """When each version of something (a restriction, a grant) was in force: [install start, replace end)."""

    versions: list[tuple[Any, float, float]] = field(default_factory=list)  # (value, in force from, until)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, value: Any) -> None:
        self.versions.append((value, 0.0, float("inf")))

    @contextlib.contextmanager
    def change(self, value: Any) -> Iterator[None]:
        """Wrap the admin command that installs ``value``: both versions are in force while it runs."""
        begin = time.monotonic()
        with self.lock:
            self.versions.append((value, begin, float("inf")))
        yield
        end = time.monotonic()
        with self.lock:
            old_value, old_from, _ = self.versions[-2]
            self.versions[-2] = (old_value, old_from, end)

    def in_force(self, t0: float, t1: float) -> list[Any]:
        with self.lock:
            return [v for v, since, until in self.versions if since <= t1 and until >= t0]

    def only(self, t0: float, t1: float) -> Any:
        versions = self.in_force(t0, t1)
        return versions[0] if len(versions) == 1 else None


# ------------------------------------------------------------------------------------------------ world


@dataclass
class World:
    dir: Path
    store: StoreHandle
    started: list[Daemon]
    catalog_config: Path
    catalog_port: int
    catalog: Daemon
    proxy: FaultProxyProcess
    workers: list[Daemon]
    worker_ports: list[int]
    worker_token_file: Path
    server: Daemon
    server_url: str
    users: dict[str, PrincipalCredentials]
    writer: PrincipalCredentials
    secrets: set[str] = field(default_factory=set)

    @property
    def catalog_url(self) -> str:
        return f"http://127.0.0.1:{self.catalog_port}"

    def admin(self, *args: str) -> str:
        return _admin_for(self.catalog_config)(*args)

    def token(self, who: str) -> str:
        user = self.users[who]
        form = urllib.parse.urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": user.client_id,
                "client_secret": user.client_secret,
                "scope": "PRINCIPAL_ROLE:ALL",
            }
        ).encode()
        for attempt in range(60):  # the catalog may be restarting: the harness waits, it is not a query
            try:
                request = urllib.request.Request(f"{self.catalog_url}/v1/oauth/tokens", data=form, method="POST")
                with urllib.request.urlopen(request, timeout=30) as response:
                    token = str(json.loads(response.read())["access_token"])
                self.secrets.add(token)
                return token
            except OSError:
                time.sleep(0.5 + attempt * 0.1)
        raise RuntimeError("no user token from the catalog")

    def restart_catalog(self) -> None:
        stop_daemon(self.catalog, grace=5)
        self.catalog = spawn_catalog(self.dir, self.catalog_config, client_env("ceph"))
        self.started.append(self.catalog)
        wait_for_catalog(self.dir, self.catalog_port, self.catalog)

    def kill_worker(self, index: int) -> None:
        os.kill(self.workers[index].pid, signal.SIGKILL)
        process = self.workers[index].process
        if process is not None:
            with contextlib.suppress(Exception):
                process.wait(10)

    def start_worker(self, index: int) -> None:
        listen = f"127.0.0.1:{self.worker_ports[index]}"
        argv = [sys.executable, "-m", "workers.cli", "--listen", listen, "--token-file", str(self.worker_token_file)]
        port_file = self.dir / f"worker-{index}.port"
        port_file.unlink(missing_ok=True)
        daemon = spawn(
            f"worker-{index}",
            [*argv, "--port-file", str(port_file)],
            self.dir / "logs" / f"worker-{index}.log",
            markers=("workers.cli", listen),
            env=service_env(),
            scrub_aws_env=True,
        )
        self.started.append(daemon)
        if index < len(self.workers):
            self.workers[index] = daemon
        else:
            self.workers.append(daemon)
        wait_until(lambda: port_file.is_file() and port_file.read_text().strip() != "", f"worker-{index}", 60.0)

    def stop(self) -> None:
        self.proxy.stop()
        for daemon in reversed(self.started):
            stop_daemon(daemon)


def _user_spec(who: str) -> PrincipalSpec:
    """Role ``<who>_role``: list and read the namespace, write the user's own table ``ins_<who>``."""
    grants = [
        Grant("NAMESPACE_LIST", (NAMESPACE,)),
        Grant("TABLE_READ_DATA", (NAMESPACE,)),
        Grant("TABLE_WRITE_DATA", (NAMESPACE,), f"ins_{who}"),
    ]
    return PrincipalSpec(who, role=f"{who}_role", grants=grants, warehouse=WAREHOUSE)


def people_table(rng: random.Random) -> pa.Table:
    ids = list(range(1, PEOPLE_ROWS + 1))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"person-{i:04d}" for i in ids], pa.string()),
            "region": pa.array([REGIONS[rng.randrange(len(REGIONS))] for _ in ids], pa.string()),
            "ssn": pa.array([None if i % 17 == 0 else f"{rng.randrange(10**9):09d}" for i in ids], pa.string()),
        }
    )


def orders_table(rng: random.Random) -> pa.Table:
    return pa.table(
        {
            "order_id": pa.array(range(1, ORDER_ROWS + 1), pa.int64()),
            "person_id": pa.array([rng.randrange(1, PEOPLE_ROWS + 1) for _ in range(ORDER_ROWS)], pa.int64()),
            "amount": pa.array([rng.randrange(1, 10_000) for _ in range(ORDER_ROWS)], pa.int64()),
        }
    )


def start_world(dir: Path, seed: int, running_store: StoreHandle | None = None) -> World:
    """Everything on loopback; on failure every process started so far is stopped. ``running_store``: a Ceph RGW
    already running (the test session's), used under a location of the soak's own instead of starting one."""
    from sqe_stack.ceph import start_ceph

    os.environ.update(client_env("ceph"))
    (dir / "logs").mkdir(parents=True, exist_ok=True)
    started: list[Daemon] = []
    proxy: FaultProxyProcess | None = None
    try:
        store = running_store or start_ceph(dir / "ceph", started)
        location = f"s3://{BUCKET}/soak_{secrets.token_hex(4)}" if running_store else WAREHOUSE_LOCATION
        create_bucket(store, BUCKET, REGION)
        catalog_port, server_port, *worker_ports = free_ports(4)
        config = write_catalog_config(
            dir / "catalog.toml",
            server_settings(dir, catalog_port, log_level="debug"),
            warehouse_settings(store, location=location, credential_lifetime=CREDENTIAL_LIFETIME),
        )
        writer_grants = [Grant(p) for p in ("NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA")]
        writer_spec = PrincipalSpec("soak_writer", role="soak_writer_role", grants=writer_grants, warehouse=WAREHOUSE)
        writer = create_principal(config, writer_spec)
        users = {who: create_principal(config, _user_spec(who)) for who in USERS}
        reader = create_principal(config, PrincipalSpec("soak-reader", reader=True))
        catalog = spawn_catalog(dir, config, client_env("ceph"))
        started.append(catalog)
        catalog_url = wait_for_catalog(dir, catalog_port, catalog)
        _create_tables(catalog_url, writer, random.Random(seed))
        proxy = FaultProxyProcess(catalog_url, dir)
        token_file = dir / "worker.token"
        token_file.write_text(secrets.token_urlsafe(32) + "\n", encoding="utf-8")
        token_file.chmod(0o600)
        world = World(
            dir,
            store,
            started,
            config,
            catalog_port,
            catalog,
            proxy,
            [],
            list(worker_ports),
            token_file,
            server=catalog,
            server_url="",
            users=users,
            writer=writer,  # the server is started below
        )
        for index in range(len(worker_ports)):
            world.start_worker(index)
        _start_server(world, reader, server_port)
        world.secrets |= {store.secret_access_key, reader.client_secret, writer.client_secret}
        world.secrets |= {u.client_secret for u in users.values()}
        return world
    except BaseException:
        if proxy is not None:
            proxy.stop()
        for daemon in reversed(started):
            stop_daemon(daemon)
        raise


def _admin_for(config: Path) -> Callable[..., str]:
    def admin(*args: str) -> str:
        from sqe_catalog.cli import main as catalog_cli

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = catalog_cli(["admin", "--config", str(config), *args])
        if code != 0:
            raise RuntimeError(f"sqe-catalog admin {args[0]} failed: {err.getvalue().strip()}")
        return out.getvalue()

    return admin


def _writer_catalog(catalog_url: str, writer: PrincipalCredentials) -> Any:
    from pyiceberg.catalog.rest import RestCatalog

    return RestCatalog(
        "soak-writer",
        uri=catalog_url,
        warehouse=WAREHOUSE,
        credential=writer.credential,
        scope="PRINCIPAL_ROLE:ALL",
        **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
    )


def _create_tables(catalog_url: str, writer: PrincipalCredentials, rng: random.Random) -> None:
    catalog = _writer_catalog(catalog_url, writer)
    catalog.create_namespace(NAMESPACE)
    people, orders = people_table(rng), orders_table(rng)
    table = catalog.create_table((NAMESPACE, "people"), schema=people.schema)
    for chunk in range(4):  # several files: fragments spread over both workers
        table.append(people.slice(chunk * PEOPLE_ROWS // 4, PEOPLE_ROWS // 4))
    table = catalog.create_table((NAMESPACE, "orders"), schema=orders.schema)
    for chunk in range(4):
        table.append(orders.slice(chunk * ORDER_ROWS // 4, ORDER_ROWS // 4))
    for who in USERS:
        catalog.create_table((NAMESPACE, f"ins_{who}"), schema=pa.schema([("id", pa.int64()), ("who", pa.string())]))


def _start_server(world: World, reader: PrincipalCredentials, port: int) -> None:
    addresses = [f"127.0.0.1:{p}" for p in world.worker_ports]
    engine = server_engine_config_text(world.proxy.url, world.store.s3_endpoint, addresses, world.worker_token_file)
    (world.dir / "server-engine.toml").write_text(engine, encoding="utf-8")
    (world.dir / "server-engine.toml").chmod(0o600)
    config = world.dir / "server.toml"
    config.write_text(
        server_config_text(reader, port) + "max_concurrent_queries = 16\nmax_concurrent_queries_per_user = 8\n",
        encoding="utf-8",
    )
    config.chmod(0o600)
    port_file = world.dir / "server.port"
    argv = [sys.executable, "-m", "sqe.cli", "serve", "--config", str(config), "--port-file", str(port_file)]
    world.server = spawn(
        "server",
        argv,
        world.dir / "logs" / "server.log",
        markers=("sqe.cli", "serve"),
        scrub_aws_env=True,
        env=service_env(),
    )
    world.started.append(world.server)
    wait_until(lambda: port_file.is_file() and port_file.read_text().strip().isdigit(), "sqe serve", 90.0)
    world.server_url = f"grpc://127.0.0.1:{port}"


# --------------------------------------------------------------------------------------- raw-file oracle


def raw_rows(world: World, table: str) -> list[dict[str, Any]]:
    """The table's current rows from its data files, read with pyarrow and the store's root key (not SQE)."""
    catalog = _writer_catalog(world.catalog_url, world.writer)
    files = [task.file.file_path for task in catalog.load_table((NAMESPACE, table)).scan().plan_files()]
    endpoint = urllib.parse.urlsplit(world.store.s3_endpoint)
    fs = pafs.S3FileSystem(
        access_key=world.store.access_key_id,
        secret_key=world.store.secret_access_key,
        endpoint_override=endpoint.netloc,
        scheme=endpoint.scheme,
        region=REGION,
    )
    tables = [pq.read_table(path.removeprefix("s3://"), filesystem=fs) for path in files]
    return pa.concat_tables(tables).to_pylist() if tables else []


# ---------------------------------------------------------------------------------------------- queries


@dataclass
class Outcome:
    kind: str
    user: str
    seconds: float
    ok: bool
    error_kind: str = ""
    wrong: int = 0
    unrestricted: int = 0
    duplicated: int = 0
    detail: str = ""
    finished: float = field(default_factory=time.monotonic)


def _typed_names() -> set[str]:
    names: set[str] = set()
    pending: list[type] = [SQEError]
    while pending:
        cls = pending.pop()
        names.add(cls.__name__)
        pending.extend(cls.__subclasses__())
    return names


TYPED = re.compile(r"\b([A-Z][A-Za-z0-9]*Error): ")


def classify(exc: BaseException, typed: set[str]) -> str:
    """``TypeName`` for a typed SQE error as the client saw it; ``untyped:...`` for anything else."""
    match = TYPED.search(str(exc))
    if match and match.group(1) in typed:
        return match.group(1)
    return f"untyped:{type(exc).__name__}:{str(exc).splitlines()[0][:160] if str(exc) else ''}"


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, str(v)) for k, v in row.items()))


def _differing(expected: Counter[tuple[Any, ...]], got: Counter[tuple[Any, ...]]) -> int:
    """Rows in one multiset and not the other (missing plus extra)."""
    return sum((expected - got).values()) + sum((got - expected).values())


def judge(
    actual: list[dict[str, Any]], acceptable: list[list[dict[str, Any]]], forbidden: list[dict[str, Any]]
) -> tuple[int, int, int]:
    """(wrong, unrestricted, duplicated) rows of ``actual`` against the closest acceptable expectation."""
    got = Counter(_key(r) for r in actual)
    if any(got == Counter(_key(r) for r in expected) for expected in acceptable):
        return 0, 0, 0
    allowed: Counter[tuple[Any, ...]] = Counter()
    for expected in acceptable:
        allowed |= Counter(_key(r) for r in expected)
    forbidden_keys = {_key(r) for r in forbidden} - set(allowed)
    unrestricted = sum(n for k, n in got.items() if k in forbidden_keys)
    duplicated = sum(n - allowed[k] for k, n in got.items() if k in allowed and n > allowed[k])
    best = min(acceptable, key=lambda e: _differing(Counter(_key(r) for r in e), got))
    wrong = _differing(Counter(_key(r) for r in best), got)
    return wrong, unrestricted, duplicated


@dataclass
class Truth:
    """What the oracle knows: raw rows, restriction and grant timelines, inserted ids per user."""

    people: list[dict[str, Any]]
    orders: list[dict[str, Any]]
    restrictions: dict[str, Timeline]
    grant: Timeline  # full's TABLE_READ_DATA: True / False
    attempted: dict[str, set[int]] = field(default_factory=lambda: {u: set() for u in USERS})
    acknowledged: dict[str, dict[int, float]] = field(default_factory=lambda: {u: {} for u in USERS})
    lock: threading.Lock = field(default_factory=threading.Lock)

    def people_views(self, who: str, t0: float, t1: float) -> list[list[dict[str, Any]]]:
        return [apply_restriction(self.people, r) for r in self.restrictions[who].in_force(t0, t1)]


def _aggregate(people: list[dict[str, Any]], orders: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_id = {p["id"]: p for p in people}
    totals: dict[Any, list[int]] = {}
    for order in orders:
        person = by_id.get(order["person_id"])
        if person is not None:
            acc = totals.setdefault(person["region"], [0, 0])
            acc[0] += 1
            acc[1] += order["amount"]
    return [{"region": k, "n": v[0], "total": v[1]} for k, v in totals.items()]


def _join(people: list[dict[str, Any]], orders: list[dict[str, Any]], threshold: int) -> list[dict[str, Any]]:
    by_id = {p["id"]: p for p in people}
    out = []
    for order in orders:
        person = by_id.get(order["person_id"])
        if person is not None and order["amount"] > threshold:
            out.append({"order_id": order["order_id"], "name": person["name"], "amount": order["amount"]})
    return out


# Typed refusals meaning "retry later": the client waits before its next query (doubling, bounded).
RETRY_LATER = frozenset({"CatalogUnavailableError", "ServerBusyError", "WorkerError"})
MIN_BACKOFF, MAX_BACKOFF = 0.2, 2.0

QUERY_KINDS = ("scan", "filtered", "join", "aggregate", "prepared", "insert", "readback")


class Client:
    """One client thread's connections (its own ADBC connection and pyarrow.flight client)."""

    def __init__(self, world: World, who: str, token: str) -> None:
        self.world, self.who, self.token = world, who, token
        self.conn: Any = None
        self.flight = flight.FlightClient(world.server_url)

    def adbc(self) -> Any:
        import adbc_driver_flightsql.dbapi as dbapi

        if self.conn is None:
            headers = {"adbc.flight.sql.authorization_header": f"Bearer {self.token}"}
            self.conn = dbapi.connect(self.world.server_url, db_kwargs=headers, autocommit=True)
        return self.conn

    def reset(self) -> None:
        with contextlib.suppress(Exception):
            if self.conn is not None:
                self.conn.close()
        self.conn = None

    def close(self) -> None:
        self.reset()
        self.flight.close()

    def via_flight(self, sql: str) -> list[dict[str, Any]]:
        options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {self.token}".encode())])
        wrapper = any_pb2.Any()
        wrapper.Pack(sql_pb.CommandStatementQuery(query=sql))
        info = self.flight.get_flight_info(flight.FlightDescriptor.for_command(wrapper.SerializeToString()), options)
        rows: list[dict[str, Any]] = []
        for endpoint in info.endpoints:
            rows.extend(self.flight.do_get(endpoint.ticket, options).read_all().to_pylist())
        return rows

    def via_adbc(self, sql: str, parameters: tuple[Any, ...] | None = None) -> list[dict[str, Any]]:
        with self.adbc().cursor() as cur:
            cur.execute(sql, parameters=parameters)
            if cur.description is None:
                return []
            rows: list[dict[str, Any]] = cur.fetch_arrow_table().to_pylist()
            return rows


class Soak:
    def __init__(self, world: World, truth: Truth, queries: int, deadline: float) -> None:
        self.world, self.truth = world, truth
        self.budget, self.deadline = queries, deadline
        # Past the query budget, clients go on while this says so (until every fault kind has been injected once:
        # a fast machine would otherwise finish the budget before the injector reached some kinds).
        self.more_wanted: Callable[[], bool] = lambda: False
        self.issued = 0
        self.outcomes: list[Outcome] = []
        self.lock = threading.Lock()
        self.typed = _typed_names()
        self.next_id = 1_000_000

    def take_ticket(self) -> bool:
        with self.lock:
            if time.monotonic() > self.deadline or (self.issued >= self.budget and not self.more_wanted()):
                return False
            self.issued += 1
            return True

    def new_id(self) -> int:
        with self.lock:
            self.next_id += 1
            return self.next_id

    def run_client(self, who: str, seed: int) -> None:
        rng = random.Random(seed)
        client = Client(self.world, who, self.world.token(who))
        backoff = 0.0
        try:
            while self.take_ticket():
                kind = rng.choice(QUERY_KINDS)
                outcome = self.one(client, kind, rng)
                self.outcomes.append(outcome)
                # A real client backs off when told to retry later; without it a catalog outage of a few seconds
                # burns the whole query budget in fast refusals and nothing runs once the catalog is back.
                backoff = min(MAX_BACKOFF, max(MIN_BACKOFF, backoff * 2)) if outcome.error_kind in RETRY_LATER else 0.0
                if backoff:
                    time.sleep(backoff * (0.5 + rng.random()))
        finally:
            client.close()

    def one(self, client: Client, kind: str, rng: random.Random) -> Outcome:
        who, ns = client.who, NAMESPACE
        t0 = time.monotonic()
        pending_id: int | None = None
        param = 0
        try:
            if kind == "scan":
                sql = f"SELECT id, name, region, ssn FROM {ns}.people"
                rows = client.via_flight(sql) if rng.random() < 0.5 else client.via_adbc(sql)
            elif kind == "filtered":
                rows = client.via_adbc(f"SELECT id, name, region, ssn FROM {ns}.people WHERE id % 7 = 3")
            elif kind == "join":
                param = rng.randrange(0, 9000)
                sql = (
                    f"SELECT o.order_id, p.name, o.amount FROM {ns}.orders o JOIN {ns}.people p "
                    f"ON p.id = o.person_id WHERE o.amount > {param}"
                )
                rows = client.via_flight(sql) if rng.random() < 0.5 else client.via_adbc(sql)
            elif kind == "aggregate":
                sql = (
                    f"SELECT p.region AS region, count(*) AS n, CAST(sum(o.amount) AS BIGINT) AS total "
                    f"FROM {ns}.orders o JOIN {ns}.people p ON p.id = o.person_id GROUP BY p.region"
                )
                rows = client.via_adbc(sql)
            elif kind == "prepared":
                param = rng.randrange(0, PEOPLE_ROWS)
                rows = client.via_adbc(f"SELECT id, name, region, ssn FROM {ns}.people WHERE id > ?", (param,))
            elif kind == "insert":
                pending_id = self.new_id()
                with self.truth.lock:
                    self.truth.attempted[who].add(pending_id)
                rows = client.via_adbc(f"INSERT INTO {ns}.ins_{who} VALUES ({pending_id}, '{who}')")
            else:
                rows = client.via_adbc(f"SELECT id, who FROM {ns}.ins_{who}")
        except Exception as exc:  # every failure is classified: typed (fine) or untyped (a defect)
            client.reset()
            error_kind = classify(exc, self.typed)
            return Outcome(kind, who, time.monotonic() - t0, False, error_kind, detail=str(exc)[:300])
        t1 = time.monotonic()
        if kind == "insert" and pending_id is not None:
            with self.truth.lock:
                self.truth.acknowledged[who][pending_id] = t1
        wrong, unrestricted, duplicated = self.check(kind, who, rows, t0, t1, param)
        return Outcome(kind, who, t1 - t0, True, "", wrong, unrestricted, duplicated)

    def check(
        self, kind: str, who: str, rows: list[dict[str, Any]], t0: float, t1: float, param: int
    ) -> tuple[int, int, int]:
        truth = self.truth
        # A result is served while revoked only if no moment of its window had the grant in force.
        served_while_revoked = who == "full" and truth.grant.only(t0, t1) is False
        if kind == "insert":
            return 0, 0, 0
        if kind == "readback":
            return self.check_readback(who, rows, t0)
        views = truth.people_views(who, t0, t1)
        raw = truth.people
        if kind == "filtered":
            views = [[r for r in v if r["id"] % 7 == 3] for v in views]
            raw = [r for r in raw if r["id"] % 7 == 3]
        elif kind == "prepared":
            views = [[r for r in v if r["id"] > param] for v in views]
            raw = [r for r in raw if r["id"] > param]
        elif kind == "join":
            views = [_join(v, truth.orders, param) for v in views]
            raw = _join(raw, truth.orders, param)
        elif kind == "aggregate":
            views = [_aggregate(v, truth.orders) for v in views]
            raw = _aggregate(raw, truth.orders)
        wrong, unrestricted, duplicated = judge(rows, views, raw)
        if served_while_revoked:
            unrestricted += len(rows)
        return wrong, unrestricted, duplicated

    def check_readback(self, who: str, rows: list[dict[str, Any]], t0: float) -> tuple[int, int, int]:
        with self.truth.lock:
            attempted = set(self.truth.attempted[who])
            must = {i for i, at in self.truth.acknowledged[who].items() if at < t0}
        ids = Counter(int(r["id"]) for r in rows)
        duplicated = sum(n - 1 for n in ids.values() if n > 1)
        wrong = sum(1 for i in ids if i not in attempted) + len(must - set(ids))
        wrong += sum(1 for r in rows if r["who"] != who)
        return wrong, 0, duplicated


# --------------------------------------------------------------------------------------------- faults


FAULTS = ("kill_worker", "burst_503", "burst_429", "slow", "revoke_grant", "change_restriction", "restart_catalog")


@dataclass
class Injector:
    world: World
    truth: Truth
    rng: random.Random
    interval: float
    done: threading.Event = field(default_factory=threading.Event)
    log: list[tuple[float, str]] = field(default_factory=list)
    catalog_back_at: list[float] = field(default_factory=list)  # monotonic: each restarted catalog answering
    versions: dict[str, int] = field(default_factory=lambda: {"rowf": 0, "mask": 0})
    errors: list[str] = field(default_factory=list)
    attempted: set[str] = field(default_factory=set)

    def tried_every_kind(self) -> bool:
        """Every fault kind attempted once (one that fails is in ``errors``, and the test fails on it)."""
        return set(FAULTS) <= self.attempted

    def schedule(self) -> Iterator[str]:
        """Every kind once per round, in a seeded order: a short run still sees each fault."""
        while True:
            kinds = list(FAULTS)
            self.rng.shuffle(kinds)
            yield from kinds

    def run(self) -> None:
        start = time.monotonic()
        for kind in self.schedule():
            if self.done.wait(self.interval * (0.5 + self.rng.random())):
                return
            self.attempted.add(kind)
            try:
                getattr(self, kind)()
                self.log.append((round(time.monotonic() - start, 1), kind))
            except Exception as exc:  # an injector failure is reported, never swallowed
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")

    def kill_worker(self) -> None:
        index = self.rng.randrange(len(self.world.workers))
        self.world.kill_worker(index)
        self.done.wait(self.rng.uniform(0.5, 2.0))
        self.world.start_worker(index)

    def burst_503(self) -> None:
        self.world.proxy.inject(503, self.rng.randint(2, 6), retry_after="0")

    def burst_429(self) -> None:
        self.world.proxy.inject(429, self.rng.randint(2, 6), retry_after="1")

    def slow(self) -> None:
        self.world.proxy.inject(0, self.rng.randint(3, 10), delay=self.rng.uniform(0.5, 2.0))

    def revoke_grant(self) -> None:
        scope = ("--warehouse", WAREHOUSE, "--namespace", NAMESPACE)
        with self.truth.grant.change(False):
            self.world.admin("revoke", "full_role", "TABLE_READ_DATA", *scope)
        self.done.wait(self.rng.uniform(1.0, 3.0))
        with self.truth.grant.change(True):
            self.world.admin("grant", "full_role", "TABLE_READ_DATA", *scope)

    def change_restriction(self) -> None:
        who = self.rng.choice(sorted(self.versions))
        self.versions[who] ^= 1
        document = RESTRICTION_VERSIONS[who][self.versions[who]]
        with self.truth.restrictions[who].change(document):
            set_restriction(self.world, who, document)

    def restart_catalog(self) -> None:
        self.world.restart_catalog()
        self.catalog_back_at.append(time.monotonic())


def set_restriction(world: World, who: str, document: dict[str, Any]) -> None:
    path = world.dir / f"restriction-{who}.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    target = ("--warehouse", WAREHOUSE, "--namespace", NAMESPACE, "--table", "people")
    world.admin("set-restrictions", *target, "--principal", who, "--file", str(path))


# ------------------------------------------------------------------------------------------- resources


def proc_status(pid: int) -> dict[str, int]:
    """Peak RSS (KiB), open file descriptors and threads of a live process, from /proc."""
    fields: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmHWM", "Threads"):
                fields[name] = int(value.split()[0])
        fields["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {}
    return fields


def thread_names(pid: int) -> dict[str, int]:
    names: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                names[Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()] += 1
    return dict(names.most_common(8))


TCP_STATES = {"01": "established", "06": "time-wait", "08": "close-wait", "0A": "listen"}


def fd_kinds(pid: int, known_ports: dict[int, str]) -> dict[str, int]:
    """The process's descriptors by kind; its TCP sockets by state and the service at the other end.

    A leak shows up as one growing kind (e.g. ``tcp close-wait -> catalog``), which names the pool to look at.
    """
    kinds: Counter[str] = Counter()
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
                else:
                    kinds[re.sub(r"\d+", "N", target)] += 1
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                inodes.discard(fields[9])
                local, remote = (int(f.split(":")[1], 16) for f in fields[1:3])
                peer = known_ports.get(remote) or ("client" if local in known_ports else "other")
                kinds[f"tcp {TCP_STATES.get(fields[3], fields[3])} -> {peer}"] += 1
    kinds["other sockets"] += len(inodes)
    return dict(kinds.most_common(10))


def known_ports(world: World) -> dict[int, str]:
    ports = {world.catalog_port: "catalog", int(world.proxy.url.rsplit(":", 1)[1]): "proxy"}
    ports.update({p: f"worker-{i}" for i, p in enumerate(world.worker_ports)})
    ports[int(world.server_url.rsplit(":", 1)[1])] = "server"
    store_port = urllib.parse.urlsplit(world.store.s3_endpoint).port
    if store_port is not None:
        ports[store_port] = "store"
    return ports


@dataclass
class Resources:
    peak_rss_kib: Counter[str] = field(default_factory=Counter)

    def sample(self, world: World) -> None:
        for name, pid in [("server", world.server.pid), *((f"worker-{i}", w.pid) for i, w in enumerate(world.workers))]:
            status = proc_status(pid)
            self.peak_rss_kib[name] = max(self.peak_rss_kib[name], status.get("VmHWM", 0))


# --------------------------------------------------------------------------------------------- report


@dataclass
class Report:
    queries: int
    ok: int
    wrong_rows: int
    unrestricted_rows: int
    duplicated_rows: int
    failures: dict[str, int]
    untyped: list[str]
    p50_ms: float
    p99_ms: float
    by_kind: dict[str, int]
    catalog_calls: dict[str, dict[str, int]]
    peak_rss_mib: dict[str, float]
    server_start: dict[str, int]
    server_end: dict[str, int]
    workers_end: dict[str, dict[str, int]]
    faults: list[tuple[float, str]]
    injector_errors: list[str]
    final_insert_check: dict[str, tuple[int, int, int]]
    seconds: float
    bad_samples: list[str] = field(default_factory=list)
    failure_samples: dict[str, str] = field(default_factory=dict)
    server_threads_by_name: dict[str, int] = field(default_factory=dict)
    server_fds_by_kind: dict[str, int] = field(default_factory=dict)
    workers_fds_by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    secrets_seen: set[str] = field(default_factory=set, repr=False)  # for the caller's log checks; never printed
    # Queries answered correctly after the last catalog restart (None: no restart): the service recovered.
    ok_after_catalog_restart: int | None = None
    recovery_probe: dict[str, str] = field(default_factory=dict)  # user -> "ok" or the error, after a restart

    def lines(self) -> list[str]:
        out = [
            f"queries run          {self.queries} ({self.ok} ok) in {self.seconds:.0f} s; by kind {self.by_kind}",
            f"wrong rows           {self.wrong_rows}",
            f"unrestricted rows    {self.unrestricted_rows}",
            f"duplicated rows      {self.duplicated_rows}",
            f"failures by kind     {dict(sorted(self.failures.items())) or 'none'}",
            f"untyped failures     {len(self.untyped)}",
            f"latency              p50 {self.p50_ms:.0f} ms, p99 {self.p99_ms:.0f} ms",
            f"faults injected      {Counter(kind for _, kind in self.faults)}",
            "catalog per (user, table, lifetime): STS calls / loads",
        ]
        out += [
            f"  {key:<32} sts {v['sts']:>4}  loads {v['loads']:>5}" for key, v in sorted(self.catalog_calls.items())
        ]
        out.append(f"peak RSS (MiB)       {self.peak_rss_mib}")
        out.append(f"server fds/threads   start {self.server_start} end {self.server_end}")
        if self.ok_after_catalog_restart is not None:
            out.append(f"ok after the last catalog restart: {self.ok_after_catalog_restart}")
            out.append(f"recovery probe after the faults: {self.recovery_probe}")
        out.append(f"workers at the end   {self.workers_end}")
        out.append(f"final INSERT check (wrong, missing, duplicated) from raw files: {self.final_insert_check}")
        out += [f"failure sample {kind}: {text}" for kind, text in sorted(self.failure_samples.items())]
        out.append(f"server threads by name at the end: {self.server_threads_by_name}")
        out.append(f"server descriptors by kind at the end: {self.server_fds_by_kind}")
        for name, kinds in self.workers_fds_by_kind.items():
            out.append(f"{name} descriptors by kind at the end: {kinds}")
        out += [f"untyped: {u}" for u in self.untyped[:10]]
        out += [f"bad result: {b}" for b in self.bad_samples[:10]]
        out += [f"injector error: {e}" for e in self.injector_errors]
        return out


VEND = re.compile(r"vend warehouse=\S+ principal=(\S+)(?: reader=\S+)? table=(\S+) write=(\S+) cache=(\S+)")
LOAD = re.compile(r"GET /v1/[^/]+/namespaces/([^/]+)/tables/([^/\s]+) -> (\d+) principal=(\S+)")


def catalog_calls(log_text: str) -> dict[str, dict[str, int]]:
    """STS AssumeRole calls (vend cache misses) and table loads per (user, table, credential lifetime)."""
    calls: dict[str, dict[str, int]] = {}
    for principal, table, _write, cache in VEND.findall(log_text):
        if cache == "miss":
            name = re.split(r"[./]", table)[-1]
            entry = calls.setdefault(f"({principal}, {name}, {CREDENTIAL_LIFETIME}s)", {"sts": 0, "loads": 0})
            entry["sts"] += 1
    for _ns, table, _status, principal in LOAD.findall(log_text):
        entry = calls.setdefault(f"({principal}, {table}, {CREDENTIAL_LIFETIME}s)", {"sts": 0, "loads": 0})
        entry["loads"] += 1
    return calls


def final_insert_check(world: World, truth: Truth) -> dict[str, tuple[int, int, int]]:
    """Every acknowledged INSERT in the raw files, nothing never attempted, nothing twice."""
    result = {}
    for who in USERS:
        ids = Counter(int(r["id"]) for r in raw_rows(world, f"ins_{who}"))
        wrong = sum(1 for i in ids if i not in truth.attempted[who])
        missing = len(set(truth.acknowledged[who]) - set(ids))
        result[who] = (wrong, missing, sum(n - 1 for n in ids.values() if n > 1))
    return result


@dataclass
class SoakConfig:
    queries: int = 1000
    seed: int = 17
    clients_per_user: int = 2
    time_budget: float = 3600.0
    fault_interval: float = 4.0
    settle_seconds: float = 5.0
    dir: Path | None = None
    running_store: StoreHandle | None = None  # a Ceph RGW to use instead of starting one (start_world)


def _warm_up(world: World) -> None:
    """One query per user before the start figures are taken: sessions and pools exist, nothing is counted."""
    for who in USERS:
        client = Client(world, who, world.token(who))
        try:
            client.via_adbc(f"SELECT count(*) AS n FROM {NAMESPACE}.people")
        finally:
            client.close()


def run_soak(config: SoakConfig) -> Report:
    with contextlib.ExitStack() as stack:
        dir = config.dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sqe-soak-")))
        world = start_world(dir, config.seed, config.running_store)
        stack.callback(world.stop)
        return _soak(world, config)
    raise AssertionError("unreachable")


def _soak(world: World, config: SoakConfig) -> Report:
    for who in ("rowf", "mask"):
        set_restriction(world, who, RESTRICTION_VERSIONS[who][0])
    restrictions = {"full": Timeline(), "rowf": Timeline(), "mask": Timeline()}
    restrictions["full"].start(None)
    for who in ("rowf", "mask"):
        restrictions[who].start(RESTRICTION_VERSIONS[who][0])
    grant = Timeline()
    grant.start(True)
    truth = Truth(raw_rows(world, "people"), raw_rows(world, "orders"), restrictions, grant)
    _warm_up(world)
    resources = Resources()
    server_start = proc_status(world.server.pid)
    started = time.monotonic()
    soak = Soak(world, truth, config.queries, started + config.time_budget)
    injector = Injector(world, truth, random.Random(config.seed), config.fault_interval)
    threads = [threading.Thread(target=injector.run, name="injector")]
    soak.more_wanted = lambda: threads[0].is_alive() and not injector.tried_every_kind()
    for index, who in enumerate(USERS * config.clients_per_user):
        threads.append(threading.Thread(target=soak.run_client, args=(who, config.seed * 100 + index), name=who))
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads[1:]):
        resources.sample(world)
        time.sleep(1.0)
    injector.done.set()
    threads[0].join(120)
    seconds = time.monotonic() - started
    world.proxy.reset()
    if not injector.catalog_back_at:  # a short run may end before the seeded restart: restart once now
        injector.restart_catalog()
    probe = _recovery_probe(world)
    time.sleep(config.settle_seconds)  # let idle pools shrink before the end figures
    resources.sample(world)
    server_end = proc_status(world.server.pid)
    report = _report(world, soak, injector, resources, truth, server_start, server_end, seconds)
    report.recovery_probe = probe
    return report


def _recovery_probe(world: World) -> dict[str, str]:
    """After the faults (a catalog restart among them): one query per user through the same server, "ok" or the
    error. The server's caches (reader and delegated tokens, engines) must not keep a restart's failures."""
    results: dict[str, str] = {}
    for who in USERS:
        client = Client(world, who, world.token(who))
        try:
            client.via_adbc(f"SELECT count(*) AS n FROM {NAMESPACE}.people")
            results[who] = "ok"
        except Exception as exc:  # reported, and the test fails on it
            results[who] = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        finally:
            client.close()
    return results


def _report(
    world: World,
    soak: Soak,
    injector: Injector,
    resources: Resources,
    truth: Truth,
    server_start: dict[str, int],
    server_end: dict[str, int],
    seconds: float,
) -> Report:
    outcomes = soak.outcomes
    latencies = sorted(o.seconds * 1000 for o in outcomes if o.ok) or [0.0]
    failures = Counter(o.error_kind for o in outcomes if not o.ok)
    untyped = [
        f"{o.kind}/{o.user}: {o.error_kind} | {o.detail}" for o in outcomes if o.error_kind.startswith("untyped")
    ]
    bad = [
        f"{o.kind}/{o.user}: wrong {o.wrong} unrestricted {o.unrestricted} dup {o.duplicated}"
        for o in outcomes
        if o.wrong or o.unrestricted or o.duplicated
    ]
    log_text = (world.dir / "logs" / "catalog.log").read_text(encoding="utf-8", errors="replace")
    workers_end = {f"worker-{i}": proc_status(w.pid) for i, w in enumerate(world.workers)}
    return Report(
        queries=len(outcomes),
        ok=sum(1 for o in outcomes if o.ok),
        wrong_rows=sum(o.wrong for o in outcomes),
        unrestricted_rows=sum(o.unrestricted for o in outcomes),
        duplicated_rows=sum(o.duplicated for o in outcomes),
        failures=dict(failures),
        untyped=untyped,
        p50_ms=statistics.median(latencies),
        p99_ms=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        by_kind=dict(Counter(o.kind for o in outcomes)),
        catalog_calls=catalog_calls(log_text),
        peak_rss_mib={k: round(v / 1024, 1) for k, v in resources.peak_rss_kib.items()},
        server_start=server_start,
        server_end=server_end,
        workers_end=workers_end,
        faults=injector.log,
        injector_errors=injector.errors,
        final_insert_check=final_insert_check(world, truth),
        seconds=seconds,
        bad_samples=bad,
        failure_samples={o.error_kind: f"{o.kind}/{o.user}: {o.detail}" for o in reversed(outcomes) if not o.ok},
        server_threads_by_name=thread_names(world.server.pid),
        server_fds_by_kind=fd_kinds(world.server.pid, known_ports(world)),
        workers_fds_by_kind={f"worker-{i}": fd_kinds(w.pid, known_ports(world)) for i, w in enumerate(world.workers)},
        secrets_seen=set(world.secrets),
        ok_after_catalog_restart=_ok_after(outcomes, injector.catalog_back_at),
    )


def _ok_after(outcomes: list[Outcome], catalog_back_at: list[float]) -> int | None:
    if not catalog_back_at:
        return None
    return sum(1 for o in outcomes if o.ok and o.finished > catalog_back_at[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--clients-per-user", type=int, default=2)
    parser.add_argument("--fault-interval", type=float, default=4.0, help="mean seconds between faults")
    parser.add_argument("--dir", type=Path, help="keep the world's files and logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    config = SoakConfig(
        queries=args.queries,
        seed=args.seed,
        clients_per_user=args.clients_per_user,
        fault_interval=args.fault_interval,
        dir=args.dir,
    )
    report = run_soak(config)
    print("\n".join(report.lines()))
    clean = not (report.wrong_rows or report.unrestricted_rows or report.duplicated_rows or report.untyped)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
