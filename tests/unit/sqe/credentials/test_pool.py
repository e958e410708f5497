"""The FileIO pool: one FileIO per exact credential identity, released on expiry or over the cap, and a released
FileIO frees its pyarrow filesystems (and their eventfds) at once, without waiting for the garbage collector."""

from __future__ import annotations

import gc
import pickle
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO

from sqe.credentials.pool import FILESYSTEMS, FileIOPool, PooledFileIO
from sqe.credentials.scope import credential_identity
from tests.helpers.waiting import wait_until

SECRET = "pool-test-secret-access-key-0123456789"
TOKEN = "pool-test-session-token-abcdefghijklmnop"


def _properties(key_id: str) -> dict[str, str]:
    """S3 properties for an endpoint nobody listens on: building a filesystem and an input file sends nothing."""
    return {
        "s3.endpoint": "http://127.0.0.1:1",
        "s3.region": "us-east-1",
        "s3.access-key-id": key_id,
        "s3.secret-access-key": SECRET,
        "s3.session-token": TOKEN,
    }


def _identity(key_id: str) -> str:
    return credential_identity("s3://b/t", "vended", _properties(key_id))


@pytest.fixture()
def no_cyclic_gc() -> Iterator[None]:
    """What is freed here is freed by reference counting alone (a reference cycle would keep it)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_one_file_io_per_identity_and_never_one_for_two_sets() -> None:
    pool = FileIOPool()
    first = pool.file_io(_identity("K1"), _properties("K1"), None)
    assert pool.file_io(_identity("K1"), _properties("K1"), None) is first
    assert pool.file_io(_identity("K2"), _properties("K2"), None) is not first
    assert pool.stats.snapshot() == {"created": 2, "reused": 1, "expired": 0, "evicted": 0}


def test_identity_covers_every_property_and_the_prefix_and_holds_no_secret() -> None:
    base = _identity("K1")
    assert credential_identity("s3://b/other", "vended", _properties("K1")) != base
    assert credential_identity("s3://b/t", "static", _properties("K1")) != base
    assert credential_identity("s3://b/t", "vended", {**_properties("K1"), "s3.session-token": "x"}) != base
    assert credential_identity("s3://b/t", "vended", {**_properties("K1"), "s3.endpoint": "http://e"}) != base
    assert SECRET not in base and TOKEN not in base and "K1" not in base


def test_over_the_cap_the_least_recently_used_goes_and_listeners_hear_of_it() -> None:
    pool = FileIOPool(max_entries=2)
    released: list[str] = []
    pool.add_eviction_listener(released.append)
    pool.file_io(_identity("K1"), _properties("K1"), None)
    pool.file_io(_identity("K2"), _properties("K2"), None)
    pool.file_io(_identity("K1"), _properties("K1"), None)  # K1 is now the most recent
    pool.file_io(_identity("K3"), _properties("K3"), None)
    assert released == [_identity("K2")]
    assert _identity("K1") in pool and _identity("K3") in pool and len(pool) == 2
    assert pool.stats.evicted == 1


def test_an_expired_credential_is_released_on_the_next_use_of_the_pool() -> None:
    pool = FileIOPool(min_hold_seconds=0.1)
    released: list[str] = []
    pool.add_eviction_listener(released.append)
    pool.file_io(_identity("K1"), _properties("K1"), time.time() + 0.3)
    pool.file_io(_identity("K2"), _properties("K2"), None)  # static keys: never expire
    assert pool.sweep() == 0
    time.sleep(0.4)
    pool.file_io(_identity("K3"), _properties("K3"), time.time() + 60)
    assert released == [_identity("K1")] and len(pool) == 2 and pool.stats.expired == 1


def test_an_idle_pool_releases_expired_sets_on_time_and_its_releaser_thread_then_ends() -> None:
    pool = FileIOPool(min_hold_seconds=0.1)
    released: list[str] = []
    pool.add_eviction_listener(released.append)
    pool.file_io(_identity("K1"), _properties("K1"), time.time() + 0.5)
    pool.file_io(_identity("K2"), _properties("K2"), time.time() + 0.2)  # an earlier expiry wakes it early
    # No use of the pool from here on. The releaser empties the pool, then tells its listeners (after its lock).
    wait_until(lambda: len(released) == 2, "both sets released", 5)
    assert released == [_identity("K2"), _identity("K1")] and len(pool) == 0
    wait_until(lambda: not pool.releasing, "the releaser thread ended", 5)


def test_a_set_that_arrives_expired_is_still_held_briefly_so_a_burst_shares_one_file_io() -> None:
    pool = FileIOPool(min_hold_seconds=30)
    past = time.time() - 10
    first = pool.file_io(_identity("K1"), _properties("K1"), past)
    assert all(pool.file_io(_identity("K1"), _properties("K1"), past) is first for _ in range(5))


@pytest.mark.usefixtures("no_cyclic_gc")
def test_released_file_ios_free_their_filesystems_and_eventfds_at_once() -> None:
    """pyiceberg's own PyArrowFileIO keeps its filesystems in a reference cycle; a pooled one does not."""
    plain = PyArrowFileIO(_properties("K0"))
    kept = weakref.ref(plain.new_input("s3://b/t/data/f.parquet")._filesystem)  # type: ignore[attr-defined]
    del plain
    assert kept() is not None  # the premise: only the cyclic collector would free it
    pool = FileIOPool()
    live = FILESYSTEMS.live
    for n in range(20):
        key = f"KEY{n}"
        pool.file_io(_identity(key), _properties(key), None).new_input("s3://b/t/data/f.parquet")
    assert FILESYSTEMS.live == live + 20
    pool.clear()
    assert FILESYSTEMS.live == live


@pytest.mark.usefixtures("no_cyclic_gc")
def test_an_open_input_file_keeps_its_filesystem_until_it_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"payload")
    pool = FileIOPool()
    live = FILESYSTEMS.live
    opened = pool.file_io("local", {}, None).new_input(path.as_uri())
    pool.clear()
    assert FILESYSTEMS.live == live + 1  # a read already under way finishes with the filesystem it has
    with opened.open() as stream:
        assert stream.read() == b"payload"
    del opened, stream
    assert FILESYSTEMS.live == live


def test_a_pooled_file_io_is_never_pickled_and_its_repr_names_no_secret() -> None:
    file_io = PooledFileIO(_properties("K1"))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(file_io)
    assert SECRET not in repr(file_io) and TOKEN not in repr(file_io)


def test_the_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FileIOPool(max_entries=0)
