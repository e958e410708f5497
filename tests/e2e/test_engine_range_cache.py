"""The data-range and manifest caches against a real moto server and sqe-catalog, counting real S3 requests.

A repeat query of the same user (a new session: its plan is not in the session's task cache) sends no GET or
HEAD for data files or manifests; another user with their own vended set, or a user the catalog refuses, is
never served from the cache; the byte bound holds; results are the same with the caches on and off; and a
restricted user's repeat query still gets the row filter and masks applied to the cached raw bytes, whose
contents never reach logs or EXPLAIN.

S3 requests are counted from moto's own request log (the server writes one line per request to its stderr).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import sqe.api
from sqe.config import load_config
from sqe.errors import SQEError
from sqe.execution.byte_cache import DATA_RANGES, DEFAULT_DATA_BYTES, DEFAULT_MANIFEST_BYTES, MANIFESTS
from sqe.execution.cache import clear_process_caches, configure_process_caches
from sqe.session import Session
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.e2e.test_engine_footer_cache import MotoLog

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

NAMESPACE = "range_cache"
QUERY = f"SELECT count(*) AS n, sum(id) AS total, max(note) AS top FROM {NAMESPACE}.events WHERE id > 0"
ROWS_PER_FILE = 20_000
# Any GET or HEAD of a data file or a manifest (list); the catalog's own metadata.json reads are not counted.
_FILE_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD) (/\S+\.(?:parquet|avro))\S* HTTP')
PEOPLE = pa.table(
    {
        "id": pa.array([1, 2, 3, 4], pa.int64()),
        "region": pa.array(["EU", "US", "EU", "US"]),
        "ssn": pa.array(["111-22-3333", "222-33-4444", "333-44-5555", "444-55-6666"]),
    }
)
# Field ids: 1 id, 2 region, 3 ssn. EU rows only; ssn replaced with null.
RESTRICTED = {
    "required-row-filter": {"type": "eq", "left": {"type": "reference", "id": 2}, "right": "EU"},
    "required-column-projections": [{"field-id": 3, "action": "replace-with-null"}],
}


def file_requests(log: MotoLog) -> dict[str, int]:
    """GET/HEAD requests of data files and manifests since the log's mark, by kind."""
    found = requests_of_files(log)
    return {
        "data": sum(1 for _, path in found if path.endswith(".parquet")),
        "manifest": sum(1 for _, path in found if path.endswith(".avro")),
    }


def requests_of_files(log: MotoLog) -> list[tuple[str, str]]:
    """(method, path) of every GET/HEAD of a data file or manifest since the log's mark."""
    log.data_requests()  # waits for the server to write its last lines
    with log.path.open("rb") as fh:
        fh.seek(log._offset)
        return _FILE_REQUEST.findall(fh.read().decode("utf-8", "replace"))


@pytest.fixture(autouse=True)
def default_caches() -> Iterator[None]:
    """Each test starts cold with the default bounds (sessions re-bound the process caches)."""
    configure_process_caches(data_bytes=DEFAULT_DATA_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES)
    clear_process_caches()
    yield
    configure_process_caches(data_bytes=DEFAULT_DATA_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES)
    clear_process_caches()


@pytest.fixture(scope="module")
def readers(catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, CatalogPrincipal]:
    """alice and bob may read a two-file table; carol holds no grant at all."""
    owner = catalog_server.admin
    pyiceberg_catalog(catalog_server, owner).create_namespace(NAMESPACE)
    with session_for(tmp_path_factory.mktemp("owner"), catalog_server, owner) as session:
        for start in (1, ROWS_PER_FILE + 1):
            rows = f"SELECT i AS id, 'note-' || i AS note FROM range({start}, {start + ROWS_PER_FILE}) r(i)"
            if start == 1:
                session.sql(f"CREATE TABLE {NAMESPACE}.events AS {rows}")
            else:
                session.sql(f"INSERT INTO {NAMESPACE}.events {rows}")
    grants: list[tuple[str, str | None, str | None]] = [
        ("TABLE_READ_DATA", NAMESPACE, None),
        ("NAMESPACE_READ_PROPERTIES", None, None),
    ]
    principals = {name: catalog_server.principal_with_grants(f"rc_{name}", grants) for name in ("alice", "bob")}
    principals["carol"] = catalog_server.principal_with_grants("rc_carol", [])
    return principals


def session_for(
    workdir: Path,
    server: CatalogServer,
    principal: CatalogPrincipal,
    cache: dict[str, int] | None = None,
    **catalog: Any,
) -> Session:
    path = write_sqe_config(workdir / f"{principal.name}.toml", server.url, principal, server.moto, catalog=catalog)
    overrides = {f"cache.{key}": value for key, value in (cache or {}).items()}
    return sqe.api.connect(load_config(path, env={}, overrides=overrides))


def run(workdir: Path, server: CatalogServer, principal: CatalogPrincipal, **cache: int) -> list[tuple[Any, ...]]:
    with session_for(workdir, server, principal, cache) as session:
        return list(session.sql(QUERY).fetchall())


def test_a_repeat_query_sends_no_data_or_manifest_request(
    catalog_server: CatalogServer, readers: dict[str, CatalogPrincipal], tmp_path: Path
) -> None:
    alice = readers["alice"]
    log = MotoLog(catalog_server.moto.pid)
    uncached = run(tmp_path, catalog_server, alice, data_bytes=0, manifest_bytes=0)
    assert uncached == [(2 * ROWS_PER_FILE, sum(range(1, 2 * ROWS_PER_FILE + 1)), "note-9999")]

    log.mark()
    assert run(tmp_path, catalog_server, alice) == uncached
    cold = requests_of_files(log)
    # Two data files, a manifest list and its manifests. Misses are signed GETs with the manifest's size (data)
    # or of the whole object (metadata): no HEAD at all, and each metadata file is read once.
    assert [method for method, _ in cold] == ["GET"] * len(cold), cold
    manifests = [path for _, path in cold if path.endswith(".avro")]
    assert len(manifests) >= 2 and len(set(manifests)) == len(manifests)
    assert len({path for _, path in cold if path.endswith(".parquet")}) == 2

    log.mark()
    assert run(tmp_path, catalog_server, alice) == uncached  # a new session: planned again, read again
    assert file_requests(log) == {"data": 0, "manifest": 0}
    assert len(DATA_RANGES) > 0 and len(MANIFESTS) >= 2


def test_another_user_or_a_refused_one_is_never_served_from_the_cache(
    catalog_server: CatalogServer, readers: dict[str, CatalogPrincipal], tmp_path: Path
) -> None:
    log = MotoLog(catalog_server.moto.pid)
    log.mark()
    expected = run(tmp_path, catalog_server, readers["alice"])
    cold = file_requests(log)

    data_hits, manifest_hits = DATA_RANGES.stats.hits, MANIFESTS.stats.hits
    log.mark()
    assert run(tmp_path, catalog_server, readers["bob"]) == expected
    assert file_requests(log) == cold  # bob's own vended set: every file read for him, as cold as alice's was
    # bob's reads never hit alice's entries: the hits he got (within his own cold reads) equal hers.
    assert DATA_RANGES.stats.hits - data_hits <= data_hits and MANIFESTS.stats.hits == manifest_hits

    def refused(**cache: int) -> str:
        with pytest.raises(SQEError) as failure:
            run(tmp_path, catalog_server, readers["carol"], **cache)
        return f"{type(failure.value).__name__}: {failure.value}"

    without_cache = refused(data_bytes=0, manifest_bytes=0)
    log.mark()
    hits = DATA_RANGES.stats.hits, MANIFESTS.stats.hits
    assert refused() == without_cache  # the catalog refuses carol: the warm cache changes nothing
    assert (DATA_RANGES.stats.hits, MANIFESTS.stats.hits) == hits and file_requests(log) == {"data": 0, "manifest": 0}


def test_the_byte_bound_holds_and_results_match_with_the_caches_off(
    catalog_server: CatalogServer, readers: dict[str, CatalogPrincipal], tmp_path: Path
) -> None:
    alice = readers["alice"]
    uncached = run(tmp_path, catalog_server, alice, data_bytes=0, manifest_bytes=0)
    bound = 64 << 10  # smaller than the ranges of two files: something must go
    evictions = DATA_RANGES.stats.evictions
    for _ in range(2):
        assert run(tmp_path, catalog_server, alice, data_bytes=bound, manifest_bytes=4096) == uncached
        assert 0 < DATA_RANGES.kept_bytes <= bound and MANIFESTS.kept_bytes <= 4096
    assert DATA_RANGES.stats.evictions > evictions and DATA_RANGES.max_bytes == bound


@pytest.fixture(scope="module")
def restricted(
    catalog_server: CatalogServer, readers: dict[str, CatalogPrincipal], tmp_path_factory: pytest.TempPathFactory
) -> CatalogPrincipal:
    """``people`` in the namespace ``readers`` made, restricted for dan (EU rows, ssn nulled); his sessions read
    through the trusted reader."""
    return restricted_people(catalog_server, NAMESPACE, "rc_dan", tmp_path_factory.mktemp("restrictions"))


def restricted_people(server: CatalogServer, namespace: str, name: str, workdir: Path) -> CatalogPrincipal:
    """``namespace.people`` (PEOPLE) and a principal ``name`` who may read it only as RESTRICTED says."""
    owner = pyiceberg_catalog(server, server.admin)
    owner.create_table((namespace, "people"), schema=PEOPLE.schema).append(PEOPLE)
    principal = server.principal_with_grants(name, [("TABLE_READ_DATA", namespace, None)])
    document = workdir / f"{name}.json"
    document.write_text(json.dumps(RESTRICTED), encoding="utf-8")
    target = ["--warehouse", server.warehouse, "--namespace", namespace, "--table", "people"]
    server.admin_cli("set-restrictions", *target, "--principal", principal.name, "--file", str(document))
    return principal


def test_a_restricted_repeat_query_filters_and_masks_the_cached_bytes_and_shows_none_of_them(
    catalog_server: CatalogServer,
    catalog_reader: CatalogPrincipal,
    restricted: CatalogPrincipal,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sql = f"SELECT id, region, ssn FROM {NAMESPACE}.people ORDER BY id"
    reader = {"reader_client_id": catalog_reader.client_id, "reader_client_secret": catalog_reader.client_secret}
    log = MotoLog(catalog_server.moto.pid)

    def rows(**cache: int) -> list[tuple[Any, ...]]:
        with session_for(tmp_path, catalog_server, restricted, cache, **reader) as session:
            return list(session.sql(sql).fetchall())

    expected = [(1, "EU", None), (3, "EU", None)]
    assert rows(data_bytes=0, manifest_bytes=0) == expected
    caplog.set_level(logging.DEBUG)
    assert rows() == expected
    log.mark()
    with session_for(tmp_path, catalog_server, restricted, None, **reader) as session:
        assert list(session.sql(sql).fetchall()) == expected  # the row filter, then the mask, on cached bytes
        explained = json.dumps(session.explain(sql).to_pylist())
    assert file_requests(log) == {"data": 0, "manifest": 0}
    assert len(DATA_RANGES) > 0  # the raw (unfiltered, unmasked) file bytes are kept, in process memory only
    shown = caplog.text + explained + repr(DATA_RANGES) + repr(MANIFESTS)
    assert not [value for value in PEOPLE.column("ssn").to_pylist() if value in shown]
    assert not [secret for secret in catalog_server.secrets if secret in shown]


def _fragile_table(server: CatalogServer, workdir: Path, name: str) -> list[str]:
    """A one-file table ``range_cache.<name>`` (alice may read it); the keys of its objects in the bucket."""
    with session_for(workdir, server, server.admin) as session:
        session.sql(f"CREATE TABLE {NAMESPACE}.{name} AS SELECT i AS id, 'note-' || i AS note FROM range(1, 50) r(i)")
    location = pyiceberg_catalog(server, server.admin).load_table((NAMESPACE, name)).metadata.location
    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    listed = server.moto.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return [entry["Key"] for entry in listed["Contents"]]


def _failure(workdir: Path, server: CatalogServer, principal: CatalogPrincipal, sql: str, **cache: int) -> str:
    clear_process_caches()
    with session_for(workdir, server, principal, cache) as session, pytest.raises(SQEError) as failure:
        session.sql(sql).fetchall()
    return f"{type(failure.value).__name__}: {failure.value}"


@pytest.mark.parametrize("gone", ["data", "manifest-list"])
def test_a_missing_file_fails_with_the_same_typed_error_with_the_caches_on_and_off(
    catalog_server: CatalogServer, readers: dict[str, CatalogPrincipal], tmp_path: Path, gone: str
) -> None:
    """With the caches on, misses are signed GETs (no pyarrow open); the error a query ends with is the same
    class and the same message up to the store's own wording of the 404."""
    name = f"fragile_{gone.replace('-', '_')}"
    keys = _fragile_table(catalog_server, tmp_path, name)
    victim = next(k for k in keys if (k.endswith(".parquet") if gone == "data" else "/snap-" in k))
    catalog_server.moto.client("s3").delete_object(Bucket=catalog_server.moto.bucket, Key=victim)
    sql = f"SELECT count(*), max(note) FROM {NAMESPACE}.{name}"
    alice = readers["alice"]
    without = _failure(tmp_path, catalog_server, alice, sql, data_bytes=0, manifest_bytes=0)
    with_caches = _failure(tmp_path, catalog_server, alice, sql)
    prefix = "QueryError: reading " if gone == "data" else "QueryError: cannot read the metadata of "
    assert without.startswith(prefix) and with_caches.startswith(prefix), (without, with_caches)
    assert victim.rsplit("/", 1)[-1] in with_caches and "\n" not in with_caches
    assert not [secret for secret in catalog_server.secrets if secret in with_caches]
