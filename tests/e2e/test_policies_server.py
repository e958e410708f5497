"""Tag-based policies end to end through the SQE service: a real ``sqe serve`` in front of a governed catalog.

The world is the one of ``test_policies_e2e`` (reused by import): namespace ``pol_<sfx>`` tagged
``sensitivity=restricted``, columns ``owner``/``phone`` tagged ``pii``, a row-filter policy (auditors: EU rows,
everyone else ``col("owner") == session_user()``) and a conditional mask policy (auditors ``show-last-4``, everyone
else ``replace-with-null``), enabled. alice is in the auditors group, bob is not. Here the Flight SQL server runs
with that world's reader identity, and clients reach it with their own catalog tokens over ADBC and
``pyarrow.flight``; the same user's token, used directly with a copied capability header, is refused 403.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sqe.server._proto import flight_sql_pb2 as sql_pb
from tests.e2e import test_policies_e2e as policies
from tests.e2e.test_server import Served, _bearer, _command, _reader_settings, _write_configs, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# The governed world (module-scoped fixtures), shared by import rather than rebuilt.
world = policies.world
enabled = policies.enabled


@pytest.fixture(scope="module")
def policy_served(enabled: policies.World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``sqe serve`` whose engine exchanges each caller's token through the world's reader principal."""
    from tests.helpers.processes import stop_child

    workdir: Path = tmp_path_factory.mktemp("policies_served")
    reader: dict[str, Any] = dict(_reader_settings(enabled.reader))
    config = _write_configs(workdir, enabled.server, **reader)
    proc, port = start_server(workdir, config)
    served = Served(
        enabled.server,
        enabled.namespace,
        f"grpc://127.0.0.1:{port}",
        proc,
        workdir / "server.log",
        workdir,
        dict(enabled.users),
    )
    try:
        yield served
    finally:
        stop_child(proc)
        log = served.log_text()
        for secret in enabled.server.secrets:
            if secret:
                assert secret not in log, "a secret reached the server log"


def _sql(served: Served, table: str = "orders") -> str:
    return f"SELECT id, owner, region, phone FROM {served.namespace}.{table} ORDER BY id"


def _adbc_rows(served: Served, who: str, table: str = "orders") -> list[dict[str, Any]]:
    with served.adbc(who) as conn, conn.cursor() as cur:
        cur.execute(_sql(served, table))
        return list(cur.fetch_arrow_table().to_pylist())


def _flight_rows(served: Served, who: str, table: str = "orders") -> list[dict[str, Any]]:
    client, options = served.flight_client(), _bearer(served.token(who))
    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=_sql(served, table))), options)
    rows: list[dict[str, Any]] = []
    for endpoint in info.endpoints:
        rows.extend(client.do_get(endpoint.ticket, options).read_all().to_pylist())
    return rows


def _expected_rows(world: policies.World) -> dict[str, list[dict[str, Any]]]:
    alice, bob, last_4 = world.users["alice"].name, world.users["bob"].name, policies._last_4
    return {
        "alice": [
            {"id": 1, "owner": last_4(alice), "region": "EU", "phone": last_4("+44 20 7946 0001")},
            {"id": 2, "owner": last_4(bob), "region": "EU", "phone": last_4("+44 20 7946 0002")},
            {"id": 4, "owner": last_4("carol"), "region": "EU", "phone": last_4("+33 1 0104")},
        ],
        "bob": [
            {"id": 2, "owner": None, "region": "EU", "phone": None},
            {"id": 3, "owner": None, "region": "US", "phone": None},
        ],
    }


def test_through_the_server_each_user_sees_exactly_their_rows_and_masks(
    policy_served: Served, enabled: policies.World
) -> None:
    """The group-conditional mask and the ``session_user()`` filter bind the delegated end user, not the reader."""
    expected = _expected_rows(enabled)
    for who in ("alice", "bob"):
        assert _adbc_rows(policy_served, who) == expected[who], f"{who} over ADBC"
        assert _flight_rows(policy_served, who) == expected[who], f"{who} over pyarrow.flight"
    assert expected["alice"][2]["phone"].endswith("0104") and not expected["alice"][2]["phone"].startswith("+33")


def test_through_the_server_a_nearer_tag_value_lifts_the_filter_but_not_the_masks(policy_served: Served) -> None:
    rows = _adbc_rows(policy_served, "bob", "public_orders")
    assert rows == [
        {"id": 1, "owner": None, "region": "EU", "phone": None},
        {"id": 2, "owner": None, "region": "EU", "phone": None},
        {"id": 3, "owner": None, "region": "US", "phone": None},
        {"id": 4, "owner": None, "region": "EU", "phone": None},
        {"id": 5, "owner": None, "region": "US", "phone": None},
    ]


def test_the_users_own_token_with_the_capability_header_is_refused(
    policy_served: Served, enabled: policies.World
) -> None:
    """What the server reads for bob, bob himself cannot: pyiceberg with his token and a copied header gets 403."""
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import ForbiddenError

    from sqe.vocabulary import ACCESS_DELEGATION_HEADER, CAPABILITIES_HEADER, READ_RESTRICTIONS_V1, VENDED_CREDENTIALS

    headers = {CAPABILITIES_HEADER: READ_RESTRICTIONS_V1, ACCESS_DELEGATION_HEADER: VENDED_CREDENTIALS}
    bypass = RestCatalog(
        f"bypass-{uuid.uuid4().hex[:6]}",
        uri=enabled.server.url,
        warehouse=enabled.server.warehouse,
        credential=enabled.users["bob"].credential,
        scope="PRINCIPAL_ROLE:ALL",
        **{f"header.{name}": value for name, value in headers.items()},
    )
    with pytest.raises(ForbiddenError, match="trusted reader"):
        bypass.load_table((enabled.namespace, "orders"))
    assert _adbc_rows(policy_served, "bob") == _expected_rows(enabled)["bob"], "through the server: his rows"


def test_through_the_server_a_time_travel_value_smuggles_no_statement_in(policy_served: Served) -> None:
    """Found by review: the value of ``AT (VERSION => ...)`` was folded with DuckDB's multi-statement ``execute``,
    so bob ran statements SQE refuses (here a macro) in his engine, at prepare time already."""
    table = f"{policy_served.namespace}.orders"
    with policy_served.adbc("bob") as conn, conn.cursor() as cur:
        cur.execute(f"EXPLAIN SELECT id FROM {table}")
        explained = cur.fetch_arrow_table().to_pylist()
        [snapshot] = [r["value"] for r in explained if r["property"] == "snapshot_id"]
        cur.execute(f"SELECT id FROM {table} AT (VERSION => {snapshot}) ORDER BY id")
        assert cur.fetch_arrow_table().to_pylist() == [{"id": 2}, {"id": 3}], "one value still travels"
        smuggling = (
            f"SELECT id FROM {table} AT (VERSION => {snapshot}; CREATE MACRO smuggled(x) AS x; SELECT {snapshot})"
        )
        with pytest.raises(Exception, match="expected one expression, found several statements"):
            cur.execute(smuggling)
        cur.execute("SELECT count(*) AS n FROM duckdb_functions() WHERE function_name = 'smuggled'")
        assert cur.fetch_arrow_table().to_pylist() == [{"n": 0}]
