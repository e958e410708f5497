"""The parallel prefetch of a large data file's column chunks, against the real moto server.

A file read range by range through the range cache is scanned by the engine's own direct reader
(:class:`sqe.execution.local.DirectProjection`) over :func:`sqe.execution.cached_files.caching_filesystem` with a
signed reader addressed at the fault proxy in front of moto (it forwards the client's Host, so signatures verify).
The proxy counts the requests it handles at once and records every Range header; a delay on data GETs makes
requests that are sent together overlap there (nothing here measures time).
"""

from __future__ import annotations

import io
import itertools
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import sqe.api
import sqe.execution.cached_files as cached_files
from sqe.config import load_config
from sqe.errors import DataFileError
from sqe.execution.byte_cache import DEFAULT_DATA_BYTES, DEFAULT_MANIFEST_BYTES
from sqe.execution.cache import clear_process_caches, configure_process_caches
from sqe.execution.cached_files import (
    _PREFETCHES,
    MERGE_HOLE_BYTES,
    _start_prefetch,
    caching_filesystem,
    coalesced_reads,
    kept_whole,
    merged_part_bytes,
    merged_reads,
)
from sqe.execution.decoded_cache import DEFAULT_DECODED_BYTES
from sqe.execution.local import DirectProjection, QueryCancelledError
from sqe.execution.projected_read import PARQUET
from sqe.vocabulary import S3_ENDPOINT
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.e2e.test_engine_range_cache import session_for
from tests.e2e.test_signed_reads import properties, reader
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.waiting import wait_until
from tests.unit.sqe.execution.test_merged_reads import with_data_page_offset
from tests.unit.sqe.execution.test_row_group_rows import restated_counts

if TYPE_CHECKING:
    from tests.conftest import CatalogServer, MotoServer

pytestmark = [pytest.mark.e2e]

ROWS = 400_000
GROUP_ROWS = 100_000  # four row groups
CACHE_BYTES = 32 << 20  # a file over 2 MiB is read range by range (kept_whole: at most 1/16 of the bound)
DATA_GET = r"/prefetch/.*\.parquet"


def _put_file(moto: MotoServer, group_rows: int, name: str) -> tuple[str, int, pa.Table]:
    """A Parquet file of ROWS rows in row groups of ``group_rows`` and four columns, put in moto: its location,
    size and content."""
    table = pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "x": pc.cast(pc.floor(pc.multiply(pc.random(ROWS), 1000)), pa.int64()),
            "y": pc.random(ROWS),
            "tag": pa.array([f"tag-{i % 97:03d}-{i}" for i in range(ROWS)]),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=group_rows)
    key = f"prefetch/{uuid.uuid4().hex}/{name}.parquet"
    moto.client("s3").put_object(Bucket=moto.bucket, Key=key, Body=sink.getvalue())
    return f"s3://{moto.bucket}/{key}", len(sink.getvalue()), table


@pytest.fixture(scope="module")
def stored(moto_server: MotoServer) -> tuple[str, int, pa.Table]:
    """A file of four row groups in moto."""
    return _put_file(moto_server, GROUP_ROWS, "data")


@pytest.fixture()
def proxy(moto_server: MotoServer) -> Iterator[FaultProxy]:
    running = FaultProxy(moto_server.url, keep_host=True)
    running.start()
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def caches() -> Iterator[None]:
    configure_process_caches(data_bytes=CACHE_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES)
    clear_process_caches()
    yield
    configure_process_caches(
        data_bytes=DEFAULT_DATA_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES, decoded_bytes=DEFAULT_DECODED_BYTES
    )
    clear_process_caches()


def fragment_through(
    moto: MotoServer, proxy: FaultProxy, stored: tuple[str, int, pa.Table], scope: str
) -> ds.ParquetFileFragment:
    """The file as the engine opens a range-cached one (its footer read), misses signed GETs at the proxy."""
    location, size, _ = stored
    assert not kept_whole(size)
    path = location.removeprefix("s3://")
    direct = reader(location, properties(moto, **{S3_ENDPOINT: proxy.url}))
    store = pafs.S3FileSystem(endpoint_override=proxy.url, region=moto.region, access_key="unused", secret_key="x")
    upstream = PARQUET.make_fragment(path, filesystem=store, file_size=size)  # never opened: direct reads
    filesystem = caching_filesystem((location, size, scope), path, upstream=upstream, direct=direct)
    fragment = PARQUET.make_fragment(path, filesystem=filesystem, file_size=size)
    fragment.ensure_complete_metadata()
    return fragment


def projection(
    columns: tuple[str, ...], source: pa.Schema, arrow_filter: pc.Expression | None = None
) -> DirectProjection:
    schema = pa.schema([source.field(name) for name in columns])
    filter_columns = ("id",) if arrow_filter is not None else ()
    return DirectProjection(columns, schema, arrow_filter, filter_columns=filter_columns)


def scanned(fragment: ds.ParquetFileFragment, direct: DirectProjection, size: int, *, prefetch: bool) -> pa.Table:
    """The engine's direct scan of the file, with the executor's ``prefetch`` setting (``[cache] prefetch``)."""
    batches = direct.batches(fragment, 8 << 20, file_size=size, prefetch=prefetch)
    return pa.Table.from_batches(list(batches), schema=direct.schema)


def requested_bytes(proxy: FaultProxy) -> list[tuple[int, int]]:
    """(first, last) byte of every ranged request since the proxy's reset."""
    found = []
    for _, header in proxy.ranges:
        first, _, last = header.removeprefix("bytes=").partition("-")
        found.append((int(first), int(last)))
    return found


@pytest.mark.parametrize("decoded", [True, False], ids=["decoded-cache", "scanner"])
def test_a_large_files_column_chunks_are_fetched_once_each_with_the_prefetch_on_or_off(
    moto_server: MotoServer, proxy: FaultProxy, stored: tuple[str, int, pa.Table], decoded: bool
) -> None:
    """Both readers of a range-cached file (through the decoded-column cache, and the plain scanner) give the
    file's rows with the setting on and off, and every byte is fetched once; on, the prefetch's GETs are sent
    together (its four coalesced reads: x and y of each row group)."""
    configure_process_caches(
        data_bytes=CACHE_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES, decoded_bytes=DEFAULT_DECODED_BYTES * decoded
    )
    _, size, table = stored
    results = {}
    for prefetch in (True, False):
        clear_process_caches()
        fragment = fragment_through(moto_server, proxy, stored, f"scope-{prefetch}")
        proxy.reset()
        proxy.inject("GET", DATA_GET, 0, 1000, delay=0.2)  # forwarded, a little late: overlapping GETs meet
        direct = projection(("x", "y"), table.schema)
        results[prefetch] = (
            scanned(fragment, direct, size, prefetch=prefetch),
            proxy.max_in_flight,
            requested_bytes(proxy),
        )
    expected = table.select(["x", "y"])
    on, off = results[True], results[False]
    assert on[0].equals(expected) and off[0].equals(expected)
    assert on[1] >= 3, on[1]
    reads = coalesced_reads(fragment.metadata, [0, 1, 2, 3], {1, 2}, size)
    for _, _, fetched in (on, off):
        covered = sorted(fetched)
        assert sum(last - first + 1 for first, last in covered) == sum(n for _, n in reads)  # nothing twice
        assert all(a[1] < b[0] for a, b in itertools.pairwise(covered))


@pytest.mark.parametrize("decoded", [True, False], ids=["decoded-cache", "scanner"])
def test_with_the_prefetch_off_a_scan_sends_only_its_own_reads_one_at_a_time(
    moto_server: MotoServer,
    proxy: FaultProxy,
    stored: tuple[str, int, pa.Table],
    decoded: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One row group is read (the filter's statistics rule out the others) through one open file, whose reads
    pyarrow sends one after another. With the setting off that stays so: the GETs are exactly pyarrow's
    coalesced reads, never two at once, and no prefetch runs while the scan does. On (small parts, so this
    group's read is cut into several), the same bytes come from GETs sent together."""
    monkeypatch.setattr(cached_files, "PREFETCH_PART_BYTES", 256 << 10)
    configure_process_caches(
        data_bytes=CACHE_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES, decoded_bytes=DEFAULT_DECODED_BYTES * decoded
    )
    _, size, table = stored
    kept = pc.field("id") < GROUP_ROWS - 10
    seen = {}
    for prefetch in (False, True):
        clear_process_caches()
        fragment = fragment_through(moto_server, proxy, stored, f"scope-one-group-{prefetch}")
        proxy.reset()
        proxy.inject("GET", DATA_GET, 0, 1000, delay=0.2)
        direct = projection(("x", "y"), table.schema, kept)
        batches = direct.batches(fragment, 8 << 20, file_size=size, prefetch=prefetch)
        first = next(batches)
        running = _PREFETCHES.running()  # mid-scan
        rows = pa.Table.from_batches([first, *batches], schema=direct.schema)
        assert rows.equals(table.filter(kept).select(["x", "y"]))
        seen[prefetch] = (running, proxy.max_in_flight, sorted(requested_bytes(proxy)))
    assert _PREFETCHES.running() == 0
    reads = coalesced_reads(fragment.metadata, [0], {0, 1, 2}, size)  # id (the filter's), x, y of group 0
    assert seen[False] == (0, 1, [(offset, offset + length - 1) for offset, length in reads])
    running, in_flight, fetched = seen[True]
    assert running == 1 and in_flight >= 2
    assert len(fetched) > len(reads)  # in parts ...
    assert _merged(fetched) == [(offset, offset + length - 1) for offset, length in reads]  # ... of the same bytes


def test_pruned_row_groups_and_unprojected_columns_are_never_fetched(
    moto_server: MotoServer, proxy: FaultProxy, stored: tuple[str, int, pa.Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter whose statistics rule out the last two row groups: the prefetch (small parts, so it runs even
    for these small chunks) reads the first two groups' chunks of x, y and the filter's id only."""
    monkeypatch.setattr(cached_files, "PREFETCH_PART_BYTES", 128 << 10)
    _, size, table = stored
    fragment = fragment_through(moto_server, proxy, stored, "scope-pruned")
    proxy.reset()
    proxy.inject("GET", DATA_GET, 0, 1000, delay=0.2)
    direct = projection(("x", "y"), table.schema, pc.field("id") < 2 * GROUP_ROWS - 10)
    result = scanned(fragment, direct, size, prefetch=True)
    assert result.equals(table.filter(pc.field("id") < 2 * GROUP_ROWS - 10).select(["x", "y"]))
    assert proxy.max_in_flight >= 2
    metadata = fragment.metadata
    allowed = []
    for group in (0, 1):
        for column in (0, 1, 2):  # id, x, y
            chunk = metadata.row_group(group).column(column)
            start = min(chunk.data_page_offset, chunk.dictionary_page_offset or chunk.data_page_offset)
            allowed.append((start, start + chunk.total_compressed_size - 1))
    fetched = requested_bytes(proxy)
    assert fetched
    for first, last in fetched:
        assert any(low <= first and last <= high for low, high in _merged(allowed)), (first, last)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(spans):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(high, merged[-1][1]))
        else:
            merged.append((low, high))
    return merged


@pytest.mark.parametrize("decoded", [True, False], ids=["decoded-cache", "scanner"])
def test_a_failing_prefetch_get_is_the_typed_error_a_failing_read_is(
    moto_server: MotoServer, proxy: FaultProxy, stored: tuple[str, int, pa.Table], decoded: bool
) -> None:
    """A 403 on the data GETs ends the scan with the error the same read ends with when pyarrow asks for it."""
    configure_process_caches(
        data_bytes=CACHE_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES, decoded_bytes=DEFAULT_DECODED_BYTES * decoded
    )
    _, size, table = stored
    errors = {}
    for prefetch in (True, False):
        clear_process_caches()
        proxy.reset()
        fragment = fragment_through(moto_server, proxy, stored, f"scope-refused-{prefetch}")
        proxy.reset()
        proxy.inject("GET", DATA_GET, 403, 1000)
        with pytest.raises(OSError) as raised:
            scanned(fragment, projection(("x", "y"), table.schema), size, prefetch=prefetch)
        errors[prefetch] = raised.value
        assert _PREFETCHES.running() == 0
    assert type(errors[True]) is type(errors[False]) is PermissionError
    assert str(errors[True]) == str(errors[False])
    assert "HTTP 403" in str(errors[True])


def test_a_stopped_prefetch_sends_none_of_its_parts_not_yet_started(
    moto_server: MotoServer, proxy: FaultProxy, stored: tuple[str, int, pa.Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan that ends (its consumer left, its query was cancelled) stops its prefetch: parts already being
    fetched finish, none other is sent."""
    monkeypatch.setattr(cached_files, "PREFETCH_PART_BYTES", 64 << 10)
    fragment = fragment_through(moto_server, proxy, stored, "scope-stopped")
    proxy.reset()
    proxy.inject("GET", DATA_GET, 0, 1000, delay=0.2)
    prefetch = _start_prefetch(fragment, [0, 1, 2, 3], ("x", "y"))
    assert prefetch is not None
    parts = [future for _, _, future in prefetch._parts]
    assert len(parts) > 2 * cached_files.PREFETCH_THREADS
    _PREFETCHES.stop(prefetch)
    wait(parts)
    assert _PREFETCHES.running() == 0
    assert proxy.count("GET", DATA_GET) <= cached_files.PREFETCH_THREADS


def test_prefetches_hold_at_most_half_the_range_cache_in_all(
    moto_server: MotoServer, proxy: FaultProxy, stored: tuple[str, int, pa.Table]
) -> None:
    """With a 6 MiB range cache, the prefetches of a process reserve at most 3 MiB together: a first file's takes
    its reads in file order while they fit, a second one started meanwhile gets what is left (here: nothing);
    the reads left out are fetched when pyarrow asks, and the rows are the file's all the same."""
    bound = 6 << 20
    configure_process_caches(data_bytes=bound, manifest_bytes=DEFAULT_MANIFEST_BYTES)
    _, size, table = stored
    first = fragment_through(moto_server, proxy, stored, "scope-first")
    second = fragment_through(moto_server, proxy, stored, "scope-second")
    reads = coalesced_reads(first.metadata, [0, 1, 2, 3], {1, 2}, size)
    assert sum(n for _, n in reads) > bound // 2
    running = _start_prefetch(first, [0, 1, 2, 3], ("x", "y"))
    assert running is not None
    try:
        assert 0 < running.reserved <= bound // 2
        assert running.reserved == sum(n for _, n in reads[: len(running._reads)])  # a prefix, in file order
        assert _start_prefetch(second, [0, 1, 2, 3], ("x", "y")) is None
    finally:
        _PREFETCHES.stop(running)
    assert scanned(first, projection(("x", "y"), table.schema), size, prefetch=True).equals(table.select(["x", "y"]))
    assert _PREFETCHES.running() == 0


def test_a_sessions_cache_prefetch_setting_reaches_its_scans(
    catalog_server: CatalogServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bogus_aws_env: None
) -> None:
    """``[cache] prefetch`` of a session's config decides its scans': a cold query whose filter keeps one row
    group of a file read range by range sends that group's read as one GET with the setting off (the default,
    as before the setting existed), and in parts sent together with it on. Data GETs go through the proxy
    (``[storage] endpoint``), which forwards the signed Host."""
    monkeypatch.setattr(cached_files, "PREFETCH_PART_BYTES", 256 << 10)
    owner = catalog_server.admin
    namespace = f"prefetch_{uuid.uuid4().hex[:8]}"
    pyiceberg_catalog(catalog_server, owner).create_namespace(namespace)
    with session_for(tmp_path, catalog_server, owner) as writer:
        writer.sql(f"CREATE TABLE {namespace}.big AS SELECT i AS id, random() AS y FROM range(0, {ROWS}) r(i)")
        expected = writer.sql(f"SELECT count(*), sum(id), sum(y) FROM {namespace}.big WHERE id < 1000").fetchall()
    s3 = FaultProxy(catalog_server.moto.url, keep_host=True)
    s3.start()
    seen = {}
    try:
        for prefetch in (None, False, True):  # None: the setting left at its default
            clear_process_caches()
            path = write_sqe_config(
                tmp_path / f"reader-{prefetch}.toml", catalog_server.url, owner, catalog_server.moto,
                storage={"endpoint": s3.url},
            )  # fmt: skip
            overrides: dict[str, Any] = {"cache.data_bytes": CACHE_BYTES}
            if prefetch is not None:
                overrides["cache.prefetch"] = prefetch
            with sqe.api.connect(load_config(path, env={}, overrides=overrides)) as session:
                plan = session.sql(f"SELECT count(*), sum(id), sum(y) FROM {namespace}.big WHERE id < 1000")
                s3.reset()
                s3.inject("GET", r"\.parquet", 0, 1000, delay=0.2)
                assert plan.fetchall() == expected
                seen[prefetch] = (s3.max_in_flight, s3.count("GET", r"\.parquet"))
    finally:
        s3.stop()
    assert seen[None] == seen[False]
    in_flight, gets = seen[False]
    assert gets >= 1 and in_flight == 1, seen
    in_flight, gets = seen[True]
    assert in_flight >= 2 and gets > seen[False][1], seen


@pytest.mark.parametrize("again", [True, False], ids=["prefetch-again", "prefetch-off-again"])
def test_a_repeat_scan_of_a_prefetched_file_is_served_from_the_cache(
    moto_server: MotoServer,
    proxy: FaultProxy,
    stored: tuple[str, int, pa.Table],
    again: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read the prefetch fetched in parts is kept as those parts: a repeat scan of the file (with the setting
    on again, or by a session with it off in the same process) is served from them and sends no GET, as a repeat
    scan does with the setting off."""
    monkeypatch.setattr(cached_files, "PREFETCH_PART_BYTES", 256 << 10)  # so each read is cut into parts
    configure_process_caches(data_bytes=CACHE_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES, decoded_bytes=0)
    _, size, table = stored
    fragment = fragment_through(moto_server, proxy, stored, "scope-repeat")
    direct = projection(("x", "y"), table.schema)
    proxy.reset()
    assert scanned(fragment, direct, size, prefetch=True).equals(table.select(["x", "y"]))
    assert len(requested_bytes(proxy)) > len(coalesced_reads(fragment.metadata, [0, 1, 2, 3], {1, 2}, size))
    proxy.reset()
    assert scanned(fragment, direct, size, prefetch=again).equals(table.select(["x", "y"]))
    assert proxy.count("GET", DATA_GET) == 0, requested_bytes(proxy)


def _part_gets(proxy: FaultProxy, part_bytes: int) -> int:
    """The ranged GETs of at most ``part_bytes`` the proxy has seen (pyarrow's own reads here are larger)."""
    return sum(1 for first, last in requested_bytes(proxy) if last - first + 1 <= part_bytes)


def test_a_cancelled_querys_prefetch_sends_no_more_parts(
    catalog_server: CatalogServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bogus_aws_env: None
) -> None:
    """A query interrupted while its prefetch is under way: the scan's reader thread may still wait inside
    pyarrow for a read, but the prefetch ends with the scan, so at most the parts already being sent (and the few
    a pool thread takes before it sees the stop) reach the store after the cancel; its reservation goes, and the
    process is left with no prefetch, no scan thread and no more descriptors than before."""
    part = 128 << 10
    monkeypatch.setattr(cached_files, "PREFETCH_PART_BYTES", part)
    owner = catalog_server.admin
    namespace = f"prefetch_{uuid.uuid4().hex[:8]}"
    pyiceberg_catalog(catalog_server, owner).create_namespace(namespace)
    with session_for(tmp_path, catalog_server, owner) as writer:
        writer.sql(
            f"CREATE TABLE {namespace}.big AS SELECT i AS id, random() AS y, 'tag-' || i AS t"
            " FROM range(0, 3000000) r(i)"
        )
    s3 = FaultProxy(catalog_server.moto.url, keep_host=True)
    s3.start()
    path = write_sqe_config(
        tmp_path / "reader.toml", catalog_server.url, owner, catalog_server.moto, storage={"endpoint": s3.url}
    )
    overrides = {"cache.data_bytes": CACHE_BYTES, "cache.decoded_bytes": 0, "cache.prefetch": True}
    try:
        with sqe.api.connect(load_config(path, env={}, overrides=overrides)) as session:
            session.sql(f"SELECT count(*) FROM {namespace}.big").fetchall()  # planning's reads out of the way
            started = 2 * cached_files.PREFETCH_THREADS
            descriptors = []
            for _ in range(3):
                clear_process_caches()
                s3.reset()
                s3.inject("GET", r"\.parquet", 0, 10_000, delay=0.3)

                def interrupt_once_under_way() -> None:
                    wait_until(lambda: _part_gets(s3, part) >= started, "the prefetch never got under way", timeout=60)
                    session.interrupt()

                watcher = threading.Thread(target=interrupt_once_under_way)
                watcher.start()
                with pytest.raises(QueryCancelledError):
                    session.sql(f"SELECT sum(y), max(t) FROM {namespace}.big").fetchall()
                watcher.join()
                at_cancel = _part_gets(s3, part)
                wait_until(
                    lambda: not any(t.name.startswith("sqe-scan-") for t in threading.enumerate()), "scans", timeout=60
                )
                wait_until(lambda: _PREFETCHES.running() == 0, "a prefetch still registered", timeout=60)
                after = _part_gets(s3, part) - at_cancel
                assert after <= 2 * cached_files.PREFETCH_THREADS, (at_cancel, after)
                assert _PREFETCHES._reserved == 0
                descriptors.append(len(list(Path("/proc/self/fd").iterdir())))
            # Pooled keep-alive connections may grow to the GETs ever in flight at once; a cancel leaks none.
            assert descriptors[-1] <= descriptors[0] + cached_files.PREFETCH_THREADS, descriptors
    finally:
        s3.stop()


# ------------------------------------------------------------------------------- merged reads of small row groups

MANY_GROUP_ROWS = 20_000  # twenty row groups, each column chunk far smaller than the merge hole


@pytest.fixture(scope="module")
def many_groups(moto_server: MotoServer) -> tuple[str, int, pa.Table]:
    """A file of twenty small row groups (the same four columns) in moto."""
    return _put_file(moto_server, MANY_GROUP_ROWS, "many")


def _content(moto: MotoServer, location: str) -> bytes:
    key = location.removeprefix(f"s3://{moto.bucket}/")
    body: bytes = moto.client("s3").get_object(Bucket=moto.bucket, Key=key)["Body"].read()
    return body


def _plan(
    fragment: ds.ParquetFileFragment, columns: tuple[str, ...], size: int, *, eager: bool = False
) -> tuple[list[Any], list[Any]]:
    """pyarrow's reads of these columns of every row group, and the merged reads (offset, length, joined) the
    scan fetches instead."""
    groups = list(range(fragment.metadata.num_row_groups))
    leaves = {fragment.physical_schema.get_field_index(name) for name in columns}
    reads = coalesced_reads(fragment.metadata, groups, leaves, size)
    return reads, merged_reads(fragment.metadata, groups, leaves, size, merged_part_bytes(), eager=eager)


def _inside(reads: list[tuple[int, int]], merged: tuple[int, int, int]) -> list[tuple[int, int]]:
    offset, length, _ = merged
    return [(o, n) for o, n in reads if offset <= o and o + n <= offset + length]


@pytest.mark.parametrize("prefetch", [False, True], ids=["prefetch-off", "prefetch-on"])
@pytest.mark.parametrize("columns", [("x", "y"), ("id", "x", "y", "tag")], ids=["agg", "select-all"])
@pytest.mark.parametrize("decoded", [True, False], ids=["decoded-cache", "scanner"])
def test_reads_of_small_row_groups_close_together_are_fetched_as_one_get_each(
    moto_server: MotoServer,
    proxy: FaultProxy,
    many_groups: tuple[str, int, pa.Table],
    decoded: bool,
    columns: tuple[str, ...],
    prefetch: bool,
) -> None:
    """pyarrow reads each row group's chunks on its own: twenty reads, so twenty GETs. Reads less than the merge
    hole apart are fetched as one GET of at most a merged part (the gaps' bytes too), each exactly once (the
    scanner's readers of one merged read, reading groups in parallel, wait for the one GET), with the prefetch off
    (as reads ask) and on (all at once); the rows are the file's and no GET reaches past the file."""
    configure_process_caches(
        data_bytes=CACHE_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES, decoded_bytes=DEFAULT_DECODED_BYTES * decoded
    )
    _, size, table = many_groups
    fragment = fragment_through(moto_server, proxy, many_groups, f"scope-merged-{decoded}-{len(columns)}-{prefetch}")
    reads, merged = _plan(fragment, columns, size, eager=prefetch)
    assert len(reads) == fragment.metadata.num_row_groups == ROWS // MANY_GROUP_ROWS
    assert 1 < len(merged) <= len(reads) // 3 and all(joined > 1 for _, _, joined in merged)
    proxy.reset()
    proxy.inject("GET", DATA_GET, 0, 1000, delay=0.2)  # forwarded, a little late: readers of one part meet
    result = scanned(fragment, projection(columns, table.schema), size, prefetch=prefetch)
    assert result.equals(table.select(list(columns)))
    fetched = sorted(requested_bytes(proxy))
    assert fetched == [(offset, offset + length - 1) for offset, length, _ in merged]
    assert all(0 <= first <= last < size for first, last in fetched)
    if prefetch:
        assert proxy.max_in_flight >= 2
    assert _PREFETCHES.running() == 0


def test_readers_of_one_merged_read_send_one_get_for_it(
    moto_server: MotoServer, proxy: FaultProxy, many_groups: tuple[str, int, pa.Table]
) -> None:
    """Two reads of one merged read, the second asked while the first one's GET is still at the store: the
    second waits for that GET instead of sending its own, and both are served from it. The other merged reads,
    which nothing read, are never fetched (nothing is fetched ahead with the prefetch off)."""
    location, size, _ = many_groups
    content = _content(moto_server, location)
    fragment = fragment_through(moto_server, proxy, many_groups, "scope-merged-concurrent")
    reads, merged = _plan(fragment, ("x", "y"), size)
    first, second = _inside(reads, merged[0])[:2]
    prefetch = _start_prefetch(fragment, list(range(fragment.metadata.num_row_groups)), ("x", "y"), eager=False)
    assert prefetch is not None and prefetch.reserved == 0
    proxy.reset()
    proxy.inject("GET", DATA_GET, 0, 1000, delay=1.0)
    served: dict[int, bytes] = {}

    def read(offset: int, length: int) -> None:
        with fragment.filesystem.open_input_file(fragment.path) as file:
            served[offset] = file.read_at(length, offset)

    try:
        readers = [threading.Thread(target=read, args=first)]
        readers[0].start()
        wait_until(lambda: proxy.in_flight == 1, "the first read's GET never reached the store", timeout=60)
        readers.append(threading.Thread(target=read, args=second))
        readers[1].start()
        for reader_thread in readers:
            reader_thread.join()
    finally:
        _PREFETCHES.stop(prefetch)
    assert served == {offset: content[offset : offset + length] for offset, length in (first, second)}
    offset, length, _ = merged[0]
    assert requested_bytes(proxy) == [(offset, offset + length - 1)]
    assert proxy.max_in_flight == 1


def test_reads_further_apart_than_the_merge_hole_are_each_their_own_get(
    moto_server: MotoServer, proxy: FaultProxy, stored: tuple[str, int, pa.Table]
) -> None:
    """The four-group file's x and y chunks of one group are more than the merge hole from the next group's: with
    the prefetch off a scan sends exactly pyarrow's reads, and no prefetch is registered for it."""
    _, size, table = stored
    fragment = fragment_through(moto_server, proxy, stored, "scope-apart")
    reads, merged = _plan(fragment, ("x", "y"), size)
    assert min(b[0] - (a[0] + a[1]) for a, b in itertools.pairwise(reads)) > MERGE_HOLE_BYTES
    assert [(offset, length) for offset, length, _ in merged] == reads
    assert _start_prefetch(fragment, [0, 1, 2, 3], ("x", "y"), eager=False) is None
    proxy.reset()
    assert scanned(fragment, projection(("x", "y"), table.schema), size, prefetch=False).equals(
        table.select(["x", "y"])
    )
    assert sorted(requested_bytes(proxy)) == [(offset, offset + length - 1) for offset, length in reads]


@pytest.mark.parametrize("how", ["scan-stopped", "scan-ended"])
def test_a_stopped_scans_merged_reads_are_fetched_no_more(
    moto_server: MotoServer, proxy: FaultProxy, many_groups: tuple[str, int, pa.Table], how: str
) -> None:
    """Once the scan is stopped (its stop set: a cancel, a LIMIT met) or ended (its generators closed), a read
    within a merged read not yet fetched sends only its own GET, as without merging: the merged read is never
    fetched."""
    location, size, _ = many_groups
    content = _content(moto_server, location)
    fragment = fragment_through(moto_server, proxy, many_groups, f"scope-merged-{how}")
    reads, merged = _plan(fragment, ("x", "y"), size)
    stop = threading.Event()
    with cached_files.stopping_prefetches(stop):  # as a scan's reader thread starts it
        prefetch = _start_prefetch(fragment, list(range(fragment.metadata.num_row_groups)), ("x", "y"), eager=False)
    assert prefetch is not None
    proxy.reset()
    first, second = _inside(reads, merged[0])[0], _inside(reads, merged[1])[0]
    try:
        with fragment.filesystem.open_input_file(fragment.path) as file:
            assert file.read_at(first[1], first[0]) == content[first[0] : first[0] + first[1]]
            if how == "scan-stopped":
                stop.set()
            else:
                _PREFETCHES.stop(prefetch)
            assert file.read_at(second[1], second[0]) == content[second[0] : second[0] + second[1]]
        assert _PREFETCHES.running() == 0
    finally:
        _PREFETCHES.stop(prefetch)
    fetched = requested_bytes(proxy)
    assert fetched == [(merged[0][0], merged[0][0] + merged[0][1] - 1), (second[0], second[0] + second[1] - 1)]


@pytest.mark.parametrize("decoded", [True, False], ids=["decoded-cache", "scanner"])
def test_a_failing_merged_get_is_the_typed_error_a_failing_read_is(
    moto_server: MotoServer, proxy: FaultProxy, many_groups: tuple[str, int, pa.Table], decoded: bool
) -> None:
    """A 403 on the data GETs: a scan whose reads are merged fails with the error a plain read of the file fails
    with (its readers waiting for the failed merged read too), and the GETs it sent were merged reads."""
    configure_process_caches(
        data_bytes=CACHE_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES, decoded_bytes=DEFAULT_DECODED_BYTES * decoded
    )
    _, size, table = many_groups
    fragment = fragment_through(moto_server, proxy, many_groups, f"scope-merged-refused-{decoded}")
    reads, merged = _plan(fragment, ("x", "y"), size)
    proxy.reset()
    proxy.inject("GET", DATA_GET, 403, 1000)
    with pytest.raises(OSError) as scanning:
        scanned(fragment, projection(("x", "y"), table.schema), size, prefetch=False)
    assert _PREFETCHES.running() == 0
    sent = set(requested_bytes(proxy))
    assert sent and sent <= {(offset, offset + length - 1) for offset, length, _ in merged}
    with pytest.raises(OSError) as reading, fragment.filesystem.open_input_file(fragment.path) as file:
        file.read_at(reads[0][1], reads[0][0])  # no prefetch registered: a plain miss
    assert type(scanning.value) is type(reading.value) is PermissionError
    assert str(scanning.value) == str(reading.value) and "HTTP 403" in str(reading.value)


@pytest.mark.parametrize("decoded", [True, False], ids=["decoded-cache", "scanner"])
def test_a_row_group_read_short_through_merged_reads_is_refused(
    moto_server: MotoServer, proxy: FaultProxy, many_groups: tuple[str, int, pa.Table], decoded: bool
) -> None:
    """A file whose sixth row group states one row more than its pages hold, read through merged reads: the scan
    is refused (DataFileError) as it is read range by range, never completed with the next group's rows."""
    configure_process_caches(
        data_bytes=CACHE_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES, decoded_bytes=DEFAULT_DECODED_BYTES * decoded
    )
    location, size, table = many_groups
    data = restated_counts(_content(moto_server, location), MANY_GROUP_ROWS, {5: MANY_GROUP_ROWS + 1})
    key = f"prefetch/{uuid.uuid4().hex}/short.parquet"
    moto_server.client("s3").put_object(Bucket=moto_server.bucket, Key=key, Body=data)
    short = (f"s3://{moto_server.bucket}/{key}", len(data), table)
    fragment = fragment_through(moto_server, proxy, short, f"scope-merged-short-{decoded}")
    _, merged = _plan(fragment, ("x", "y"), size)
    assert all(joined > 1 for _, _, joined in merged)
    proxy.reset()
    with pytest.raises(DataFileError, match="row group 5 states 20001 rows"):
        scanned(fragment, projection(("x", "y"), table.schema), len(data), prefetch=False)
    assert set(requested_bytes(proxy)) <= {(offset, offset + length - 1) for offset, length, _ in merged}


@pytest.mark.parametrize("prefetch", [False, True], ids=["prefetch-off", "prefetch-on"])
def test_a_chunk_a_corrupt_footer_places_before_the_file_sends_no_get_of_it(
    moto_server: MotoServer, proxy: FaultProxy, many_groups: tuple[str, int, pa.Table], prefetch: bool
) -> None:
    """Row group 0's x chunk stated at offset -1000: pyarrow refuses the file (reading nothing of that chunk), and
    no GET reaches outside the file. Before, the chunk was planned as a read at -1000 that the next groups' reads
    joined: the prefetch sent a GET of "bytes=-1000-1819392" (and, off, the first of those reads could)."""
    location, _, table = many_groups
    data = with_data_page_offset(_content(moto_server, location), 0, 1, -1000)
    key = f"prefetch/{uuid.uuid4().hex}/before-start.parquet"
    moto_server.client("s3").put_object(Bucket=moto_server.bucket, Key=key, Body=data)
    corrupt = (f"s3://{moto_server.bucket}/{key}", len(data), table)
    fragment = fragment_through(moto_server, proxy, corrupt, f"scope-before-start-{prefetch}")
    proxy.reset()
    with pytest.raises(OSError, match="corrupt file"):
        scanned(fragment, projection(("x", "y"), table.schema), len(data), prefetch=prefetch)
    assert all(header.startswith("bytes=") and header[6:7].isdigit() for _, header in proxy.ranges), proxy.ranges
    assert all(0 <= first <= last < len(data) for first, last in requested_bytes(proxy))
    assert _PREFETCHES.running() == 0


def test_a_stopped_scans_plan_not_yet_closed_leaves_a_new_scan_its_own_merged_reads(
    moto_server: MotoServer, proxy: FaultProxy, many_groups: tuple[str, int, pa.Table]
) -> None:
    """A scan of the file is stopped (cancelled, a LIMIT met) while its reader still waits inside pyarrow, so its
    plan is still registered for the file. A new scan of the same file plans and fetches its own merged reads,
    each once (before: the stopped plan held the file's one slot and served nothing, so the new scan sent each of
    pyarrow's twenty reads as its own GET), and gives the file's rows."""
    _, size, table = many_groups
    fragment = fragment_through(moto_server, proxy, many_groups, "scope-merged-stale")
    _, merged = _plan(fragment, ("x", "y"), size)
    stop = threading.Event()
    with cached_files.stopping_prefetches(stop):  # as the first scan's reader thread starts it
        stale = _start_prefetch(fragment, list(range(fragment.metadata.num_row_groups)), ("x", "y"), eager=False)
    assert stale is not None
    stop.set()  # the first scan is cancelled; its generators are not closed yet
    proxy.reset()
    try:
        result = scanned(fragment, projection(("x", "y"), table.schema), size, prefetch=False)
        assert _PREFETCHES.running() == 0
    finally:
        _PREFETCHES.stop(stale)  # its generators closed at last: nothing left to stop, no reservation to return
    assert result.equals(table.select(["x", "y"]))
    assert sorted(requested_bytes(proxy)) == [(offset, offset + length - 1) for offset, length, _ in merged]
    assert _PREFETCHES.running() == 0 and _PREFETCHES._reserved == 0
