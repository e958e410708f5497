"""The short soak (CI, about a minute): ``bench/soak.py``'s own code with fewer queries and a time budget.

The world is the soak's own but for the store (the session's Ceph RGW; 5-second credentials, catalog behind a
fault proxy process, ``sqe serve`` with 2 workers, three users) and the fault schedule is seeded, so a failure
here replays with ``python bench/soak.py --queries 150 --seed 17``. What must hold under the faults: no wrong,
unrestricted or duplicated row, every failure typed, every acknowledged INSERT in the raw files exactly once, and
no growth of the server's file descriptors or threads beyond a small bound once it has settled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.bench_scripts import load_bench_script

if TYPE_CHECKING:
    from sqe_stack import StackInfo

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ceph, pytest.mark.timeout(600)]

# After the settle period the server may hold a few more descriptors and threads than after the warm-up
# (gRPC pollers, a channel per worker restarted); more than this is a leak. Before the FileIO pool (issue 17) the
# server ended ~580 up (~390 eventfds, ~190 sockets to the store: one filesystem per credential set, kept by the
# footer cache); since, it ends at or below its start (52 -> 15, 51 -> 57 seen), the sets of the last queries
# released once expired.
FD_GROWTH_BOUND = 24
# A worker's own descriptors at the end (a killed one is restarted, so there is no start figure): ~10 once its
# last sets expired; 71 and 130 were seen before the pool. Sockets to the store still open at the end: none
# expected (every set has expired by then), a few allowed for a set released a moment late on a loaded machine.
WORKER_FD_BOUND = 40
STORE_SOCKETS_BOUND = 8
# Two thread leaks are fixed: ~2 threads per query (stop 18), and ~10 per result a client never fetched (a
# catalog 503 between GetFlightInfo and DoGet; the long soak went 51 -> 298 threads). Since then the server ends
# below its start (1,000 queries: 51 -> 29); 16 leaves room for gRPC's pollers and fails either leak.
THREAD_GROWTH_BOUND = 16


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, ceph_stack: StackInfo) -> Any:
    """The soak on the session's Ceph RGW (Ceph starts once per test session), with its own catalog and location."""
    soak = load_bench_script("soak")
    config = soak.SoakConfig(queries=150, seed=17, clients_per_user=2, time_budget=110.0, fault_interval=3.0)
    config.dir = tmp_path_factory.mktemp("soak")
    config.running_store = ceph_stack.running_store()
    result = soak.run_soak(config)
    print("\n".join(result.lines()))
    result.server_log = (config.dir / "logs" / "server.log").read_text(encoding="utf-8", errors="replace")
    return result


def test_short_soak_under_faults_is_never_wrong_unrestricted_duplicated_or_untyped(report: Any) -> None:
    assert report.queries >= 60, "the soak ran too few queries to mean anything"
    # Typed failures are allowed (CatalogUnavailableError during faults); enough results must still be checked.
    assert report.ok >= 30, report.failures
    assert report.wrong_rows == 0, report.bad_samples
    assert report.unrestricted_rows == 0, report.bad_samples
    assert report.duplicated_rows == 0, report.bad_samples
    assert report.untyped == []
    assert report.injector_errors == []
    assert {kind for _, kind in report.faults} >= {"kill_worker", "burst_503", "change_restriction"}
    assert all(check == (0, 0, 0) for check in report.final_insert_check.values()), report.final_insert_check
    assert report.by_kind.get("insert", 0) > 0
    for secret in report.secrets_seen:
        assert secret not in report.server_log, "a secret reached the server log"


def test_short_soak_recovers_after_the_catalog_restarts(report: Any) -> None:
    """Queries refused while the catalog is down are typed; once it answers again, every user's query succeeds."""
    assert report.recovery_probe == {who: "ok" for who in ("full", "rowf", "mask")}, report.lines()


def test_short_soak_leaves_no_threads_behind(report: Any) -> None:
    assert report.server_end["Threads"] - report.server_start["Threads"] <= THREAD_GROWTH_BOUND, report.lines()


def test_short_soak_leaves_no_file_descriptors_behind(report: Any) -> None:
    assert report.server_end["fds"] - report.server_start["fds"] <= FD_GROWTH_BOUND, report.lines()
    assert all(end.get("fds", 0) <= WORKER_FD_BOUND for end in report.workers_end.values()), report.lines()


def test_short_soak_keeps_no_connections_to_the_store_once_its_credentials_expired(report: Any) -> None:
    every = [report.server_fds_by_kind, *report.workers_fds_by_kind.values()]
    store = sum(count for kinds in every for kind, count in kinds.items() if kind.endswith("-> store"))
    assert store <= STORE_SOCKETS_BOUND, report.lines()
