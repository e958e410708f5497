"""``sqe serve`` under client faults (issue 17): results nobody fetches give back their engine, threads and slot.

A GetFlightInfo runs the statement and holds its engine (a DuckDB connection with its threads, scan pools) and a
query slot until the DoGet streams the result. In the soak, a catalog outage between the two calls made the
DoGet fail authentication (the middleware checks the token at the catalog) before any handler ran; the client
then dropped its connection. Each such result kept about ten threads and a slot of the user's concurrency limit
until ``query_timeout_seconds`` (an hour): the server's threads climbed and the user got "server busy".
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow.flight as flight
import pytest

from sqe.server._proto import flight_sql_pb2 as sql_pb
from tests.e2e.test_server import (
    PER_USER_LIMIT,
    Served,
    _bearer,
    _command,
    _reader_settings,
    _settled,
    _threads_and_fds,
    _write_configs,
    start_server,
)
from tests.e2e.test_server import served as _served_world
from tests.helpers.fault_proxy import FaultProxy

served = _served_world  # the world of test_server (catalog, tables, users), built once for this module too

if TYPE_CHECKING:
    import subprocess

    from tests.conftest import CatalogPrincipal, MotoServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

UNFETCHED_SECONDS = 8.0  # well past the setup of the next GetFlightInfo (a new connection, session and engine)


@pytest.fixture(scope="module")
def faulty(served: Served, catalog_reader: CatalogPrincipal) -> Iterator[tuple[Served, subprocess.Popen[bytes]]]:
    """A server of its own with a short ``unfetched_result_seconds`` (the default is a minute)."""
    from tests.helpers.processes import stop_child

    workdir = served.workdir / "faults"
    workdir.mkdir()
    settings = {**_reader_settings(catalog_reader), "unfetched_result_seconds": UNFETCHED_SECONDS}
    proc, port = start_server(workdir, _write_configs(workdir, served.catalog, **settings))
    log_path = workdir / "server.log"
    world = Served(served.catalog, served.namespace, f"grpc://127.0.0.1:{port}", proc, log_path, workdir, served.users)
    try:
        yield world, proc
    finally:
        stop_child(proc)
        log = log_path.read_text(errors="replace")
        assert "Traceback" not in log
        for secret in served.catalog.secrets:
            assert secret not in log


def _sql(world: Served) -> str:
    return f"SELECT id, name FROM {world.namespace}.people ORDER BY id"


def _flight_info_only(world: Served, client: flight.FlightClient) -> flight.FlightInfo:
    """A GetFlightInfo whose result this client never asks for."""
    descriptor = _command(sql_pb.CommandStatementQuery(query=_sql(world)))
    return client.get_flight_info(descriptor, _bearer(world.token("carol")))


def _fetch(world: Served, client: flight.FlightClient) -> list[int]:
    info = _flight_info_only(world, client)
    table = client.do_get(info.endpoints[0].ticket, _bearer(world.token("carol"))).read_all()
    return [int(v) for v in table.column("id").to_pylist()]


def test_results_of_closed_connections_never_fetched_give_back_threads_and_slots(
    faulty: tuple[Served, subprocess.Popen[bytes]],
) -> None:
    world, proc = faulty
    for _ in range(2):  # fill the process's bounded pools (gRPC, Arrow, the first engines) before the baseline
        client = world.flight_client()
        _fetch(world, client)
        client.close()
    time.sleep(3.0)
    baseline = _threads_and_fds(proc.pid)
    rounds = 4 * PER_USER_LIMIT  # more than the user's slots: each one left behind would refuse the next
    started = time.monotonic()
    for _ in range(rounds):
        client = world.flight_client()
        _flight_info_only(world, client)
        client.close()  # the client goes away between GetFlightInfo and DoGet (the soak's Client.reset)
        time.sleep(1.5)  # the watchdog checks closed connections every second
    elapsed = time.monotonic() - started
    assert elapsed < rounds * UNFETCHED_SECONDS, "the connection check, not the fetch timeout, must free them"
    threads, _ = _settled(proc.pid, baseline, (4, 10_000), timeout=15)
    assert threads <= baseline[0] + 4, f"threads {baseline[0]} -> {threads} after {rounds} unfetched results"
    client = world.flight_client()
    try:
        assert _fetch(world, client) == [1, 2, 3, 4, 5, 6]  # the user's slots came back
    finally:
        client.close()


def test_a_result_never_fetched_on_a_live_connection_is_dropped_after_unfetched_result_seconds(
    faulty: tuple[Served, subprocess.Popen[bytes]],
) -> None:
    world, _ = faulty
    client = world.flight_client()
    try:
        infos = [_flight_info_only(world, client) for _ in range(PER_USER_LIMIT)]
        with pytest.raises(flight.FlightUnavailableError, match="server busy"):
            _flight_info_only(world, client)  # both slots are held by the results waiting for their DoGet
        time.sleep(UNFETCHED_SECONDS + 1.5)
        assert _fetch(world, client) == [1, 2, 3, 4, 5, 6]  # dropped: their slots are free again
        with pytest.raises(flight.FlightError, match="UnknownHandleError") as err:
            client.do_get(infos[0].endpoints[0].ticket, _bearer(world.token("carol"))).read_all()
        assert "Traceback" not in str(err.value)
    finally:
        client.close()


def test_a_result_fetched_in_time_still_streams(faulty: tuple[Served, subprocess.Popen[bytes]]) -> None:
    world, _ = faulty
    client = world.flight_client()
    try:
        info = _flight_info_only(world, client)
        time.sleep(UNFETCHED_SECONDS / 3)
        table = client.do_get(info.endpoints[0].ticket, _bearer(world.token("carol"))).read_all()
        assert table.column("id").to_pylist() == [1, 2, 3, 4, 5, 6]
    finally:
        client.close()


@dataclasses.dataclass(frozen=True)
class _Upstream:
    """What the server's configs need of a catalog: here the proxy in front of the real one."""

    url: str
    warehouse: str
    moto: MotoServer


def test_a_doget_refused_while_the_catalog_is_down_leaves_no_result_behind(
    served: Served, catalog_reader: CatalogPrincipal
) -> None:
    """The soak's path: GetFlightInfo plans, the catalog goes down, the DoGet is refused, the client disconnects."""
    from tests.helpers.processes import stop_child

    proxy = FaultProxy(served.catalog.url)
    proxy.start()
    workdir = served.workdir / "catalog-down"
    workdir.mkdir()
    upstream = _Upstream(proxy.url, served.catalog.warehouse, served.catalog.moto)
    settings = {**_reader_settings(catalog_reader), "idle_session_seconds": 3600.0}  # slots come back only by the fix
    proc, port = start_server(workdir, _write_configs(workdir, upstream, **settings))  # type: ignore[arg-type]
    world = dataclasses.replace(served, url=f"grpc://127.0.0.1:{port}", proc=proc, log_path=workdir / "server.log")
    try:
        for _ in range(2 * PER_USER_LIMIT):  # more than the user's slots
            client = world.flight_client()
            info = _flight_info_only(world, client)
            proxy.inject("*", ".*", 503, times=10_000)
            with pytest.raises(flight.FlightUnavailableError, match="CatalogUnavailableError"):
                client.do_get(info.endpoints[0].ticket, _bearer(world.token("carol"))).read_all()
            proxy.reset()
            client.close()
            time.sleep(1.5)  # the watchdog checks closed connections every second
        client = world.flight_client()
        try:
            assert _fetch(world, client) == [1, 2, 3, 4, 5, 6]  # no slot of the user was left behind
        finally:
            client.close()
    finally:
        stop_child(proc)
        proxy.stop()
    log = world.log_text()
    assert "dropped a result whose DoGet did not come" in log
    assert "Traceback" not in log
