"""The credential refresher with a fake clock: when it reloads, what it pushes, when it stops."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from sqe._counters import Counters
from sqe.catalog.base import TableIdent
from sqe.credentials import CredentialSet, usable_until
from sqe.distributed.coordinator.credentials import TableCredentials
from sqe.distributed.coordinator.refresh import (
    CredentialRefresher,
    Holder,
    IncompleteSet,
    RefreshedSets,
    TableLease,
    key_fingerprint,
)
from sqe.errors import PermissionDeniedError

IDENT = TableIdent("wh", ("ns",), "t")
PREFIX = "s3://bucket/wh/ns/t"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Pushes:
    calls: list[tuple[TableIdent, list[Holder], list[CredentialSet]]] = field(default_factory=list)

    def __call__(self, ident: TableIdent, holders: Sequence[Holder], creds: Sequence[CredentialSet]) -> None:
        self.calls.append((ident, list(holders), list(creds)))


class CachingCatalog:
    """Vends ``lifetime``-second keys and, like sqe-catalog and Polaris, reuses one for half its lifetime."""

    def __init__(self, clock: Clock, lifetime: float) -> None:
        self.clock, self.lifetime = clock, lifetime
        self.assume_role_calls = 0
        self.calls = 0
        self._issued: tuple[float, CredentialSet] | None = None

    def credential(self) -> CredentialSet:
        now = self.clock()
        if self._issued is None or now >= self._issued[0] + self.lifetime / 2:
            self.assume_role_calls += 1
            expires = int((now + self.lifetime) * 1000)
            key = CredentialSet(PREFIX, f"AKIA{self.assume_role_calls:04d}", "secret", "token", expires)
            self._issued = (now, key)
        return self._issued[1]

    def reload(self) -> RefreshedSets:
        self.calls += 1
        cred = self.credential()
        return RefreshedSets((cred,), usable_until(cred.expires_at_ms, self.clock()), "credentials-endpoint")


def leased(refresher: CredentialRefresher, catalog: CachingCatalog) -> TableLease:
    cred = catalog.credential()
    until = usable_until(cred.expires_at_ms, catalog.clock())
    return refresher.lease("client:u", IDENT, (cred,), until, catalog.reload)


def run_for(seconds: float, clock: Clock, refresher: CredentialRefresher, step: float = 0.05) -> None:
    end = clock.now + seconds
    while clock.now < end:
        clock.now += step
        refresher.refresh_due()


def test_nothing_is_reloaded_while_no_fragment_reads_the_table() -> None:
    clock, pushes = Clock(), Pushes()
    refresher = CredentialRefresher(pushes, clock=clock, background=False)
    catalog = CachingCatalog(clock, 3600)
    leased(refresher, catalog)
    run_for(7200, clock, refresher, step=60)
    assert catalog.calls == 0 and pushes.calls == []


def test_a_new_set_is_pushed_before_the_usable_point_and_new_tickets_get_it() -> None:
    clock, pushes = Clock(), Pushes()
    refresher = CredentialRefresher(pushes, clock=clock, background=False)
    catalog = CachingCatalog(clock, 3600)
    lease = leased(refresher, catalog)
    first = lease.credentials
    holder = Holder("127.0.0.1:1", "q", "q.1.f0.a1")
    assert refresher.register(lease, holder) == (first, 0)
    usable = lease.usable_until
    assert usable == clock.now + 3600 - 300
    run_for(3600, clock, refresher, step=1)
    [(ident, holders, creds)] = [c for c in pushes.calls if c[2] != list(first)][:1]
    assert ident == IDENT and holders == [holder] and creds[0].access_key_id != first[0].access_key_id
    assert catalog.calls >= 1
    later = Holder("127.0.0.1:2", "q", "q.1.f1.a1")
    sets, generation = refresher.register(lease, later)
    assert generation >= 1 and sets == lease.credentials and sets[0].access_key_id != first[0].access_key_id


def test_one_reload_per_lifetime_for_hour_long_credentials_however_many_fragments() -> None:
    clock, pushes = Clock(), Pushes()
    refresher = CredentialRefresher(pushes, clock=clock, background=False)
    catalog = CachingCatalog(clock, 3600)
    lease = leased(refresher, catalog)
    for n in range(50):  # 50 fragments on 5 workers read the table at the same time
        refresher.register(lease, Holder(f"127.0.0.1:{n % 5}", "q", f"q.1.f{n}.a1"))
    run_for(10 * 3600, clock, refresher, step=5)
    # a refresh every 54 minutes (the usable point is 5 minutes before expiry, the refresh 1 minute before that)
    assert catalog.calls == 36_000 // (3600 - 300 - 60) == 11
    assert catalog.assume_role_calls == catalog.calls + 1  # every reload got a new key: none was wasted
    assert lease.stats.unchanged == 0 and len(pushes.calls) == 11
    assert all(len(holders) == 50 for _, holders, _ in pushes.calls)  # one push reaches every fragment


def test_short_credentials_the_catalog_still_caches_are_not_pushed_again() -> None:
    clock, pushes = Clock(), Pushes()
    refresher = CredentialRefresher(pushes, clock=clock, background=False)
    catalog = CachingCatalog(clock, 5)
    lease = leased(refresher, catalog)
    refresher.register(lease, Holder("w:1", "q", "f"))
    run_for(20, clock, refresher)
    assert lease.stopped is None and lease.stats.unchanged >= 1
    assert len(pushes.calls) == catalog.assume_role_calls - 1  # only genuinely new keys travel
    assert catalog.calls <= 2 * catalog.assume_role_calls


def test_a_refused_reload_stops_refreshing_pushes_nothing_and_logs_no_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, pushes = Clock(), Pushes()
    refresher = CredentialRefresher(pushes, clock=clock, background=False)
    catalog = CachingCatalog(clock, 5)
    lease = leased(refresher, catalog)
    refresher.register(lease, Holder("w:1", "q", "f"))

    def revoked() -> RefreshedSets:
        raise PermissionDeniedError("catalog refused access to credentials of wh.ns.t (403 Forbidden)", 403)

    lease.reloader = revoked
    with caplog.at_level(logging.WARNING):
        run_for(10, clock, refresher)
    assert pushes.calls == [] and lease.stopped is not None and "PermissionDeniedError" in lease.stopped
    assert lease.due_at() is None and lease.stats.reloads == 1  # stopped for good: no retry storm
    assert "nothing pushed" in caplog.text and "secret" not in caplog.text and "token" not in caplog.text


def test_a_reload_without_a_complete_set_pushes_nothing() -> None:
    clock, pushes = Clock(), Pushes()
    refresher = CredentialRefresher(pushes, clock=clock, background=False)
    catalog = CachingCatalog(clock, 5)
    lease = leased(refresher, catalog)
    refresher.register(lease, Holder("w:1", "q", "f"))
    lease.reloader = lambda: RefreshedSets((), None, "load-table", (IncompleteSet(PREFIX, ("expiry",)),))
    run_for(10, clock, refresher)
    assert pushes.calls == [] and lease.stopped is not None and "1 incomplete" in lease.stopped


def test_refreshes_of_one_lease_are_single_flight() -> None:
    clock, pushes = Clock(), Pushes()
    refresher = CredentialRefresher(pushes, clock=clock, background=False)
    catalog = CachingCatalog(clock, 5)
    lease = leased(refresher, catalog)
    refresher.register(lease, Holder("w:1", "q", "f"))
    entered, release = threading.Event(), threading.Event()

    def slow() -> RefreshedSets:
        entered.set()
        release.wait(5)
        return catalog.reload()

    lease.reloader = slow
    first = threading.Thread(target=refresher.refresh_now, args=(lease,))
    first.start()
    assert entered.wait(5)
    others = [threading.Thread(target=refresher.refresh_now, args=(lease,)) for _ in range(5)]
    for thread in others:
        thread.start()
    for thread in others:
        thread.join(5)
    release.set()
    first.join(5)
    assert catalog.calls == 1 and lease.stats.reloads == 1


def test_lease_stats_are_counters_kept_across_refresh_threads_and_name_no_key() -> None:
    clock, pushes = Clock(), Pushes()
    refresher = CredentialRefresher(pushes, clock=clock, background=False)
    catalog = CachingCatalog(clock, 3600)
    lease = leased(refresher, catalog)
    refresher.register(lease, Holder("w:1", "q", "f"))
    catalog_lock = threading.Lock()

    def reload() -> RefreshedSets:
        with catalog_lock:
            clock.now += 1000  # past half the lifetime now and then: some reloads bring a new key
            return catalog.reload()

    lease.reloader = reload
    threads = [threading.Thread(target=lambda: [refresher.refresh_now(lease) for _ in range(50)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert isinstance(lease.stats, Counters)
    counted = lease.stats.snapshot()  # the counters only: no fingerprint, no lock
    assert set(counted) == {"reloads", "pushes", "unchanged"}
    assert counted["reloads"] == catalog.calls and counted["pushes"] == len(pushes.calls)
    assert counted["pushes"] >= 1 and counted["pushes"] + counted["unchanged"] == counted["reloads"]
    assert lease.stats.key_fingerprints == {
        key_fingerprint(f"AKIA{n:04d}") for n in range(1, catalog.assume_role_calls + 1)
    }
    assert not any("AKIA" in shown for shown in (repr(lease.stats), *lease.stats.key_fingerprints))


def test_a_later_query_with_newer_credentials_restarts_a_stopped_lease() -> None:
    clock, pushes = Clock(), Pushes()
    refresher = CredentialRefresher(pushes, clock=clock, background=False)
    catalog = CachingCatalog(clock, 3600)
    lease = leased(refresher, catalog)
    lease.stopped = "PermissionDeniedError: ..."
    clock.now += 2000
    again = leased(refresher, catalog)
    assert again is lease and lease.stopped is None and lease.generation == 1


class RotatingCatalog:
    """Vends a new key, secret and token on every load (generation ``n``: ``AKIAROT000n``, ...)."""

    def __init__(self) -> None:
        self.issued: list[CredentialSet] = []

    def load(self) -> RefreshedSets:
        n = len(self.issued)
        key = CredentialSet(PREFIX, f"AKIAROT{n:04d}", f"rotating-secret-{n:04d}", f"rotating-token-{n:04d}", None)
        self.issued.append(key)
        return RefreshedSets((key,), None, "credentials-endpoint")

    def secrets(self) -> set[str]:
        return {v for c in self.issued for v in (c.access_key_id, c.secret_access_key, c.session_token) if v}


def test_the_keys_scrubbed_from_a_worker_are_those_of_every_recent_generation() -> None:
    """A running fragment holds its ticket's keys and every set pushed to it since. Before, a table's keys to scrub
    were its lease's current set only: a rewrite's worker quoting its ticket after one refresh (a rewrite's ticket
    is not scrubbed separately), a scan's after two, or a refusal quoting an earlier push had them repeated in the
    coordinator's errors and log."""
    refresher = CredentialRefresher(Pushes(), background=False)
    catalog = RotatingCatalog()
    lease = refresher.lease("client:u", IDENT, catalog.load().credentials, None, catalog.load)
    refresher.register(lease, Holder("127.0.0.1:1", "q", "q.f0"))
    refresher.refresh_now(lease)
    refresher.refresh_now(lease)
    assert lease.generation == 2 and len(catalog.issued) == 3
    table = TableCredentials(IDENT, lease, (), None)
    assert catalog.secrets() <= table.secret_values()
    assert catalog.secrets() <= refresher.held_secrets(IDENT)  # what a push's refusal is scrubbed of
    assert refresher.held_secrets(TableIdent("wh", ("ns",), "other")) == frozenset()
