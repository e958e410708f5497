"""``sqe serve``: a real server process on loopback, driven by real Flight SQL clients (ADBC, pyarrow.flight).

World: the session's catalog on moto; a writer creates ``people`` (restricted per user) and ``numbers`` (large,
unrestricted); alice and bob have different restrictions on ``people``, carol none. The server runs with a reader
identity (a ``--reader`` principal): every user's calls go through the IdentityBroker's RFC 8693 exchange, since
the catalog refuses a restricted user's own token on ``people``. A second server process with ``[coordinator]
workers`` runs the same scans on real workers; further servers cover TLS with tighter limits, and a catalog with
a few-second token lifetime covers the delegated-token cache and expired user tokens.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

from sqe.server._proto import flight_cancel_pb2 as cancel_pb
from sqe.server._proto import flight_sql_pb2 as sql_pb
from sqe.server.identity import _claims_of
from tests.helpers.flight import CallOptions, bearer

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer, WorkerFactory

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PEOPLE = pa.table(
    {
        "id": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
        "name": pa.array(["ada", "grace", "linus", "margaret", "alan", "tim"], pa.string()),
        "region": pa.array(["EU", "US", "EU", "US", "UK", "EU"], pa.string()),
        "ssn": pa.array(["111-22-3333", "222-33-4444", "333-44-5555", "444-55-6666", "555-66-7777", None], pa.string()),
    }
)
# field ids: 1 id, 2 name, 3 region, 4 ssn
ALICE = {
    "required-row-filter": {"type": "eq", "left": {"type": "reference", "id": 3}, "right": "EU"},
    "required-column-projections": [{"field-id": 4, "action": "show-last-4"}],
}
BOB = {
    "required-row-filter": {"type": "in", "child": {"type": "reference", "id": 3}, "values": ["US", "UK"]},
    "required-column-projections": [{"field-id": 4, "action": "replace-with-null"}],
}
NUMBER_ROWS = 2_000_000
PER_USER_LIMIT = 2
PARAMETER_BYTES = 1024 * 1024  # [server] max_parameter_bytes of the shared server


@dataclass
class Served:
    catalog: CatalogServer
    namespace: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    workdir: Path
    users: dict[str, CatalogPrincipal]
    errors_seen: list[str] = field(default_factory=list)

    def token(self, who: str) -> str:
        return self.catalog.token(self.users[who])

    def adbc(self, who: str, **options: str) -> Any:
        return self.adbc_as(self.users[who], **options)

    def adbc_as(self, principal: CatalogPrincipal, **options: str) -> Any:
        import adbc_driver_flightsql.dbapi as dbapi

        headers = {"adbc.flight.sql.authorization_header": f"Bearer {self.catalog.token(principal)}"}
        return dbapi.connect(self.url, db_kwargs={**headers, **options}, autocommit=True)

    def flight_client(self) -> flight.FlightClient:
        return flight.FlightClient(self.url)

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def expect_error(self, call: Any, *types: type[BaseException]) -> BaseException:
        with pytest.raises(types) as err:
            call()
        self.errors_seen.append(str(err.value))
        return err.value


def _principal(server: CatalogServer, name: str, grants: list[tuple[str, str | None]]) -> CatalogPrincipal:
    return server.principal_with_grants(name, [(p, ns, None) for p, ns in grants])


def _write_configs(
    workdir: Path, catalog: CatalogServer, *, coordinator: dict[str, Any] | None = None, **server: Any
) -> Path:
    engine = workdir / "engine.toml"
    sections = [f"{k} = {json.dumps(v)}" for k, v in (coordinator or {}).items()]
    engine.write_text(
        "\n".join(
            [
                "[catalog]",
                f'uri = "{catalog.url}"',
                f'warehouse = "{catalog.warehouse}"',
                'access_delegation = "vended-credentials"',
                "require_vended_credentials = true",
                "",
                "[storage]",
                f'endpoint = "{catalog.moto.url}"',
                f'region = "{catalog.moto.region}"',
                "path_style = true",
                *(["", "[coordinator]", *sections] if sections else []),
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    settings = {
        "engine_config": "engine.toml",
        "listen": "127.0.0.1:0",
        "max_concurrent_queries": 4,
        "max_concurrent_queries_per_user": PER_USER_LIMIT,
        **server,
    }
    config = workdir / "server.toml"
    config.write_text("[server]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    config.chmod(0o600)  # it holds the reader secret
    return config


def _reader_settings(reader: CatalogPrincipal) -> dict[str, str]:
    return {"reader_client_id": reader.client_id, "reader_client_secret": reader.client_secret}


def start_server(workdir: Path, config: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    port_file, log_path = workdir / "port", workdir / "server.log"
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SQE_"))}
    child_env.update({"AWS_EC2_METADATA_DISABLED": "true", **(env or {})})
    command = [sys.executable, "-m", "sqe.cli", "serve", "--config", str(config), "--port-file", str(port_file)]
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [*command, "--log-level", "debug"], stdout=log_file, stderr=subprocess.STDOUT, env=child_env
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sqe serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        if port_file.is_file() and port_file.read_text().strip():
            return proc, int(port_file.read_text())
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("sqe serve did not start")


@pytest.fixture(scope="module")
def served(
    catalog_server: CatalogServer, catalog_reader: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    from tests.conftest import pyiceberg_catalog
    from tests.helpers.processes import stop_child

    suffix = uuid.uuid4().hex[:6]
    namespace = f"served_{suffix}"
    writer = _principal(
        catalog_server,
        f"srv_writer_{suffix}",
        [("NAMESPACE_FULL_METADATA", None), ("TABLE_CREATE", None), ("TABLE_WRITE_DATA", None)],
    )
    readers = {
        who: _principal(catalog_server, f"srv_{who}_{suffix}", [("NAMESPACE_LIST", None), ("TABLE_READ_DATA", None)])
        for who in ("alice", "bob", "carol")
    }
    workdir = tmp_path_factory.mktemp("served")
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        catalog = pyiceberg_catalog(catalog_server, writer)
        catalog.create_namespace(namespace)
        catalog.create_table((namespace, "people"), schema=PEOPLE.schema).append(PEOPLE)
        numbers = pa.table({"n": pa.array(range(NUMBER_ROWS), pa.int64())})
        numbers = numbers.append_column("label", pa.array([f"row-{i:09d}" for i in range(NUMBER_ROWS)]))
        catalog.create_table((namespace, "numbers"), schema=numbers.schema).append(numbers)
        catalog.create_table((namespace, "sink"), schema=pa.schema([("id", pa.int64()), ("name", pa.string())]))
        catalog.create_table((namespace, "hammer"), schema=pa.schema([("id", pa.int64()), ("name", pa.string())]))
    for who, document in (("alice", ALICE), ("bob", BOB)):
        path = workdir / f"{who}.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        target = ["--warehouse", catalog_server.warehouse, "--namespace", namespace, "--table", "people"]
        catalog_server.admin_cli("set-restrictions", *target, "--principal", readers[who].name, "--file", str(path))
    config = _write_configs(
        workdir, catalog_server, max_parameter_bytes=PARAMETER_BYTES, **_reader_settings(catalog_reader)
    )
    proc, port = start_server(workdir, config)
    users = {"writer": writer, **readers}
    world = Served(catalog_server, namespace, f"grpc://127.0.0.1:{port}", proc, workdir / "server.log", workdir, users)
    try:
        yield world
    finally:
        stop_child(proc)
        log = world.log_text()
        for secret in catalog_server.secrets:
            assert secret not in log, "a secret reached the server log"
        for message in world.errors_seen:
            assert "Traceback" not in message
            for secret in catalog_server.secrets:
                assert secret not in message


def _command(message: Any) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(message)
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def _bearer(token: str) -> flight.FlightCallOptions:
    return bearer(token)  # its repr hides the token, which a failure's traceback would print


# ------------------------------------------------------------------------------------------ ADBC client


def test_adbc_query_fetches_arrow(served: Served) -> None:
    with served.adbc("carol") as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, name FROM {served.namespace}.people ORDER BY id")
        table = cur.fetch_arrow_table()
    assert table.column("name").to_pylist() == PEOPLE.column("name").to_pylist()


ALICE_ROWS = [
    {"id": 1, "region": "EU", "ssn": "nnn-nn-3333"},
    {"id": 3, "region": "EU", "ssn": "nnn-nn-5555"},
    {"id": 6, "region": "EU", "ssn": None},
]
BOB_ROWS = [
    {"id": 2, "region": "US", "ssn": None},
    {"id": 4, "region": "US", "ssn": None},
    {"id": 5, "region": "UK", "ssn": None},
]


@pytest.fixture(scope="module")
def served_distributed(
    served: Served, catalog_reader: CatalogPrincipal, worker_process_factory: WorkerFactory
) -> Iterator[Served]:
    """A second ``sqe serve`` whose engine config names two real workers: scans run there."""
    from tests.helpers.processes import stop_child

    token = secrets.token_hex(16)
    workers = [worker_process_factory.start("--log-level", "DEBUG", token=token) for _ in range(2)]
    workdir = served.workdir / "distributed"
    workdir.mkdir()
    coordinator = {"workers": [w.address for w in workers], "token": token}
    config = _write_configs(workdir, served.catalog, coordinator=coordinator, **_reader_settings(catalog_reader))
    proc, port = start_server(workdir, config)
    world = dataclasses.replace(served, url=f"grpc://127.0.0.1:{port}", proc=proc, log_path=workdir / "server.log")
    world.errors_seen = served.errors_seen
    try:
        yield world
    finally:
        stop_child(proc)
        log = world.log_text()
        for secret in served.catalog.secrets:
            assert secret not in log, "a secret reached the distributed server's log"
        for worker in workers:
            worker.stop()
            assert "fragment" in worker.log_text().lower(), "no scan fragment ran on this worker"


@pytest.fixture(params=["local", "distributed"])
def any_mode(request: pytest.FixtureRequest) -> Served:
    name = "served" if request.param == "local" else "served_distributed"
    world: Served = request.getfixturevalue(name)
    return world


def test_two_users_with_different_restrictions_each_see_their_own_rows_and_masks(any_mode: Served) -> None:
    """alice and bob at once on ``people`` through delegated tokens, while carol's long scan streams."""
    served = any_mode
    sql = f"SELECT id, region, ssn FROM {served.namespace}.people ORDER BY id"
    client = served.flight_client()
    carol = _bearer(served.token("carol"))
    scan = f"SELECT n, label FROM {served.namespace}.numbers"
    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=scan)), carol)
    long_scan = client.do_get(info.endpoints[0].ticket, carol)
    carol_rows = long_scan.read_chunk().data.num_rows  # started; flow control holds the rest
    results: dict[str, list[dict[str, Any]]] = {}
    failures: list[BaseException] = []

    def run(who: str) -> None:
        try:
            for _ in range(2):  # twice: the second run reuses the cached delegated token and engine
                with served.adbc(who) as conn, conn.cursor() as cur:
                    cur.execute(sql)
                    results.setdefault(who, []).extend(cur.fetch_arrow_table().to_pylist())
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(who,)) for who in ("alice", "bob")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not failures, failures
    assert results["alice"] == ALICE_ROWS * 2
    assert results["bob"] == BOB_ROWS * 2
    for chunk in long_scan:
        carol_rows += chunk.data.num_rows
    assert carol_rows == NUMBER_ROWS
    with served.adbc("carol") as conn, conn.cursor() as cur:
        cur.execute(sql)
        assert [r["ssn"] for r in cur.fetch_arrow_table().to_pylist()] == PEOPLE.column("ssn").to_pylist()


def test_the_same_analysts_direct_pyiceberg_load_is_refused(served: Served) -> None:
    """What the server reads for alice, alice herself cannot: her own token with the header copied gets 403."""
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import ForbiddenError

    from sqe.vocabulary import ACCESS_DELEGATION_HEADER, CAPABILITIES_HEADER, READ_RESTRICTIONS_V1, VENDED_CREDENTIALS

    headers = {CAPABILITIES_HEADER: READ_RESTRICTIONS_V1, ACCESS_DELEGATION_HEADER: VENDED_CREDENTIALS}
    bypass = RestCatalog(
        f"bypass-{uuid.uuid4().hex[:6]}",
        uri=served.catalog.url,
        warehouse=served.catalog.warehouse,
        credential=served.users["alice"].credential,
        scope="PRINCIPAL_ROLE:ALL",
        **{f"header.{name}": value for name, value in headers.items()},
    )
    with pytest.raises(ForbiddenError, match="the catalog only serves this table through a trusted reader"):
        bypass.load_table((served.namespace, "people"))
    with served.adbc("alice") as conn, conn.cursor() as cur:  # and through the server she gets her rows
        cur.execute(f"SELECT id, region, ssn FROM {served.namespace}.people ORDER BY id")
        assert cur.fetch_arrow_table().to_pylist() == ALICE_ROWS


def test_errors_never_carry_a_raw_value_of_a_masked_column(served: Served) -> None:
    """A predicate that fails on the masked column's values: no raw ssn (visible or filtered) in the error."""
    client = served.flight_client()
    raw = [v for v in PEOPLE.column("ssn").to_pylist() if v]
    queries = [
        f"SELECT id FROM {served.namespace}.people WHERE CAST(ssn AS INTEGER) = 1",
        f"SELECT id FROM {served.namespace}.people WHERE ssn::DATE > DATE '2000-01-01'",
        f"SELECT CAST(ssn AS BIGINT) FROM {served.namespace}.people",
    ]

    def run(who: str, query: str) -> pa.Table:
        options = _bearer(served.token(who))
        info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=query)), options)
        return client.do_get(info.endpoints[0].ticket, options).read_all()

    for sql in queries:  # alice sees "nnn-nn-3333": the cast fails on the masked value, never on the raw one
        error = str(served.expect_error(lambda q=sql: run("alice", q), flight.FlightError))
        assert "nnn-nn-" in error
        assert not [value for value in raw if value in error], f"a raw masked value in: {error}"
        assert not [value for value in raw if value.replace("-", "") in error.replace("-", "")]
    # bob's mask is NULL: the same predicates see only NULLs, so nothing fails and nothing matches
    assert run("bob", queries[0]).num_rows == 0
    assert run("bob", queries[2]).column(0).to_pylist() == [None, None, None]


def test_adbc_prepared_statement_with_parameters(served: Served) -> None:
    with served.adbc("carol") as conn, conn.cursor() as cur:
        sql = f"SELECT name FROM {served.namespace}.people WHERE id = ?"
        cur.execute(sql, parameters=(3,))
        assert cur.fetchall() == [("linus",)]
        cur.execute(sql, parameters=(5,))
        assert cur.fetchall() == [("alan",)]


def test_adbc_metadata_browse(served: Served) -> None:
    with served.adbc("carol") as conn:
        objects = conn.adbc_get_objects(depth="tables", db_schema_filter=served.namespace).read_all().to_pylist()
        schema = conn.adbc_get_table_schema(
            "people", catalog_filter=served.catalog.warehouse, db_schema_filter=served.namespace
        )
        types = conn.adbc_get_table_types()
    [warehouse] = [o for o in objects if o["catalog_name"] == served.catalog.warehouse]
    [namespace] = warehouse["catalog_db_schemas"]
    assert namespace["db_schema_name"] == served.namespace
    assert {t["table_name"] for t in namespace["db_schema_tables"]} == {"people", "numbers", "sink", "hammer"}
    assert schema.names == ["id", "name", "region", "ssn"]
    assert types == ["TABLE", "VIEW"]


def _sql_info(served: Served, who: str) -> dict[int, Any]:
    client = served.flight_client()
    options = _bearer(served.token(who))
    info = client.get_flight_info(_command(sql_pb.CommandGetSqlInfo()), options)
    rows = client.do_get(info.endpoints[0].ticket, options).read_all().to_pylist()
    return {row["info_name"]: row["value"] for row in rows}


def test_metadata_patterns_honour_the_escape_the_server_advertises(served: Served) -> None:
    """Found by review: GetDbSchemas/GetTables knew no escape, so ``_`` always matched any character: a client
    could not ask for the table ``a_b`` without also getting ``axb`` (and no SQL_SEARCH_STRING_ESCAPE told it
    otherwise); ``a\\_b``, JDBC's escaped form, matched nothing at all."""
    from tests.conftest import pyiceberg_catalog

    suffix = uuid.uuid4().hex[:6]
    exact, lookalike = f"pat_{suffix}", f"patx{suffix}"
    catalog = pyiceberg_catalog(served.catalog, served.users["writer"])
    for namespace in (exact, lookalike):
        catalog.create_namespace(namespace)
        for table in ("a_b", "axb"):
            catalog.create_table((namespace, table), schema=pa.schema([("id", pa.int64())]))
    escape = _sql_info(served, "carol")[513]  # SQL_SEARCH_STRING_ESCAPE
    assert escape == "\\"

    def listed(schema_filter: str, table_filter: str) -> list[tuple[str, list[str]]]:
        with served.adbc("carol") as conn:
            objects = conn.adbc_get_objects(
                depth="tables", db_schema_filter=schema_filter, table_name_filter=table_filter
            ).read_all()
        [warehouse] = [o for o in objects.to_pylist() if o["catalog_name"] == served.catalog.warehouse]
        schemas = warehouse["catalog_db_schemas"] or []
        return [(s["db_schema_name"], sorted(t["table_name"] for t in s["db_schema_tables"])) for s in schemas]

    assert listed(f"pat{escape}_{suffix}", f"a{escape}_b") == [(exact, ["a_b"])]
    assert listed(f"pat_{suffix}", "a_b") == [(exact, ["a_b", "axb"]), (lookalike, ["a_b", "axb"])]
    client = served.flight_client()
    trailing = _command(sql_pb.CommandGetTables(table_name_filter_pattern=f"a{escape}"))
    error = served.expect_error(
        lambda: client.get_flight_info(trailing, _bearer(served.token("carol"))), flight.FlightServerError
    )
    assert "ends with the escape character" in str(error)


def test_tables_are_listed_whatever_characters_their_namespace_holds(served: Served) -> None:
    """A namespace named ``v1.2-…`` (legal in Iceberg) made GetTables fail for every caller: the name was handed on
    unquoted and parsed as SQL."""
    from tests.conftest import pyiceberg_catalog

    namespace = f"v1.2-{uuid.uuid4().hex[:6]}"
    catalog = pyiceberg_catalog(served.catalog, served.users["writer"])
    catalog.create_namespace((namespace,))  # one level whose name holds a dot
    catalog.create_table((namespace, "t"), schema=pa.schema([("id", pa.int64())]))
    client, options = served.flight_client(), _bearer(served.token("carol"))
    listing = _command(sql_pb.CommandGetTables(db_schema_filter_pattern="v1.2-%", include_schema=True))
    info = client.get_flight_info(listing, options)
    rows = client.do_get(info.endpoints[0].ticket, options).read_all().to_pylist()
    assert [(r["db_schema_name"], r["table_name"]) for r in rows if r["db_schema_name"] == namespace] == [
        (namespace, "t")
    ]


def test_sql_info_tells_what_the_server_does(served: Served) -> None:
    """Found by review: GetSqlInfo said CREATE/DROP of schemas and tables were unsupported (both run), that names
    are stored in lower case (``MixedCase`` keeps its case and ``mixedcase`` does not find it) and that every
    listed table is selectable (TABLE_LIST lists tables a user may not read)."""
    import adbc_driver_flightsql.dbapi as dbapi

    info = _sql_info(served, "carol")
    assert (info[0], info[3], info[8]) == ("sqe", False, 0)  # name, read-write, no Flight SQL transactions
    suffix = uuid.uuid4().hex[:6]
    schema = f"ddl_{suffix}"
    grants = ["NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_DROP", "TABLE_LIST", "TABLE_READ_DATA"]
    owner = _principal(served.catalog, f"srv_ddl_{suffix}", [(grant, None) for grant in grants])
    with served.adbc_as(owner) as conn, conn.cursor() as cur:

        def run(sql: str) -> list[tuple[Any, ...]]:
            cur.execute(sql)
            return list(cur.fetchall())  # read: an unread result holds a query slot

        run(f"CREATE SCHEMA {schema}")
        run(f"CREATE TABLE {schema}.MixedCase (id BIGINT)")
        objects = conn.adbc_get_objects(depth="tables", db_schema_filter=schema).read_all().to_pylist()
        [listed] = [s for o in objects for s in o["catalog_db_schemas"] or [] if s["db_schema_name"] == schema]
        assert [t["table_name"] for t in listed["db_schema_tables"]] == ["MixedCase"]
        assert run(f"SELECT * FROM {schema}.MixedCase") == []
        error = served.expect_error(lambda: cur.execute(f"SELECT * FROM {schema}.mixedcase"), dbapi.Error)
        assert "NoSuchTableError" in str(error)
        run(f"DROP TABLE {schema}.MixedCase")
        run(f"DROP SCHEMA {schema}")
    assert (info[500], info[501], info[502]) == (False, True, True)
    assert info[503] == info[505] == 0  # SQL_CASE_SENSITIVITY_UNKNOWN, not LOWERCASE (3)
    lister = _principal(served.catalog, f"srv_lister_{suffix}", [("NAMESPACE_LIST", None), ("TABLE_LIST", None)])
    with served.adbc_as(lister) as conn, conn.cursor() as cur:
        objects = conn.adbc_get_objects(depth="tables", db_schema_filter=served.namespace).read_all().to_pylist()
        [listed] = [
            s for o in objects for s in o["catalog_db_schemas"] or [] if s["db_schema_name"] == served.namespace
        ]
        assert "people" in {t["table_name"] for t in listed["db_schema_tables"]}
        error = served.expect_error(lambda: cur.execute(f"SELECT * FROM {served.namespace}.people"), dbapi.Error)
        assert "PermissionDeniedError" in str(error)
    assert info[506] is False


def test_get_schema_of_get_tables_is_the_schema_its_rows_come_in(served: Served) -> None:
    """Found by review: GetSchema of CommandGetTables answered the schema without ``table_schema`` even with
    ``include_schema``, so a client that reads the schema first saw a column fewer than the rows it then got."""
    client = served.flight_client()
    options = _bearer(served.token("carol"))
    for include_schema in (True, False):
        command = _command(
            sql_pb.CommandGetTables(db_schema_filter_pattern=served.namespace, include_schema=include_schema)
        )
        announced = client.get_schema(command, options).schema
        info = client.get_flight_info(command, options)
        rows = client.do_get(info.endpoints[0].ticket, options).read_all()
        assert announced == info.schema == rows.schema
        assert ("table_schema" in announced.names) is include_schema
        assert "people" in rows.column("table_name").to_pylist()


def test_views_are_listed_as_views(served: Served) -> None:
    """Found by review: GetTables listed a namespace's views (SHOW TABLES holds them) with table_type TABLE, a
    ``table_types=["VIEW"]`` filter found nothing, and GetTableTypes did not name VIEW."""
    suffix = uuid.uuid4().hex[:6]
    schema = f"views_{suffix}"
    grants = ["NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_LIST", "TABLE_READ_DATA", "TABLE_WRITE_DATA"]
    grants += ["VIEW_CREATE", "VIEW_LIST", "VIEW_READ_PROPERTIES"]
    owner = _principal(served.catalog, f"srv_views_{suffix}", [(grant, None) for grant in grants])
    with served.adbc_as(owner) as conn, conn.cursor() as cur:
        for sql in [
            f"CREATE SCHEMA {schema}",
            f"CREATE TABLE {schema}.base (id BIGINT, note VARCHAR)",
            f"INSERT INTO {schema}.base VALUES (1, 'one')",
            f"CREATE VIEW {schema}.ids AS SELECT id FROM {schema}.base",
        ]:
            cur.execute(sql)
            cur.fetchall()  # an unread result holds a query slot

        def listed(**filters: Any) -> dict[str, str]:
            objects = conn.adbc_get_objects(depth="tables", db_schema_filter=schema, **filters).read_all()
            found = [s for o in objects.to_pylist() for s in o["catalog_db_schemas"] or []]
            return {t["table_name"]: t["table_type"] for s in found for t in s["db_schema_tables"]}

        assert listed() == {"base": "TABLE", "ids": "VIEW"}
        assert listed(table_types_filter=["VIEW"]) == {"ids": "VIEW"}
        assert listed(table_types_filter=["TABLE"]) == {"base": "TABLE"}
        assert conn.adbc_get_table_types() == ["TABLE", "VIEW"]
        view_schema = conn.adbc_get_table_schema(
            "ids", catalog_filter=served.catalog.warehouse, db_schema_filter=schema
        )
        assert view_schema.names == ["id"]


def test_adbc_insert_then_read_back(served: Served) -> None:
    with served.adbc("writer") as conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {served.namespace}.sink VALUES (1, 'one'), (2, 'two')")
        cur.execute(f"SELECT id, name FROM {served.namespace}.sink ORDER BY id")
        assert cur.fetchall() == [(1, "one"), (2, "two")]


def test_statement_update_by_do_put_reports_the_row_count(served: Served) -> None:
    client = served.flight_client()
    sql = f"INSERT INTO {served.namespace}.sink SELECT id, name FROM {served.namespace}.people WHERE id > 4"
    writer, reader = client.do_put(
        _command(sql_pb.CommandStatementUpdate(query=sql)), pa.schema([]), _bearer(served.token("writer"))
    )
    writer.done_writing()
    result = reader.read()
    writer.close()
    assert sql_pb.DoPutUpdateResult.FromString(result.to_pybytes()).record_count == 2


def _fresh_table(served: Served, name: str) -> tuple[str, Any]:
    """A new empty (id bigint, name string) table: its qualified name and a function giving (rows, snapshots)."""
    from tests.conftest import pyiceberg_catalog

    catalog = pyiceberg_catalog(served.catalog, served.users["writer"])
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    catalog.create_table((served.namespace, name), schema=schema)

    def state() -> tuple[int, int]:
        table = catalog.load_table((served.namespace, name))
        return table.scan().to_arrow().num_rows, len(table.snapshots())

    return f"{served.namespace}.{name}", state


def _put_update(client: flight.FlightClient, handle: bytes, rows: pa.Table, options: Any) -> int:
    """DoPut of CommandPreparedStatementUpdate with ``rows`` as its stream; the record_count answered."""
    command = _command(sql_pb.CommandPreparedStatementUpdate(prepared_statement_handle=handle))
    writer, reader = client.do_put(command, rows.schema, options)
    if rows.num_rows:
        writer.write_table(rows)
    writer.done_writing()
    result = reader.read()
    writer.close()
    return int(sql_pb.DoPutUpdateResult.FromString(result.to_pybytes()).record_count)


def test_adbc_executemany_writes_the_parameter_rows_it_sends(served: Served) -> None:
    """An update's parameter rows travel in its own DoPut stream (ADBC executemany): those rows are written and
    counted, never the parameters an earlier execution of the same prepared statement bound."""
    table, state = _fresh_table(served, "sent_rows")
    sql = f"INSERT INTO {table} VALUES (?, ?)"
    with served.adbc("writer") as conn, conn.cursor() as cur:
        cur.execute(sql, parameters=(1, "bound-first"))  # binds (1, ...) to the prepared statement, then runs it
        assert cur.fetchall() == [(1,)]  # its result read: its query slot is free before the next call
        cur.executemany(sql, [(2, "sent"), (3, "sent")])  # the same prepared statement
        assert cur.rowcount == 2
        cur.execute(f"SELECT id, name FROM {table} ORDER BY id")
        assert cur.fetchall() == [(1, "bound-first"), (2, "sent"), (3, "sent")]
    assert state() == (3, 2)  # the executemany is one commit


def test_a_prepared_insert_batch_commits_all_its_rows_or_none(served: Served) -> None:
    """One DoPut of CommandPreparedStatementUpdate is one commit: a batch whose last row fails leaves the table as
    it was (rows and snapshots), so the client's error is the whole truth and a retry duplicates nothing."""
    import adbc_driver_flightsql.dbapi as dbapi

    table, state = _fresh_table(served, "all_or_none")
    sql = f"INSERT INTO {table} VALUES (?, ?)"
    with served.adbc("writer") as conn, conn.cursor() as cur:
        cur.executemany(sql, [("10", "p"), ("11", "q")])
        assert state() == (2, 1)
        error = served.expect_error(lambda: cur.executemany(sql, [("12", "r"), ("13", "s"), ("x", "t")]), dbapi.Error)
    assert "Could not convert string 'x'" in str(error)
    assert state() == (2, 1)


def test_a_prepared_insert_batch_with_named_parameters_writes_every_row(served: Served) -> None:
    """A batch for ``INSERT ... VALUES ($², $name)`` (DuckDB names both; ``²`` is a digit to str.isdigit, not to
    int()) is one commit of every row; reading ``$²`` as a number failed the batch with an internal error."""
    table, state = _fresh_table(served, "named_rows")
    client, options = served.flight_client(), _session_options(served.token("writer"), uuid.uuid4().hex)
    sql = f"INSERT INTO {table} VALUES ($\u00b2, $name)"
    handle = bytes(_create_prepared(client, sql, options).prepared_statement_handle)
    rows = pa.table({"name": ["a", "b"], "\u00b2": [1, 2]})
    assert _put_update(client, handle, rows, options) == 2
    assert _query(client, f"SELECT id, name FROM {table} ORDER BY id", options).to_pylist() == [
        {"id": 1, "name": "a"},
        {"id": 2, "name": "b"},
    ]
    assert state() == (2, 1)


def test_a_prepared_insert_batch_with_a_gap_in_its_numbers_writes_every_row(served: Served) -> None:
    """ADBC executemany of ``INSERT ... VALUES ($2, $3)``: two values a row, bound to ``$2`` and ``$3`` (as a
    list DuckDB took the first for ``$1``, which the statement does not use), one commit."""
    table, state = _fresh_table(served, "gap_rows")
    with served.adbc("writer") as conn, conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} VALUES ($2, $3)", [(1, "a"), (2, "b")])
        assert cur.rowcount == 2
        cur.execute(f"SELECT id, name FROM {table} ORDER BY id")
        assert cur.fetchall() == [(1, "a"), (2, "b")]
    assert state() == (2, 1)


def _bind(client: flight.FlightClient, handle: bytes, rows: pa.Table, options: Any) -> None:
    """DoPut of CommandPreparedStatementQuery: binds ``rows`` to the prepared statement."""
    command = _command(sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=handle))
    writer, reader = client.do_put(command, rows.schema, options)
    writer.write_table(rows)
    writer.done_writing()
    reader.read()
    writer.close()


def test_an_update_stream_without_rows_runs_with_the_parameters_bound_before(served: Served) -> None:
    """A client that binds with CommandPreparedStatementQuery and then sends an empty update stream runs with the
    rows it bound, as one commit too (a failing row: nothing written)."""
    table, state = _fresh_table(served, "bound_rows")
    client, options = served.flight_client(), _bearer(served.token("writer"))
    handle = bytes(_create_prepared(client, f"INSERT INTO {table} VALUES ($1, $2)", options).prepared_statement_handle)

    def bind(rows: pa.Table) -> None:
        _bind(client, handle, rows, options)

    bind(pa.table({"a": ["20", "x"], "b": ["u", "v"]}))
    served.expect_error(lambda: _put_update(client, handle, pa.table({}), options), flight.FlightError)
    assert state() == (0, 0)
    bind(pa.table({"a": pa.array([20, 21], pa.int64()), "b": ["u", "v"]}))
    assert _put_update(client, handle, pa.table({}), options) == 2
    assert state() == (2, 1)


def test_parameter_rows_past_the_limit_are_refused_before_anything_runs(served: Served) -> None:
    """DoPut parameter rows are held in memory before a query slot is taken: past [server] max_parameter_bytes
    the call is refused and nothing is written."""
    table, state = _fresh_table(served, "big_params")
    client, options = served.flight_client(), _bearer(served.token("writer"))
    handle = bytes(_create_prepared(client, f"INSERT INTO {table} VALUES ($1, $2)", options).prepared_statement_handle)
    rows = 2 * PARAMETER_BYTES // 1000
    big = pa.table({"a": pa.array(range(rows), pa.int64()), "b": ["x" * 1000] * rows})
    error = served.expect_error(lambda: _put_update(client, handle, big, options), flight.FlightError)
    assert f"max_parameter_bytes ({PARAMETER_BYTES} bytes" in str(error)
    assert state() == (0, 0)
    assert _put_update(client, handle, big.slice(0, 2), options) == 2


# Arrow values Python's types cannot hold: the server turns parameter rows into Python objects to bind them.
UNBINDABLE = {
    "time_with_nanoseconds": pa.array([1], pa.time64("ns")),
    "timestamp_with_nanoseconds": pa.array([1], pa.timestamp("ns")),
    "timestamp_in_an_unknown_zone": pa.array([1], pa.timestamp("us", "Mars/Phobos")),
    "timestamp_past_year_9999": pa.array([2**62], pa.timestamp("us")),
    "date_past_year_9999": pa.array([2**31 - 1], pa.date32()),
    "duration_with_nanoseconds": pa.array([1], pa.duration("ns")),
}


@pytest.mark.parametrize("kind", sorted(UNBINDABLE))
def test_a_parameter_value_python_cannot_hold_is_a_bad_request_naming_its_column(served: Served, kind: str) -> None:
    """Found by review: binding such a value (a DoPut of a raw Flight client) ended as INTERNAL "internal error in
    sqe serve" at the GetFlightInfo or update that converted it. It is the client's bad input: a typed one-line
    error naming the column, and the statement runs again with a value that binds."""
    client, options = served.flight_client(), _bearer(served.token("carol"))
    handle = bytes(_create_prepared(client, "SELECT ? AS x", options).prepared_statement_handle)
    query = _command(sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=handle))
    bad = pa.table({"when": UNBINDABLE[kind]})
    _bind(client, handle, bad, options)
    for call in (lambda: client.get_flight_info(query, options), lambda: _put_update(client, handle, bad, options)):
        error = served.expect_error(call, flight.FlightError)
        assert type(error) is flight.FlightServerError, f"{type(error).__name__}: {error}"
        assert "parameter column 'when'" in str(error) and "cannot be bound" in str(error)
    _bind(client, handle, pa.table({"when": [7]}), options)
    assert _prepared_rows(client, query, options) == [{"x": 7}]


def _prepared_rows(client: flight.FlightClient, query: flight.FlightDescriptor, options: Any) -> list[dict[str, Any]]:
    info = client.get_flight_info(query, options)
    return list(client.do_get(info.endpoints[0].ticket, options).read_all().to_pylist())


def test_parameter_columns_sharing_a_name_each_bind_their_own_value(served: Served) -> None:
    """Found by review: the rows were read as dicts by column name, so columns sharing a name (a positional
    client's) bound one value: two of three values bound where the statement took two, without an error."""
    client, options = served.flight_client(), _bearer(served.token("carol"))
    handle = bytes(_create_prepared(client, "SELECT ? AS a, ? AS b", options).prepared_statement_handle)
    query = _command(sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=handle))
    _bind(client, handle, pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["p", "p"]), options)
    assert _prepared_rows(client, query, options) == [{"a": 1, "b": 2}]
    _bind(client, handle, pa.Table.from_arrays([pa.array([1]), pa.array([2]), pa.array([3])], ["p", "p", "q"]), options)
    error = served.expect_error(lambda: client.get_flight_info(query, options), flight.FlightServerError)
    assert "mismatch" in str(error)


def test_parameter_rows_bound_across_prepared_statements_share_the_limit(served: Served) -> None:
    """Found by review: the limit was per call, so 1,024 prepared statements of one session could each hold
    max_parameter_bytes of bound rows. Rows a user has bound, in any of their sessions, count against one limit."""
    client = served.flight_client()
    options = _session_options(served.token("writer"), f"params-{uuid.uuid4().hex}")
    sql = f"SELECT name FROM {served.namespace}.people WHERE id = $1 AND name <> $2"
    first, second = (bytes(_create_prepared(client, sql, options).prepared_statement_handle) for _ in range(2))
    rows = (PARAMETER_BYTES * 6 // 10) // 1000
    most = pa.table({"a": pa.array(range(rows), pa.int64()), "b": ["x" * 1000] * rows})
    _bind(client, first, most, options)
    _bind(client, first, most, options)  # binding again replaces the statement's own rows: still within the limit
    error = served.expect_error(lambda: _bind(client, second, most, options), flight.FlightError)
    assert f"max_parameter_bytes ({PARAMETER_BYTES} bytes, counting" in str(error)
    _bind(client, second, most.slice(0, 2), options)
    other = _session_options(served.token("writer"), f"params-{uuid.uuid4().hex}")  # the same user's other session
    third = bytes(_create_prepared(client, sql, other).prepared_statement_handle)
    served.expect_error(lambda: _bind(client, third, most, other), flight.FlightError)
    carol = _session_options(served.token("carol"), f"params-{uuid.uuid4().hex}")  # another user: their own limit
    _bind(client, bytes(_create_prepared(client, sql, carol).prepared_statement_handle), most, carol)


# A few bytes on the wire, many values once bound: each decodes past the shared server's max_parameter_bytes.
AMPLIFIED = {
    "null_column": lambda: pa.nulls(PARAMETER_BYTES // 4),  # no buffer at all
    "dictionary": lambda: pa.DictionaryArray.from_arrays(pa.array([0] * 40, pa.int8()), ["x" * 50_000]),
    "run_end_encoded": lambda: pa.RunEndEncodedArray.from_arrays([PARAMETER_BYTES // 4], ["x"]),
    "lists_of_nulls": lambda: pa.array([[None] * 1000] * (PARAMETER_BYTES // 4000), pa.list_(pa.null())),
}


@pytest.mark.parametrize("encoding", sorted(AMPLIFIED))
def test_parameter_rows_count_against_the_limit_as_the_values_they_decode_to(served: Served, encoding: str) -> None:
    """Found by review: the limit counted the rows' Arrow buffers, which some encodings keep tiny: 224 bytes of a
    null-typed column held fifty million rows, each turned into Python values when bound (a dictionary or a run
    repeats one large value as often). Rows now count as what they decode to, at least 8 bytes a value."""
    column = AMPLIFIED[encoding]()
    assert column.nbytes < PARAMETER_BYTES // 10  # what the old count saw
    client, options = served.flight_client(), _bearer(served.token("bob"))
    handle = bytes(_create_prepared(client, "SELECT ? AS x", options).prepared_statement_handle)
    error = served.expect_error(lambda: _bind(client, handle, pa.table({"x": column}), options), flight.FlightError)
    assert f"max_parameter_bytes ({PARAMETER_BYTES} bytes" in str(error)
    _bind(client, handle, pa.table({"x": column.slice(0, 1)}), options)  # one such value binds


def test_a_parameter_column_that_may_repeat_a_value_without_bound_is_refused(served: Served) -> None:
    """A dense union (or a list view) may point any number of rows at one child value: its size is not its
    buffers', so it is refused naming the column."""
    client, options = served.flight_client(), _bearer(served.token("bob"))
    handle = bytes(_create_prepared(client, "SELECT ? AS x", options).prepared_statement_handle)
    dense = pa.UnionArray.from_dense(pa.array([0] * 3, pa.int8()), pa.array([0] * 3, pa.int32()), [pa.array(["x"])])
    error = served.expect_error(lambda: _bind(client, handle, pa.table({"x": dense}), options), flight.FlightError)
    assert "parameter column 'x' of type dense_union" in str(error) and "not supported" in str(error)


def _wait_until_the_server_holds_rows(client: flight.FlightClient, handle: bytes, options: Any) -> None:
    """Until rows of a DoPut still being sent are received (so its handler runs): a bind larger than the whole
    limit is refused either way, "counting" the bytes the user holds only once there are some."""
    too_big = pa.table({"v": ["x" * 1000] * (PARAMETER_BYTES // 1000 + 10)})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        error = _error_of(lambda: _bind(client, handle, too_big, options))
        if "bytes you already hold" in error:
            return
        time.sleep(0.05)
    raise AssertionError("the server never received the DoPut's rows")


def _error_of(call: Any) -> str:
    with pytest.raises(flight.FlightServerError) as err:
        call()
    return str(err.value)


def test_rows_bound_to_a_statement_closed_while_they_arrived_are_not_held_against_the_limit(served: Served) -> None:
    """Found by review: a DoPut binding rows to a statement that ClosePreparedStatement closed while the rows still
    arrived bound them anyway, to the closed statement: the session counted them as held until it closed, so the
    user's max_parameter_bytes shrank for good (each such call a little more)."""
    user = _principal(served.catalog, f"srv_closer_{uuid.uuid4().hex[:6]}", [("NAMESPACE_LIST", None)])
    client = served.flight_client()
    options = _session_options(served.catalog.token(user), f"closer-{uuid.uuid4().hex}")
    first, second = (
        bytes(_create_prepared(client, "SELECT ? AS a, ? AS b", options).prepared_statement_handle) for _ in range(2)
    )
    rows = (PARAMETER_BYTES * 6 // 10) // 1000
    most = pa.table({"a": pa.array(range(rows), pa.int64()), "b": ["x" * 1000] * rows})
    command = _command(sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=first))
    writer, reader = client.do_put(command, most.schema, options)
    writer.write_table(most)
    _wait_until_the_server_holds_rows(client, second, options)
    close = sql_pb.ActionClosePreparedStatementRequest(prepared_statement_handle=first)
    list(client.do_action(flight.Action("ClosePreparedStatement", _command(close).command), options))
    writer.done_writing()  # the server binds only once the stream ends: after the close
    try:
        reader.read()
        writer.close()
        outcome = "bound"
    except flight.FlightServerError as exc:
        outcome = str(exc)
    _bind(client, second, most, options)  # the closed statement's rows hold nothing of the limit
    assert "closed while its parameter rows arrived" in outcome


def test_the_session_cap_never_evicts_a_session_whose_call_is_still_running(served: Served) -> None:
    """Found by review: a user's new client session past the cap closed their least recently used session idle
    for a second, judged by its engines and results only: a session whose DoPut was still receiving its parameter
    rows was closed under it, and the prepared statement it bound was gone when the client executed it."""
    from sqe.server.sessions import MAX_CLIENT_SESSIONS_PER_USER

    user = _principal(
        served.catalog, f"srv_cap_{uuid.uuid4().hex[:6]}", [("NAMESPACE_LIST", None), ("TABLE_READ_DATA", None)]
    )
    token, client = served.catalog.token(user), served.flight_client()
    catalogs = _command(sql_pb.CommandGetCatalogs())
    others = [_session_options(token, f"other-{i}") for i in range(MAX_CLIENT_SESSIONS_PER_USER - 1)]
    binding = _session_options(token, "binding")
    handle = _prepare(client, f"SELECT name FROM {served.namespace}.people WHERE id = $1", binding)
    command = _command(sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=handle))
    rows = pa.table({"id": pa.array([1], pa.int64())})
    writer, reader = client.do_put(command, rows.schema, binding)
    writer.write_table(rows)  # the DoPut is open: its client is still sending
    for options in others:
        client.get_schema(catalogs, options)  # all used after the binding session...
    time.sleep(1.5)  # ...and all idle for a second now, but the binding session's call is running
    client.get_schema(catalogs, _session_options(token, "one-more"))  # past the cap: one session goes
    writer.done_writing()
    reader.read()
    writer.close()
    info = client.get_flight_info(command, binding)
    assert client.do_get(info.endpoints[0].ticket, binding).read_all().column("name").to_pylist() == ["ada"]


def test_adbc_cancel_of_a_long_query(served: Served) -> None:
    with served.adbc("carol") as conn, conn.cursor() as cur:
        sql = f"SELECT a.n FROM {served.namespace}.numbers a, {served.namespace}.numbers b WHERE a.n + b.n = -1"
        done = threading.Event()

        def run() -> None:
            try:
                cur.execute(sql)
                cur.fetchall()
            except Exception as exc:
                served.errors_seen.append(str(exc))
            finally:
                done.set()

        thread = threading.Thread(target=run)
        started = time.monotonic()
        thread.start()
        time.sleep(2)
        cur.adbc_cancel()
        assert done.wait(30), "the cancelled query did not stop"
        assert time.monotonic() - started < 30
    _wait_until_idle(served)


def _wait_until_idle(served: Served, timeout: float = 20) -> None:
    """Until the server reports no running queries (its log line per finished query is not needed)."""
    deadline = time.monotonic() + timeout
    client = served.flight_client()
    while time.monotonic() < deadline:
        try:
            info = client.get_flight_info(_command(sql_pb.CommandGetTableTypes()), _bearer(served.token("carol")))
            client.do_get(info.endpoints[0].ticket, _bearer(served.token("carol"))).read_all()
            # a user with a free slot can start PER_USER_LIMIT queries again: probe by opening them
            return
        except flight.FlightError:
            time.sleep(0.2)


# -------------------------------------------------------------------------------------- pyarrow.flight


def test_pyarrow_flight_client_query_and_cancel_flight_info(served: Served) -> None:
    client = served.flight_client()
    options = _bearer(served.token("alice"))
    sql = f"SELECT id FROM {served.namespace}.people ORDER BY id"
    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), options)
    assert info.schema.names == ["id"]
    table = client.do_get(info.endpoints[0].ticket, options).read_all()
    assert table.column("id").to_pylist() == [1, 3, 6]

    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), options)
    request = cancel_pb.CancelFlightInfoRequest(info=info.serialize())
    [result] = client.do_action(flight.Action("CancelFlightInfo", request.SerializeToString()), options)
    assert cancel_pb.CancelFlightInfoResult.FromString(result.body.to_pybytes()).status == (
        cancel_pb.CANCEL_STATUS_CANCELLED
    )
    served.expect_error(lambda: client.do_get(info.endpoints[0].ticket, options).read_all(), flight.FlightError)


def _cancel_query(client: flight.FlightClient, info: flight.FlightInfo, options: flight.FlightCallOptions) -> int:
    wrapper = any_pb2.Any()
    wrapper.Pack(sql_pb.ActionCancelQueryRequest(info=info.serialize()))
    [result] = client.do_action(flight.Action("CancelQuery", wrapper.SerializeToString()), options)
    answer = sql_pb.ActionCancelQueryResult()
    assert any_pb2.Any.FromString(result.body.to_pybytes()).Unpack(answer)
    return int(answer.result)


def test_the_cancel_query_action_the_sql_info_advertises_cancels(served: Served) -> None:
    """SqlInfo FLIGHT_SQL_SERVER_CANCEL says the CancelQuery action works: older clients send it (Any-packed
    ActionCancelQueryRequest with the query's FlightInfo) rather than CancelFlightInfo."""
    assert _sql_info(served, "carol")[9] is True
    client = served.flight_client()
    options = _session_options(served.token("carol"), uuid.uuid4().hex)
    assert "CancelQuery" in {action.type for action in client.list_actions(options)}
    sql = f"SELECT id FROM {served.namespace}.people"
    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), options)
    result = sql_pb.ActionCancelQueryResult
    assert _cancel_query(client, info, options) == result.CANCEL_RESULT_CANCELLED
    error = served.expect_error(lambda: client.do_get(info.endpoints[0].ticket, options).read_all(), flight.FlightError)
    assert "unknown or already used ticket" in str(error)
    assert _cancel_query(client, info, options) == result.CANCEL_RESULT_NOT_CANCELLABLE
    no_endpoint = flight.FlightInfo(info.schema, info.descriptor, [], -1, -1)
    other_ticket = flight.FlightInfo(info.schema, info.descriptor, [flight.FlightEndpoint(b"\xff", [])], -1, -1)
    wrong_type, empty_info = any_pb2.Any(), any_pb2.Any()
    wrong_type.Pack(sql_pb.CommandStatementQuery(query=sql))
    empty_info.Pack(sql_pb.ActionCancelQueryRequest())
    for body in [b"not a request", b"", wrong_type.SerializeToString(), empty_info.SerializeToString()]:
        error = served.expect_error(
            lambda body=body: list(client.do_action(flight.Action("CancelQuery", body), options)),
            flight.FlightServerError,
        )
        assert "CancelQuery needs the FlightInfo of a query of this server" in str(error)
    for odd in [no_endpoint, other_ticket]:
        error = served.expect_error(lambda odd=odd: _cancel_query(client, odd, options), flight.FlightServerError)
        assert "CancelQuery needs the FlightInfo of a query of this server" in str(error)


def test_a_ticket_of_another_user_is_unknown_to_them(served: Served) -> None:
    client = served.flight_client()
    sql = f"SELECT id FROM {served.namespace}.people"
    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), _bearer(served.token("carol")))
    error = served.expect_error(
        lambda: client.do_get(info.endpoints[0].ticket, _bearer(served.token("alice"))).read_all(), flight.FlightError
    )
    assert "unknown or already used ticket" in str(error)
    # The call is made before the assert: pytest would show its arguments, the token among them.
    rows = client.do_get(info.endpoints[0].ticket, _bearer(served.token("carol"))).read_all().num_rows
    assert rows == 6


def _two_scopes(served: Served) -> tuple[str, str]:
    """Two tokens of ONE principal: every role (reads people), and its list-only role (reads no table)."""
    name = f"srv_dual_{uuid.uuid4().hex[:6]}"
    grants = [("NAMESPACE_LIST", None, None), ("TABLE_READ_DATA", None, None)]
    principal = served.catalog.create_principal(name, role=f"{name}_read", grants=grants)
    narrow = f"{name}_list"
    served.catalog.admin_cli("create-role", narrow)
    served.catalog.admin_cli("assign-role", name, narrow)
    served.catalog.admin_cli("grant", narrow, "NAMESPACE_LIST", "--warehouse", served.catalog.warehouse)
    return served.catalog.token(principal), served.catalog.token(principal, f"PRINCIPAL_ROLE:{narrow}")


def test_a_narrower_token_of_the_same_principal_never_uses_the_wider_tokens_session_state(served: Served) -> None:
    """One principal, two role scopes, one session cookie: what the wider token opened (a prepared statement, a
    result waiting for its DoGet) is unknown to the narrower one, which reads nothing its roles do not grant."""
    wide_token, narrow_token = _two_scopes(served)
    client, cookie = served.flight_client(), uuid.uuid4().hex
    wide, narrow = _session_options(wide_token, cookie), _session_options(narrow_token, cookie)
    sql = f"SELECT id FROM {served.namespace}.people ORDER BY id"
    handle = _create_prepared(client, sql, wide).prepared_statement_handle
    prepared = _command(sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=handle))
    waiting = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), wide)

    error = served.expect_error(
        lambda: client.do_get(waiting.endpoints[0].ticket, narrow).read_all(), flight.FlightError
    )
    assert "unknown or already used ticket" in str(error)
    error = served.expect_error(lambda: client.get_flight_info(prepared, narrow), flight.FlightError)
    assert "unknown prepared statement handle" in str(error)
    statement = _command(sql_pb.CommandStatementQuery(query=sql))
    served.expect_error(lambda: client.get_flight_info(statement, narrow), flight.FlightError)
    request = cancel_pb.CancelFlightInfoRequest(info=waiting.serialize())
    [result] = client.do_action(flight.Action("CancelFlightInfo", request.SerializeToString()), narrow)
    assert cancel_pb.CancelFlightInfoResult.FromString(result.body.to_pybytes()).status == (
        cancel_pb.CANCEL_STATUS_NOT_CANCELLABLE
    )
    cancelled = _cancel_query(client, waiting, narrow)
    assert cancelled == sql_pb.ActionCancelQueryResult.CANCEL_RESULT_NOT_CANCELLABLE

    # the wider token's state is intact, and still its own
    everyone = [1, 2, 3, 4, 5, 6]
    assert client.do_get(waiting.endpoints[0].ticket, wide).read_all().column("id").to_pylist() == everyone
    info = client.get_flight_info(prepared, wide)
    assert client.do_get(info.endpoints[0].ticket, wide).read_all().column("id").to_pylist() == everyone


def test_a_reissued_token_of_the_same_roles_keeps_its_client_session(served: Served) -> None:
    """A token issued again (another iat and exp, the same roles) is the same authority: a client that refreshes
    its token keeps the prepared statements and results it opened under the cookie."""
    client, cookie = served.flight_client(), uuid.uuid4().hex
    first = served.token("carol")
    time.sleep(1.1)  # iat counts whole seconds: the next token differs from the first
    second = served.token("carol")
    assert first != second
    sql = f"SELECT id FROM {served.namespace}.people ORDER BY id"
    handle = _create_prepared(client, sql, _session_options(first, cookie)).prepared_statement_handle
    waiting = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), _session_options(first, cookie))
    refreshed = _session_options(second, cookie)
    assert client.do_get(waiting.endpoints[0].ticket, refreshed).read_all().num_rows == 6
    info = client.get_flight_info(
        _command(sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=handle)), refreshed
    )
    assert client.do_get(info.endpoints[0].ticket, refreshed).read_all().num_rows == 6


def test_sql_errors_are_one_typed_line(served: Served) -> None:
    client = served.flight_client()
    command = _command(sql_pb.CommandStatementQuery(query=f"SELECT * FROM {served.namespace}.nope"))
    error = served.expect_error(
        lambda: client.get_flight_info(command, _bearer(served.token("carol"))), flight.FlightServerError
    )
    assert "NoSuchTableError" in str(error) and "Traceback" not in str(error)
    # A statement type DuckDB's Python API cannot name (reading it raised ValueError: INTERNAL) is a typed refusal.
    command = _command(sql_pb.CommandStatementQuery(query="UPDATE EXTENSIONS"))
    error = served.expect_error(
        lambda: client.get_flight_info(command, _bearer(served.token("carol"))), flight.FlightServerError
    )
    assert "QueryError" in str(error) and "not supported" in str(error)


def test_flight_calls_outside_flight_sql_are_unimplemented_naming_the_call(served: Served) -> None:
    """Found by review: ListFlights and DoExchange (pyarrow's defaults) ended as UNIMPLEMENTED with an empty
    message. They are refused naming the call and what to send instead; without credentials, as unauthenticated."""
    client, options = served.flight_client(), _bearer(served.token("carol"))
    listed = served.expect_error(lambda: list(client.list_flights(options=options)), pa.ArrowNotImplementedError)
    assert "ListFlights is not served by sqe serve" in str(listed)
    descriptor = flight.FlightDescriptor.for_command(b"x")
    exchanged = served.expect_error(
        lambda: client.do_exchange(descriptor, options)[1].read_all(), pa.ArrowNotImplementedError
    )
    assert "DoExchange is not served by sqe serve" in str(exchanged)
    served.expect_error(lambda: list(client.list_flights()), flight.FlightUnauthenticatedError)


# ------------------------------------------------------------------------------------------------ auth


def test_no_token_wrong_token_wrong_basic_secret_are_unauthenticated(served: Served) -> None:
    client = served.flight_client()
    command = _command(sql_pb.CommandGetCatalogs())
    served.expect_error(lambda: client.get_flight_info(command), flight.FlightUnauthenticatedError)
    served.expect_error(
        lambda: client.get_flight_info(command, _bearer("not-a-token")), flight.FlightUnauthenticatedError
    )
    carol = served.users["carol"]
    served.expect_error(
        lambda: client.authenticate_basic_token(carol.client_id, "wrong-secret"), flight.FlightUnauthenticatedError
    )


def test_basic_login_returns_a_bearer_token_that_works(served: Served) -> None:
    client = served.flight_client()
    carol = served.users["carol"]
    header = client.authenticate_basic_token(carol.client_id, carol.client_secret)
    served.catalog.secrets.add(header[1].decode().removeprefix("Bearer "))
    info = client.get_flight_info(_command(sql_pb.CommandGetCatalogs()), CallOptions(headers=[header]))
    table = client.do_get(info.endpoints[0].ticket, CallOptions(headers=[header])).read_all()
    assert table.column("catalog_name").to_pylist() == [served.catalog.warehouse]


def _token_requests(served: Served) -> int:
    return served.catalog.settled_log_text().count("POST /v1/oauth/tokens")  # it logs a request after answering


def test_basic_on_every_call_reuses_its_token_until_the_secret_is_rotated(served: Served) -> None:
    """Found by review: every call with Basic credentials exchanged them at the catalog again (a password hash
    there per call) and minted a new token, so also a new delegated token each second."""
    name = f"srv_basic_{uuid.uuid4().hex[:6]}"
    user = _principal(served.catalog, name, [("NAMESPACE_LIST", None), ("TABLE_READ_DATA", None)])
    client = served.flight_client()
    basic = base64.b64encode(f"{user.client_id}:{user.client_secret}".encode()).decode()
    options = CallOptions(headers=[(b"authorization", f"Basic {basic}".encode())])
    first = client.authenticate_basic_token(user.client_id, user.client_secret)
    served.catalog.secrets.add(first[1].decode().removeprefix("Bearer "))
    before = _token_requests(served)
    time.sleep(1.1)  # a token minted now would differ from the first (issued-at is in seconds)
    for _ in range(3):
        info = client.get_flight_info(_command(sql_pb.CommandGetTableTypes()), options)
        types = client.do_get(info.endpoints[0].ticket, options).read_all().column(0).to_pylist()
        assert types == ["TABLE", "VIEW"]
    same_token = client.authenticate_basic_token(user.client_id, user.client_secret) == first
    assert same_token, "a new token for the same credentials"  # (a token must not reach the test output)
    assert _token_requests(served) == before  # six calls and a login, no exchange
    served.catalog.admin_cli("rotate-secret", name)
    served.expect_error(
        lambda: client.get_flight_info(_command(sql_pb.CommandGetTableTypes()), options),
        flight.FlightUnauthenticatedError,
    )
    served.expect_error(
        lambda: client.get_flight_info(_command(sql_pb.CommandGetTableTypes()), CallOptions(headers=[first])),
        flight.FlightUnauthenticatedError,
    )


def test_adbc_username_password_logs_in_once_then_sends_the_bearer_token(served: Served) -> None:
    """The README's ADBC login: the driver's Handshake exchanges the credentials once; its queries then carry the
    bearer token the server answered with, so none of them is another exchange at the catalog."""
    import adbc_driver_flightsql.dbapi as dbapi

    carol = served.users["carol"]
    login = {"username": carol.client_id, "password": carol.client_secret}
    with dbapi.connect(served.url, db_kwargs=login, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {served.namespace}.people")
        assert cur.fetchall() == [(6,)]
        before = _token_requests(served)
        for _ in range(3):
            cur.execute(f"SELECT count(*) FROM {served.namespace}.people")
            assert cur.fetchall() == [(6,)]
    assert _token_requests(served) == before


def test_a_token_of_another_catalog_is_unauthenticated(served: Served, tmp_path: Path) -> None:
    from tests.conftest import CatalogPrincipal, catalog_variant

    with catalog_variant(tmp_path, served.catalog.moto) as other:
        stranger = other.create_principal("stranger")
        token = other.token(stranger)
        served.catalog.secrets.update({token, stranger.client_secret})
        assert isinstance(stranger, CatalogPrincipal)
    client = served.flight_client()
    served.expect_error(
        lambda: client.get_flight_info(_command(sql_pb.CommandGetCatalogs()), _bearer(token)),
        flight.FlightUnauthenticatedError,
    )


def test_a_revoked_token_is_refused_on_the_next_call(served: Served) -> None:
    catalog = served.catalog
    name = f"srv_temp_{uuid.uuid4().hex[:6]}"
    temp = _principal(catalog, name, [("TABLE_READ_DATA", None)])
    token = catalog.token(temp)
    client = served.flight_client()
    info = client.get_flight_info(_command(sql_pb.CommandGetTableTypes()), _bearer(token))
    types = client.do_get(info.endpoints[0].ticket, _bearer(token)).read_all().column(0).to_pylist()
    assert types == ["TABLE", "VIEW"]
    catalog.admin_cli("rotate-secret", name)
    served.expect_error(
        lambda: client.get_flight_info(_command(sql_pb.CommandGetTableTypes()), _bearer(token)),
        flight.FlightUnauthenticatedError,
    )


# ---------------------------------------------------------------------------------------------- limits


def _held_scan(namespace: str) -> str:
    """A query whose result (2 billion rows, ~50 GB) no test reads to its end: a client that reads one chunk holds it,
    and its slot, open by flow control. A 2M-row scan is not enough: its ~50 MB can fit in the windows gRPC grows on
    a fast loopback connection, and then the server finishes the query while the client still holds the call."""
    numbers = f"{namespace}.numbers"
    return f"SELECT a.n, a.label FROM {numbers} a, (SELECT n FROM {numbers} LIMIT 1000) b"


def test_the_query_past_the_per_user_limit_is_refused_with_a_clear_status(served: Served) -> None:
    client = served.flight_client()
    options = _bearer(served.token("carol"))
    sql = _held_scan(served.namespace)
    held = []
    for _ in range(PER_USER_LIMIT):
        info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), options)
        reader = client.do_get(info.endpoints[0].ticket, options)
        reader.read_chunk()  # streaming, held open by flow control
        held.append(reader)
    error = served.expect_error(
        lambda: client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), options),
        flight.FlightUnavailableError,
    )
    assert "server busy" in str(error) and "max_concurrent_queries_per_user" in str(error)
    # another user still gets a slot
    other = _bearer(served.token("alice"))
    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query="SELECT 1 AS x")), other)
    assert client.do_get(info.endpoints[0].ticket, other).read_all().num_rows == 1
    for reader in held:
        reader.cancel()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # dropped streams free their slots
        try:
            info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query="SELECT 1 AS x")), options)
            client.do_get(info.endpoints[0].ticket, options).read_all()
            break
        except flight.FlightUnavailableError:
            time.sleep(0.2)
    else:
        pytest.fail("dropped streams never released their query slots")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_large_result_streams_in_bounded_memory(served: Served) -> None:
    client = served.flight_client()
    options = _bearer(served.token("carol"))
    numbers = f"{served.namespace}.numbers"
    sql = f"SELECT a.n, a.label, b.label AS label2 FROM {numbers} a, (SELECT label FROM {numbers} LIMIT 12) b"
    before = _rss_bytes(served.proc.pid)
    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), options)
    rows = total_bytes = 0
    peak = before
    for i, chunk in enumerate(client.do_get(info.endpoints[0].ticket, options)):
        rows += chunk.data.num_rows
        total_bytes += chunk.data.nbytes
        if i % 20 == 0:
            peak = max(peak, _rss_bytes(served.proc.pid))
    assert rows == NUMBER_ROWS * 12
    assert total_bytes > 900 * 1024 * 1024
    assert peak - before < total_bytes / 3, f"server RSS grew {(peak - before) >> 20} MiB for {total_bytes >> 20} MiB"


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_against_the_server_prints_csv_and_one_line_errors(served: Served, tmp_path: Path) -> None:
    from tests.conftest import write_sqe_config

    config = write_sqe_config(tmp_path / "alice.toml", served.catalog.url, served.users["alice"], served.catalog.moto)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SQE_"))}
    base = [sys.executable, "-m", "sqe.cli", "--server", served.url, "--config", str(config)]
    sql = f"SELECT id, ssn FROM {served.namespace}.people ORDER BY id"
    done = subprocess.run([*base, "-e", sql, "--format", "csv"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["id,ssn", "1,nnn-nn-3333", "3,nnn-nn-5555", "6,"]
    failed = subprocess.run(
        [*base, "-e", "SELECT * FROM nope.nope"], capture_output=True, text=True, env=env, timeout=120
    )
    assert failed.returncode == 1
    assert failed.stderr.count("\n") == 1 and failed.stderr.startswith("sqe: error: ")
    served.errors_seen.append(failed.stderr)


def test_plaintext_off_loopback_is_refused(served: Served, tmp_path: Path) -> None:
    config = _write_configs(tmp_path, served.catalog, listen="0.0.0.0:0")
    done = subprocess.run(
        [sys.executable, "-m", "sqe.cli", "serve", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "not a loopback address" in done.stderr and done.stderr.count("\n") == 1


def test_basic_header_is_never_logged(served: Served) -> None:
    carol = served.users["carol"]
    raw = base64.b64encode(f"{carol.client_id}:{carol.client_secret}".encode()).decode()
    assert raw not in served.log_text()


# -------------------------------------------------------------------------------- TLS, total limit, timeout

TIMEOUT_SECONDS = 15  # long enough for a test to hold two queries while it sets up a third (new connections)


def _self_signed(workdir: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost / 127.0.0.1 (``cryptography``), and its key."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = workdir / "server.crt", workdir / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


@dataclass
class TlsServed:
    world: Served
    url: str
    cert: bytes

    def client(self) -> flight.FlightClient:
        return flight.FlightClient(self.url, tls_root_certs=self.cert)


@pytest.fixture(scope="module")
def served_tls(served: Served, catalog_reader: CatalogPrincipal) -> Iterator[TlsServed]:
    """``sqe serve`` on TLS with a total limit of 2 (1 per user) and a per-query timeout of ``TIMEOUT_SECONDS``."""
    from tests.helpers.processes import stop_child

    workdir = served.workdir / "tls"
    workdir.mkdir()
    cert, key = _self_signed(workdir)
    config = _write_configs(
        workdir,
        served.catalog,
        tls_cert=str(cert),
        tls_key=str(key),
        max_concurrent_queries=2,
        max_concurrent_queries_per_user=1,
        query_timeout_seconds=TIMEOUT_SECONDS,
        **_reader_settings(catalog_reader),
    )
    proc, port = start_server(workdir, config)
    try:
        yield TlsServed(served, f"grpc+tls://localhost:{port}", cert.read_bytes())
    finally:
        stop_child(proc)
        log = (workdir / "server.log").read_text(errors="replace")
        for secret in served.catalog.secrets:
            assert secret not in log


def _query(client: flight.FlightClient, sql: str, options: flight.FlightCallOptions) -> pa.Table:
    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), options)
    return client.do_get(info.endpoints[0].ticket, options).read_all()


def test_tls_serves_a_client_that_trusts_the_certificate_only(served_tls: TlsServed) -> None:
    world = served_tls.world
    options = _bearer(world.token("alice"))
    table = _query(served_tls.client(), f"SELECT id FROM {world.namespace}.people ORDER BY id", options)
    assert table.column("id").to_pylist() == [1, 3, 6]
    untrusting = flight.FlightClient(served_tls.url)  # the system roots do not know our certificate
    world.expect_error(lambda: _query(untrusting, "SELECT 1 AS x", options), flight.FlightError)
    plaintext = flight.FlightClient(served_tls.url.replace("grpc+tls", "grpc"))
    world.expect_error(lambda: _query(plaintext, "SELECT 1 AS x", options), flight.FlightError)


def test_the_query_past_the_total_limit_is_refused(served_tls: TlsServed) -> None:
    world, client = served_tls.world, served_tls.client()
    sql = _held_scan(world.namespace)
    held = []
    for who in ("alice", "bob"):  # one each: the per-user limit (1) is not what refuses carol
        options = _bearer(world.token(who))
        info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), options)
        reader = client.do_get(info.endpoints[0].ticket, options)
        reader.read_chunk()
        held.append(reader)
    error = world.expect_error(
        lambda: client.get_flight_info(
            _command(sql_pb.CommandStatementQuery(query="SELECT 1 AS x")), _bearer(world.token("carol"))
        ),
        flight.FlightUnavailableError,
    )
    assert "server busy" in str(error) and "max_concurrent_queries = 2" in str(error)
    for reader in held:
        reader.cancel()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            rows = _query(client, "SELECT 1 AS x", _bearer(world.token("carol"))).num_rows
            assert rows == 1
            break
        except flight.FlightUnavailableError:
            time.sleep(0.2)
    else:
        pytest.fail("cancelled streams never released their slots")


def test_a_query_past_its_timeout_ends_with_deadline_exceeded(served_tls: TlsServed) -> None:
    world, client = served_tls.world, served_tls.client()
    numbers = f"{world.namespace}.numbers"
    sql = f"SELECT count(*) FROM {numbers} a, {numbers} b WHERE a.n + b.n = -1"
    started = time.monotonic()
    error = world.expect_error(lambda: _query(client, sql, _bearer(world.token("carol"))), flight.FlightTimedOutError)
    elapsed = time.monotonic() - started
    assert "query_timeout_seconds" in str(error)
    assert TIMEOUT_SECONDS - 1 <= elapsed < TIMEOUT_SECONDS + 20, elapsed


def test_preparing_describing_and_browsing_run_beside_a_held_query_and_take_a_planning_slot(
    served_tls: TlsServed,
) -> None:
    """A client reading a result holds its query slot until the stream ends; it can still prepare its next statement,
    describe one and browse the catalog (ADBC's get_objects while a cursor is open). Those calls plan on an engine
    (DuckDB folds constants, metadata calls list the catalog), so they are bounded by planning slots of their own:
    past max_concurrent_queries_per_user of them at once the next is refused, not run beside them."""
    world, client = served_tls.world, served_tls.client()
    options = _bearer(world.token("carol"))
    people = f"SELECT name FROM {world.namespace}.people"
    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=_held_scan(world.namespace))), options)
    held = client.do_get(info.endpoints[0].ticket, options)
    held.read_chunk()  # carol's one query slot (max_concurrent_queries_per_user = 1), held open by flow control
    created = _create_prepared(client, people, options)
    assert pa.ipc.read_schema(pa.py_buffer(created.dataset_schema)).names == ["name"]
    assert client.get_schema(_command(sql_pb.CommandStatementQuery(query=people)), options).schema.names == ["name"]
    listing = sql_pb.CommandGetTables(db_schema_filter_pattern=world.namespace, table_name_filter_pattern="people")
    tables = client.get_flight_info(_command(listing), options)  # this world's namespace: others have `people` too
    assert client.do_get(tables.endpoints[0].ticket, options).read_all().column("table_name").to_pylist() == ["people"]
    held.cancel()

    slow = "SELECT list_reduce(range(3000000), lambda a, b: a + b) AS total"  # plans for seconds
    outcome: list[BaseException] = []
    polled = threading.Event()  # set once the polls below are over: the slow prepare stops trying

    def prepare_slowly() -> None:
        own = served_tls.client()
        # Again and again until the polls are over: a loaded machine may let the polls win the slot many times, or
        # a prepare may end between two polls.
        while not polled.is_set():
            try:
                _create_prepared(own, slow, options)
            except flight.FlightUnavailableError:  # a poll below held the one planning slot: try again
                time.sleep(0.05)
            except flight.FlightTimedOutError as exc:  # stopped at query_timeout_seconds: allowed
                outcome.append(exc)
            except BaseException as exc:  # checked below: no other failure
                outcome.append(exc)
                return

    planning = threading.Thread(target=prepare_slowly)
    planning.start()
    try:
        deadline = time.monotonic() + 60
        refused = None
        while refused is None and time.monotonic() < deadline:  # until the slow prepare holds the planning slot
            try:
                listed = client.get_flight_info(_command(sql_pb.CommandGetDbSchemas()), options)
                client.do_get(listed.endpoints[0].ticket, options).read_all()
                time.sleep(0.3)
            except flight.FlightUnavailableError as exc:
                refused = exc
        assert refused is not None, ("a second planning call ran beside the first past the per-user limit", outcome)
        assert "server busy" in str(refused) and "1 planning call of this user is running" in str(refused)
        assert "max_concurrent_queries_per_user" in str(refused)
    finally:
        polled.set()
        planning.join()
    assert all(isinstance(exc, flight.FlightTimedOutError) for exc in outcome), outcome  # done, or stopped in time


def test_preparing_and_describing_past_the_query_timeout_end_with_deadline_exceeded(
    served: Served, catalog_reader: CatalogPrincipal, tmp_path: Path
) -> None:
    """Planning alone can run long (DuckDB folds a constant list_reduce over millions of values while it plans):
    CreatePreparedStatement and GetSchema stop at query_timeout_seconds like a query, and the session goes on."""
    from tests.helpers.processes import stop_child

    config = _write_configs(tmp_path, served.catalog, query_timeout_seconds=1, **_reader_settings(catalog_reader))
    proc, port = start_server(tmp_path, config)
    try:
        client = flight.FlightClient(f"grpc://127.0.0.1:{port}")
        options = _bearer(served.token("carol"))
        slow = "SELECT list_reduce(range(3000000), lambda a, b: a + b) AS total"
        started = time.monotonic()
        error = served.expect_error(lambda: _create_prepared(client, slow, options), flight.FlightTimedOutError)
        assert "query_timeout_seconds (1 s)" in str(error) and time.monotonic() - started < 30
        described = _command(sql_pb.CommandStatementQuery(query=slow))
        # pyarrow's server sends every GetSchema error as UNKNOWN: the message names the timeout
        error = served.expect_error(lambda: client.get_schema(described, options), pa.ArrowException)
        assert "QueryTimeoutError" in str(error) and "query_timeout_seconds" in str(error)
        created = _create_prepared(client, "SELECT 1 AS x", options)  # the slot and the session are free again
        assert pa.ipc.read_schema(pa.py_buffer(created.dataset_schema)).names == ["x"]
    finally:
        stop_child(proc)


def test_metadata_results_left_unfetched_are_bounded_per_client_session(served: Served) -> None:
    """A metadata result takes no query slot and waits for its DoGet: past MAX_WAITING_RESULTS unfetched ones in a
    client session the next is refused (UNAVAILABLE, server busy), and reading one makes room again."""
    from sqe.server.sessions import MAX_WAITING_RESULTS

    client = served.flight_client()
    options = _session_options(served.token("carol"), f"unfetched-{uuid.uuid4().hex[:8]}")
    catalogs = _command(sql_pb.CommandGetCatalogs())
    waiting = [client.get_flight_info(catalogs, options) for _ in range(MAX_WAITING_RESULTS)]
    error = served.expect_error(lambda: client.get_flight_info(catalogs, options), flight.FlightUnavailableError)
    assert "server busy" in str(error) and f"at most {MAX_WAITING_RESULTS}" in str(error)
    fetched = client.do_get(waiting[0].endpoints[0].ticket, options).read_all()
    assert fetched.column("catalog_name").to_pylist() == [served.catalog.warehouse]
    assert client.get_flight_info(catalogs, options).endpoints  # one fetched: room for one more


# ------------------------------------------------------------------------------------- prepared schemas


def test_prepared_statements_carry_their_dataset_and_parameter_schemas(served: Served) -> None:
    client = served.flight_client()
    options = _bearer(served.token("alice"))

    def create(sql: str) -> sql_pb.ActionCreatePreparedStatementResult:
        return _create_prepared(client, sql, options)

    with_parameter = create(f"SELECT id, name, ssn FROM {served.namespace}.people WHERE id = ?")
    schema = pa.ipc.read_schema(pa.py_buffer(with_parameter.dataset_schema))
    assert schema.names == ["id", "name", "ssn"]
    assert schema.field("id").type == pa.int64() and schema.field("ssn").type == pa.string()
    plain = create(f"SELECT region, count(*) AS n FROM {served.namespace}.people GROUP BY region")
    assert pa.ipc.read_schema(pa.py_buffer(plain.dataset_schema)).names == ["region", "n"]
    assert pa.ipc.read_schema(pa.py_buffer(plain.parameter_schema)).names == []
    # GetSchema of a statement: the same schema, without running it
    descriptor = _command(sql_pb.CommandStatementQuery(query=f"SELECT name FROM {served.namespace}.people"))
    assert client.get_schema(descriptor, options).schema.names == ["name"]
    with served.adbc("alice") as conn, conn.cursor() as cur:  # ADBC reads the schema before executing
        cur.adbc_prepare(f"SELECT id, ssn FROM {served.namespace}.people WHERE id > ?")
        cur.execute(f"SELECT id, ssn FROM {served.namespace}.people WHERE id > ?", parameters=(2,))
        assert cur.fetchall() == [(3, "nnn-nn-5555"), (6, None)]


def test_a_prepared_statement_with_parameters_describes_them(served: Served) -> None:
    """Its parameter_schema has one nullable field per parameter, in binding order, named as DuckDB numbers or
    names them; DuckDB infers their types only when it executes, so each is null-typed (as DuckDB's own ADBC driver
    reports an unknown parameter), which a Flight SQL client binds any value to."""
    client = served.flight_client()
    options = _bearer(served.token("carol"))
    table = f"{served.namespace}.people"

    def parameters(sql: str) -> pa.Schema:
        created = _create_prepared(client, sql, options)
        return pa.ipc.read_schema(pa.py_buffer(created.parameter_schema))

    unknown = [pa.field("1", pa.null()), pa.field("2", pa.null())]
    assert parameters(f"SELECT id FROM {table} WHERE id = ? AND region = ?") == pa.schema(unknown)
    assert parameters(f"SELECT id FROM {table} WHERE id = $2 OR id = $1") == pa.schema(unknown)
    assert parameters(f"SELECT id FROM {table} WHERE name = $who") == pa.schema([pa.field("who", pa.null())])
    assert all(field.nullable for field in parameters(f"SELECT id FROM {table} WHERE id IN (?, ?)"))
    sql = f"SELECT id, name FROM {table} WHERE id > ? AND region = ? ORDER BY id"
    assert _adbc_prepared(served, sql, (2, "EU")) == (["1", "2"], [(3, "linus"), (6, "tim")])


def _adbc_prepared(served: Served, sql: str, parameters: tuple[Any, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """As carol through ADBC: the parameter names ``sql`` is described with, and its rows for ``parameters``."""
    with served.adbc("carol") as conn, conn.cursor() as cur:
        described = cur.adbc_prepare(sql)
        assert described is not None
        cur.execute(sql, parameters=parameters)
        return described.names, cur.fetchall()


def test_a_parameter_named_by_a_non_decimal_digit_is_described_by_its_name(served: Served) -> None:
    """DuckDB takes ``$²`` as a named parameter; ordering the names must not read it as a number (str.isdigit is
    true for it, int() refuses it), which failed CreatePreparedStatement with an internal error."""
    client = served.flight_client()
    options = _bearer(served.token("carol"))
    created = _create_prepared(client, f"SELECT id FROM {served.namespace}.people WHERE name = $\u00b2", options)
    assert pa.ipc.read_schema(pa.py_buffer(created.parameter_schema)) == pa.schema([pa.field("\u00b2", pa.null())])


def test_named_parameters_bind_as_their_parameter_schema_describes_them(served: Served) -> None:
    """A statement with ``$name`` parameters runs with the values a client binds: by the column names when they
    are the parameters' names, else in the parameter_schema's order (ADBC binds positionally). They were bound as
    a list, which DuckDB refuses for named parameters ("Mixing named and positional parameters")."""
    sql = f"SELECT id, name FROM {served.namespace}.people WHERE region = $region AND id > $low ORDER BY id"
    assert _adbc_prepared(served, sql, (2, "EU")) == (["low", "region"], [(3, "linus"), (6, "tim")])
    client, options = served.flight_client(), _session_options(served.token("carol"), uuid.uuid4().hex)
    handle = bytes(_create_prepared(client, sql, options).prepared_statement_handle)
    _bind(client, handle, pa.table({"region": ["EU"], "low": [2]}), options)  # named, in another order
    query = _command(sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=handle))
    info = client.get_flight_info(query, options)
    assert client.do_get(info.endpoints[0].ticket, options).read_all().column("id").to_pylist() == [3, 6]
    _bind(client, handle, pa.table({"region": ["EU"]}), options)  # one value short: a typed error naming them
    error = served.expect_error(lambda: client.get_flight_info(query, options), flight.FlightServerError)
    assert "takes 2 parameters ($low, $region), 1 value bound" in str(error)


def test_numbered_parameters_with_gaps_are_described_and_bound_as_duckdb_requires(served: Served) -> None:
    """DuckDB (2.0.1) takes values for exactly the numbers a statement uses: ``$2`` alone takes one value (a value
    for ``$1`` too is refused as excess), ``$1`` and ``$3`` take two. They were bound as a list, whose k-th value
    DuckDB binds to ``$k``, so no client could run such a statement, nor get its dataset_schema."""
    table = f"{served.namespace}.people"
    only_second = f"SELECT id, name FROM {table} WHERE id > $2 ORDER BY id"
    assert _adbc_prepared(served, only_second, (4,)) == (["2"], [(5, "alan"), (6, "tim")])
    first_and_third = f"SELECT id, name FROM {table} WHERE id > $1 AND region = $3 ORDER BY id"
    assert _adbc_prepared(served, first_and_third, (2, "EU")) == (["1", "3"], [(3, "linus"), (6, "tim")])
    mixed = f"SELECT id FROM {table} WHERE id > $3 AND region = ? ORDER BY id"  # ``?`` after ``$3`` is ``$4``
    assert _adbc_prepared(served, mixed, (2, "EU")) == (["3", "4"], [(3,), (6,)])
    client, options = served.flight_client(), _session_options(served.token("carol"), uuid.uuid4().hex)
    created = _create_prepared(client, only_second, options)
    assert pa.ipc.read_schema(pa.py_buffer(created.dataset_schema)).names == ["id", "name"]
    handle = bytes(created.prepared_statement_handle)
    _bind(client, handle, pa.table({"a": [1], "b": [2]}), options)  # a value too many: a typed error naming them
    query = _command(sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=handle))
    error = served.expect_error(lambda: client.get_flight_info(query, options), flight.FlightServerError)
    assert "takes 1 parameter ($2), 2 values bound" in str(error)  # found by review: "takes 1 parameters"


def test_a_statement_with_named_parameters_describes_its_result_schema(served: Served) -> None:
    """Its dataset_schema is planned with every parameter NULL, as for ``?``: the names were bound as a list of
    NULLs, which DuckDB refuses for named parameters, so no dataset_schema came back."""
    client, options = served.flight_client(), _bearer(served.token("carol"))
    sql = f"SELECT id, name FROM {served.namespace}.people WHERE region = $region"
    created = _create_prepared(client, sql, options)
    assert pa.ipc.read_schema(pa.py_buffer(created.dataset_schema)).names == ["id", "name"]
    described = client.get_schema(_command(sql_pb.CommandStatementQuery(query=sql)), options).schema
    assert described.names == ["id", "name"]


def test_a_prepared_statement_follows_restrictions_set_after_it_was_prepared(served: Served, tmp_path: Path) -> None:
    """Each execution asks the catalog again as the user: restrictions set after CreatePreparedStatement apply to
    the next CommandPreparedStatementQuery, as to a plain statement (never the raw rows of prepare time)."""
    client = served.flight_client()
    options = _session_options(served.token("carol"), uuid.uuid4().hex)
    sql = f"SELECT id, region, ssn FROM {served.namespace}.people ORDER BY id"
    created = _create_prepared(client, sql, options)
    query = _command(sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=created.prepared_statement_handle))

    def run_prepared() -> list[dict[str, Any]]:
        info = client.get_flight_info(query, options)
        return client.do_get(info.endpoints[0].ticket, options).read_all().to_pylist()

    raw_first = {"id": 1, "region": "EU", "ssn": "111-22-3333"}
    assert run_prepared()[0] == raw_first  # carol reads people unrestricted
    rules = tmp_path / "carol.json"
    rules.write_text(json.dumps(ALICE), encoding="utf-8")
    target = ["--warehouse", served.catalog.warehouse, "--namespace", served.namespace, "--table", "people"]
    served.catalog.admin_cli(
        "set-restrictions", *target, "--principal", served.users["carol"].name, "--file", str(rules)
    )
    try:
        assert run_prepared() == _query(client, sql, options).to_pylist() == ALICE_ROWS
    finally:
        served.catalog.admin_cli("clear-restrictions", *target, "--principal", served.users["carol"].name)
    assert run_prepared()[0] == raw_first


# ------------------------------------------------------------------- concurrency on one client session

RACE_SLOTS = 6


def _session_options(token: str, session_id: str, timeout: float | None = None) -> flight.FlightCallOptions:
    return bearer(token, (b"x-sqe-session", session_id.encode()), timeout=timeout)


def _create_prepared(
    client: flight.FlightClient, sql: str, options: flight.FlightCallOptions
) -> sql_pb.ActionCreatePreparedStatementResult:
    wrapper = any_pb2.Any()
    wrapper.Pack(sql_pb.ActionCreatePreparedStatementRequest(query=sql))
    [result] = client.do_action(flight.Action("CreatePreparedStatement", wrapper.SerializeToString()), options)
    created = sql_pb.ActionCreatePreparedStatementResult()
    assert any_pb2.Any.FromString(result.body.to_pybytes()).Unpack(created)
    return created


def _prepare(client: flight.FlightClient, sql: str, options: flight.FlightCallOptions) -> bytes:
    created = _create_prepared(client, sql, options)
    assert pa.ipc.read_schema(pa.py_buffer(created.dataset_schema)).names == ["name"]
    return bytes(created.prepared_statement_handle)


def _all_slots_free(client: flight.FlightClient, options: flight.FlightCallOptions, slots: int) -> bool:
    """Whether, within a few seconds, ``slots`` queries can be open at once (each read back right)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        held: list[flight.FlightInfo] = []
        try:
            for _ in range(slots):
                held.append(
                    client.get_flight_info(_command(sql_pb.CommandStatementQuery(query="SELECT 1 AS x")), options)
                )
        except flight.FlightUnavailableError:
            pass
        for info in held:
            assert client.do_get(info.endpoints[0].ticket, options).read_all().column("x").to_pylist() == [1]
        if len(held) == slots:
            return True
        time.sleep(0.2)
    return False


def test_racing_calls_on_one_client_session_keep_the_server_up_and_the_answers_right(
    served: Served, catalog_reader: CatalogPrincipal
) -> None:
    """DoGet, DoPut, prepared-statement actions, GetSchema and cancels (mid-stream, before DoGet and before the
    first batch) all at once on ONE client session of a real server: it stays up, every answer is right, and
    abandoned streams give their query slots back.

    The DoGets dropped before their first batch are the crash this guards against: the server kept their call
    context after the call ended and its watchdog asked that freed context whether the client was gone.
    """
    from tests.helpers.processes import stop_child

    workdir = served.workdir / "racing"
    workdir.mkdir()
    settings = {"max_concurrent_queries": 12, "max_concurrent_queries_per_user": RACE_SLOTS}
    config = _write_configs(workdir, served.catalog, **_reader_settings(catalog_reader), **settings)
    proc, port = start_server(workdir, config)
    url = f"grpc://127.0.0.1:{port}"
    session_id = f"race-{uuid.uuid4().hex}"  # every call, on every connection, belongs to this one client session
    options = _session_options(served.token("writer"), session_id)
    people, rounds = f"{served.namespace}.people", 4
    failures: list[str] = []
    inserted: list[int] = []

    def admitted(client: flight.FlightClient, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        deadline = time.monotonic() + 20
        while True:  # the racing clients share RACE_SLOTS slots: "server busy" is the limit working, not a fault
            try:
                return client.get_flight_info(descriptor, options)
            except flight.FlightUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def statement(client: flight.FlightClient, sql: str) -> flight.FlightInfo:
        return admitted(client, _command(sql_pb.CommandStatementQuery(query=sql)))

    def reads(client: flight.FlightClient) -> None:
        info = statement(client, f"SELECT id FROM {people} ORDER BY id")
        assert client.do_get(info.endpoints[0].ticket, options).read_all().column("id").to_pylist() == [
            1,
            2,
            3,
            4,
            5,
            6,
        ]

    def updates(client: flight.FlightClient) -> None:
        sql = f"INSERT INTO {served.namespace}.hammer SELECT id, name FROM {people} WHERE id <= 2"
        writer, reader = client.do_put(_command(sql_pb.CommandStatementUpdate(query=sql)), pa.schema([]), options)
        writer.done_writing()
        count = sql_pb.DoPutUpdateResult.FromString(reader.read().to_pybytes()).record_count
        writer.close()
        assert count == 2
        inserted.append(count)

    def prepared(client: flight.FlightClient, round_: int) -> None:
        handle = _prepare(client, f"SELECT name FROM {people} WHERE id = ?", options)
        command = sql_pb.CommandPreparedStatementQuery(prepared_statement_handle=handle)
        key = round_ % 6 + 1
        writer, reader = client.do_put(_command(command), pa.schema([("id", pa.int64())]), options)
        writer.write_table(pa.table({"id": pa.array([key], pa.int64())}))
        writer.done_writing()
        reader.read()
        writer.close()
        info = admitted(client, _command(command))  # a prepared query takes a slot too
        names = client.do_get(info.endpoints[0].ticket, options).read_all().column("name").to_pylist()
        assert names == [PEOPLE.column("name")[key - 1].as_py()]
        close = sql_pb.ActionClosePreparedStatementRequest(prepared_statement_handle=handle)
        wrapper = any_pb2.Any()
        wrapper.Pack(close)
        list(client.do_action(flight.Action("ClosePreparedStatement", wrapper.SerializeToString()), options))
        descriptor = _command(sql_pb.CommandStatementQuery(query=f"SELECT name FROM {people}"))
        assert client.get_schema(descriptor, options).schema.names == ["name"]

    def cancels(client: flight.FlightClient, round_: int) -> None:
        big = f"SELECT n, label FROM {served.namespace}.numbers"
        mid = client.do_get(statement(client, big).endpoints[0].ticket, options)
        mid.read_chunk()
        mid.cancel()  # mid-stream
        info = statement(client, big)  # cancelled before any DoGet
        request = cancel_pb.CancelFlightInfoRequest(info=info.serialize())
        list(client.do_action(flight.Action("CancelFlightInfo", request.SerializeToString()), options))
        early = statement(client, big)  # dropped before (or right at) its first batch
        short = _session_options(served.token("writer"), session_id, timeout=0.001 * (round_ % 4))
        with contextlib.suppress(flight.FlightError):
            client.do_get(early.endpoints[0].ticket, short if round_ % 4 else options).cancel()
        # a DoGet that never reached the server leaves its query waiting: a client cancels what it dropped
        request = cancel_pb.CancelFlightInfoRequest(info=early.serialize())
        list(client.do_action(flight.Action("CancelFlightInfo", request.SerializeToString()), options))

    def worker(name: str, body: Any) -> None:
        client = flight.FlightClient(url)
        try:
            for round_ in range(rounds):
                body(client, round_)
        except Exception as exc:
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
        finally:
            client.close()

    bodies = {
        "reads": lambda c, _: reads(c),
        "updates": lambda c, _: updates(c),
        "prepared": prepared,
        "cancels": cancels,
        "cancels2": cancels,
    }
    threads = [threading.Thread(target=worker, args=item) for item in bodies.items()]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(240)
        assert not [t for t in threads if t.is_alive()], "a racing client hung"
        time.sleep(1)  # two watchdog sweeps over whatever the abandoned calls left behind
        assert proc.poll() is None, f"sqe serve died:\n{(workdir / 'server.log').read_text()[-3000:]}"
        assert failures == []
        client = flight.FlightClient(url)
        info = statement(client, f"SELECT count(*) AS n FROM {served.namespace}.hammer")
        assert client.do_get(info.endpoints[0].ticket, options).read_all().column("n").to_pylist() == [sum(inserted)]
        assert sum(inserted) == 2 * rounds
        # every abandoned stream gives its slot back: the session can hold all of its slots at once again
        assert _all_slots_free(client, options, RACE_SLOTS), "abandoned streams kept their query slots"
        assert proc.poll() is None
    finally:
        stop_child(proc)
    log = (workdir / "server.log").read_text(encoding="utf-8", errors="replace")
    assert "Fatal Python error" not in log and "Traceback" not in log
    for secret in served.catalog.secrets:
        assert secret not in log


# ------------------------------------------------------------ short-lived tokens: delegation cache, expiry

TOKEN_LIFETIME = 30  # past 80 % of it a call re-exchanges: the window after that must hold one query on a busy machine


@contextlib.contextmanager
def _short_lived_catalog(workdir: Path, moto: Any) -> Iterator[CatalogServer]:
    """Another ``sqe-catalog serve`` on the session's moto whose tokens live ``TOKEN_LIFETIME`` seconds."""
    with _own_catalog(workdir, moto, TOKEN_LIFETIME) as (server, _restart):
        yield server


def _own_catalog(workdir: Path, moto: Any, token_lifetime: int) -> Any:
    """Another ``sqe-catalog serve`` on the session's moto in its own location, and a function restarting it."""
    from tests.conftest import restartable_catalog

    location = {"location": f"s3://{moto.bucket}/short_{uuid.uuid4().hex[:6]}"}
    return restartable_catalog(workdir, moto, location, token_lifetime_seconds=token_lifetime)


def _alice_behind_a_reader(
    catalog: CatalogServer, tmp_path: Path, namespace: str
) -> tuple[CatalogPrincipal, subprocess.Popen[bytes], flight.FlightClient, Path]:
    """``namespace.people`` restricted for alice, and an SQE server that reads it as the trusted reader ``engine``.

    Returns alice, the server process, a Flight client of it and the server's work directory (its log is there).
    """
    from tests.conftest import pyiceberg_catalog

    writer = _principal(
        catalog, "writer", [("NAMESPACE_FULL_METADATA", None), ("TABLE_CREATE", None), ("TABLE_WRITE_DATA", None)]
    )
    alice = _principal(catalog, "alice", [("TABLE_READ_DATA", None)])
    reader = catalog.create_principal("engine", reader=True)
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        writing = pyiceberg_catalog(catalog, writer)
        writing.create_namespace(namespace)
        writing.create_table((namespace, "people"), schema=PEOPLE.schema).append(PEOPLE)
    rules = tmp_path / "alice.json"
    rules.write_text(json.dumps(ALICE), encoding="utf-8")
    target = ["--warehouse", catalog.warehouse, "--namespace", namespace, "--table", "people"]
    catalog.admin_cli("set-restrictions", *target, "--principal", "alice", "--file", str(rules))
    workdir = tmp_path / "server"
    workdir.mkdir()
    proc, port = start_server(workdir, _write_configs(workdir, catalog, **_reader_settings(reader)))
    return alice, proc, flight.FlightClient(f"grpc://127.0.0.1:{port}"), workdir


def _exchanges(log: str, user: str) -> int:
    return sum(1 for line in log.splitlines() if f"delegated token for user:{user} exchanged" in line)


def test_delegated_tokens_are_cached_per_user_re_exchanged_before_expiry_and_expired_users_refused(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    from tests.helpers.processes import stop_child

    with _short_lived_catalog(tmp_path / "catalog", catalog_server.moto) as catalog:
        alice, proc, client, workdir = _alice_behind_a_reader(catalog, tmp_path, "short")
        sql = "SELECT id, region, ssn FROM short.people ORDER BY id"
        log_path = workdir / "server.log"
        try:
            issued = time.monotonic()
            token = catalog.token(alice)
            claims = _claims_of(token)
            assert claims is not None
            for _ in range(3):  # one exchange serves every call of this token
                got = _query(client, sql, _bearer(token)).to_pylist()
                assert got == ALICE_ROWS
            assert _exchanges(log_path.read_text(), "alice") == 1
            # the delegated token lives no longer than alice's; past 80 % of its life the next call re-exchanges
            time.sleep(max(0.0, issued + TOKEN_LIFETIME * 0.88 - time.monotonic()))
            got = _query(client, sql, _bearer(token)).to_pylist()
            assert got == ALICE_ROWS
            assert _exchanges(log_path.read_text(), "alice") == 2
            time.sleep(max(0.0, claims["exp"] + 1 - time.time()))  # the token's own expiry (whole seconds)
            with pytest.raises(flight.FlightUnauthenticatedError) as expired:  # the very next call
                _query(client, sql, _bearer(token))
            assert "Traceback" not in str(expired.value)
            fresh = catalog.token(alice)  # a new token of the same user works again
            got = _query(client, sql, _bearer(fresh)).to_pylist()
            assert got == ALICE_ROWS
        finally:
            stop_child(proc)
        log = log_path.read_text(errors="replace")
        for secret in catalog.secrets:
            assert secret not in log and secret not in str(expired.value)


# ------------------------------------------------------------------------------------- resources (issue 17)


def _threads_and_fds(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    threads = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:"))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def _settled(pid: int, baseline: tuple[int, int], slack: tuple[int, int], timeout: float) -> tuple[int, int]:
    """The server's (threads, fds) once within ``slack`` of ``baseline``, or the last sample at ``timeout``."""
    deadline = time.monotonic() + timeout
    now = _threads_and_fds(pid)
    while time.monotonic() < deadline and (now[0] > baseline[0] + slack[0] or now[1] > baseline[1] + slack[1]):
        time.sleep(0.25)
        now = _threads_and_fds(pid)
    return now


def _alice_connections(served: Served, connections: int, queries: int) -> None:
    """``connections`` ADBC connections one after another, each running ``queries`` queries, each closed."""
    sql = f"SELECT id, ssn FROM {served.namespace}.people ORDER BY id"
    for _ in range(connections):
        conn = served.adbc("alice")
        try:
            for _ in range(queries):
                with conn.cursor() as cur:
                    cur.execute(sql)
                    assert cur.fetch_arrow_table().column("ssn").to_pylist() == ["nnn-nn-3333", "nnn-nn-5555", None]
        finally:
            conn.close()


def test_closed_client_connections_give_back_their_threads_and_descriptors(served_distributed: Served) -> None:
    """A client without cookies is a session per connection: when it disconnects, its engine is closed at once.

    The soak saw ~19 threads and ~10 descriptors (catalog sockets left in CLOSE_WAIT among them) kept per
    connection until ``idle_session_seconds`` (15 min). A first round fills the process's bounded pools (gRPC
    and Arrow executors, their eventfds); after that, more connections must not leave anything behind.
    """
    served = served_distributed
    pid = served.proc.pid
    _alice_connections(served, connections=4, queries=2)
    time.sleep(3.0)  # the watchdog notices closed connections within about a second
    baseline = _threads_and_fds(pid)
    connections, queries = 20, 2
    _alice_connections(served, connections, queries)
    # Threads: slack below one per connection, so a leak of a single thread per connection still fails.
    # Descriptors: the leak fixed here was ~10 per connection (~200 for this round). A residual of about one
    # descriptor per connection is still seen in full CI runs (eventfds, the open soak defect of issue 17), so the
    # bound is 3 per connection: the fixed leak fails it by far, the residual one is tracked by the soak's xfail.
    threads, fds = _settled(pid, baseline, (4, 3 * connections), timeout=15)
    assert threads <= baseline[0] + 4, f"threads {baseline[0]} -> {threads} after {connections} connections"
    assert fds <= baseline[1] + 3 * connections, f"descriptors {baseline[1]} -> {fds} after {connections} connections"


def test_queries_succeed_again_after_the_catalog_restarts_under_a_running_server(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    """The server's reader token, delegated tokens and engine sessions survive a catalog restart (issue 17)."""
    from tests.helpers.processes import stop_child

    with _own_catalog(tmp_path / "catalog", catalog_server.moto, 3600) as (catalog, restart):
        alice, proc, client, workdir = _alice_behind_a_reader(catalog, tmp_path, "restart")
        sql = "SELECT id, region, ssn FROM restart.people ORDER BY id"
        token = catalog.token(alice)
        try:
            got = _query(client, sql, _bearer(token)).to_pylist()
            assert got == ALICE_ROWS
            restart()
            # the very next calls, on the same connection and session, with the token issued before the restart
            for _ in range(3):
                got = _query(client, sql, _bearer(token)).to_pylist()
                assert got == ALICE_ROWS
            got = _query(client, sql, _bearer(catalog.token(alice))).to_pylist()
            assert got == ALICE_ROWS
            # another signing key: tokens of before are refused (fail closed), and the server's cached reader
            # token with them; a user's fresh token works at once, so the server fetched a new reader token
            restart(new_signing_key=True)
            with pytest.raises(flight.FlightUnauthenticatedError):
                _query(client, sql, _bearer(token))
            got = _query(client, sql, _bearer(catalog.token(alice))).to_pylist()
            assert got == ALICE_ROWS
        finally:
            client.close()
            stop_child(proc)
        log = (workdir / "server.log").read_text(errors="replace")
        assert "Traceback" not in log
        for secret in catalog.secrets:
            assert secret not in log


def test_a_statements_own_error_at_prepare_is_told_whatever_its_text_says(served: Served) -> None:
    """Found by review: the server's prepare took any QueryError whose text held "can be prepared" for a statement
    it runs plainly at execution, so a statement whose own error quoted those words (a syntax error at those words) was
    answered with a handle instead of its error. The type (StatementNotPreparableError) decides now."""
    client = served.flight_client()
    options = _bearer(served.token("carol"))
    malformed = f'SELECT id AS a "can be prepared" FROM {served.namespace}.people'
    error = served.expect_error(lambda: _create_prepared(client, malformed, options), flight.FlightError)
    assert str(error).startswith("QueryError: ") and "can be prepared" in str(error), str(error)
    create = _create_prepared(client, "CREATE TABLE t_never AS SELECT 1", options)  # run plainly at execution
    assert create.prepared_statement_handle
