"""The decoded-column cache: its bound and keys, and the direct read path over real Parquet files through SQE's
ScopedFileIO (range-cached fragments), checked against pyarrow's own scanner on the same fragment."""

from __future__ import annotations

import dataclasses
import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions.parser import parse
from pyiceberg.expressions.visitors import bind
from pyiceberg.io.pyarrow import expression_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from sqe.credentials import CredentialSet, StoragePolicy
from sqe.credentials.fileio import ScopedFileIO
from sqe.errors import QueryError
from sqe.execution.cache import FRAGMENTS, clear_process_caches, configure_process_caches, parquet_fragment
from sqe.execution.cached_files import cached_file_key, kept_whole
from sqe.execution.decoded_cache import DECODED, DEFAULT_DECODED_BYTES, DecodedColumnCache
from sqe.execution.local import DirectProjection
from sqe.execution.row_filter import compile_row_filter
from tests.unit.sqe.execution.test_row_group_rows import restated_counts
from tests.unit.sqe.iceberg_local import numbers_batch

FORMAT = ds.ParquetFileFormat(pre_buffer=True, buffer_size=8 << 20)
FILE = ("s3://b/t/data/f.parquet", 1000, "identity-a")
ROWS, GROUP_ROWS = 40_000, 10_000


@pytest.fixture(autouse=True)
def fresh_caches() -> Iterator[None]:
    configure_process_caches(data_bytes=64 << 20, manifest_bytes=8 << 20, decoded_bytes=64 << 20)
    clear_process_caches()
    yield
    configure_process_caches(data_bytes=64 << 20, manifest_bytes=8 << 20, decoded_bytes=DEFAULT_DECODED_BYTES)
    clear_process_caches()


def column(values: list[int]) -> pa.ChunkedArray:
    return pa.chunked_array([pa.array(values, pa.int64())])


def test_the_bound_is_in_arrow_buffer_bytes_least_recently_used_first_and_oversized_columns_are_never_kept() -> None:
    cache = DecodedColumnCache(2 * 8 * 100)  # two 100-value int64 columns
    assert cache.put_column(FILE, 0, "a", column(list(range(100))))
    assert cache.put_column(FILE, 0, "b", column(list(range(100))))
    assert cache.kept_bytes == 1600 and set(cache.columns(FILE, 0, ["a", "b"])) == {"a", "b"}
    cache.columns(FILE, 0, ["a"])  # "b" is now the least recently used
    assert cache.put_column(FILE, 1, "a", column(list(range(100))))
    assert set(cache.columns(FILE, 0, ["a", "b"])) == {"a"} and cache.stats.evictions == 1
    assert not cache.put_column(FILE, 2, "a", column(list(range(201))))  # alone over the bound
    assert cache.kept_bytes <= cache.max_bytes
    cache.resize(0)
    assert len(cache) == 0 and not cache.enabled and not cache.put_column(FILE, 0, "a", column([1]))


def test_a_slice_weighs_its_whole_buffers_since_it_keeps_them_alive() -> None:
    cache = DecodedColumnCache(1 << 20)
    whole = pa.array(list(range(1000)), pa.int64())
    cache.put_column(FILE, 0, "a", pa.chunked_array([whole.slice(0, 10)]))
    assert cache.kept_bytes == 8000


def test_entries_answer_only_their_own_identity_file_size_row_group_and_column() -> None:
    cache = DecodedColumnCache(1 << 20)
    cache.put_column(FILE, 3, "a", column([1, 2, 3]))
    path, size, _ = FILE
    assert cache.columns(FILE, 3, ["a"])["a"].to_pylist() == [1, 2, 3]
    for other, group, name in [
        ((path, size, "identity-b"), 3, "a"),  # another credential identity
        ((path, size + 1, "identity-a"), 3, "a"),
        (("s3://b/t/data/g.parquet", size, "identity-a"), 3, "a"),
        (FILE, 2, "a"),
        (FILE, 3, "b"),
    ]:
        assert cache.columns(other, group, [name]) == {}
    assert cache.stats.hits == 1 and cache.stats.misses == 5
    assert "identity" not in repr(cache) and "s3://" not in repr(cache)
    with pytest.raises(TypeError):
        pickle.dumps(cache)  # it holds a lock: never pickled, so never shipped to a worker


def scoped_io(root: Path, access_key_id: str) -> ScopedFileIO:
    covering = CredentialSet(prefix=f"file://{root}", access_key_id=access_key_id, secret_access_key="s" * 8)
    return ScopedFileIO([covering], StoragePolicy())


def write_file(path: Path) -> int:
    table = pa.table(
        {"id": list(range(ROWS)), "name": [f"n{i}" for i in range(ROWS)], "x": [i * 0.5 for i in range(ROWS)]}
    )
    pq.write_table(table, path, row_group_size=GROUP_ROWS)
    return path.stat().st_size


def projection(
    fragment: ds.ParquetFileFragment,
    names: tuple[str, ...],
    arrow_filter: pc.Expression | None = None,
    filter_columns: tuple[str, ...] | None = (),
) -> DirectProjection:
    schema = pa.schema([fragment.physical_schema.field(name) for name in names])
    return DirectProjection(names, schema, arrow_filter, filter_columns)


def scanner_rows(
    fragment: ds.ParquetFileFragment, names: tuple[str, ...], arrow_filter: pc.Expression | None = None
) -> pa.Table:
    scanner = ds.Scanner.from_fragment(
        fragment, schema=fragment.physical_schema, columns=list(names), filter=arrow_filter
    )
    return scanner.to_table()


def read(
    direct: DirectProjection, fragment: ds.ParquetFileFragment, size: int, batch_bytes: int = 1 << 20
) -> list[pa.RecordBatch]:
    return list(direct.batches(fragment, batch_bytes, file_size=size))


@pytest.fixture(params=["kept-whole", "by-ranges"])
def alice_file(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, int, ds.ParquetFileFragment]:
    """A file read through the range cache, kept whole (decoded by the Parquet reader) or in ranges (decoded by
    the dataset scanner: a bound this small does not keep a file of this size whole)."""
    path = tmp_path / "f.parquet"
    size = write_file(path)
    if request.param == "by-ranges":
        configure_process_caches(data_bytes=8 * size, manifest_bytes=8 << 20, decoded_bytes=64 << 20)
    fragment = parquet_fragment(scoped_io(tmp_path, "AKIA-ALICE"), f"file://{path}", size, FORMAT)
    assert kept_whole(size) == (request.param == "kept-whole")
    return path, size, fragment


def test_a_repeat_scan_decodes_nothing_and_yields_the_scanners_rows_in_file_order(
    alice_file: tuple[Path, int, ds.ParquetFileFragment],
) -> None:
    _, size, fragment = alice_file
    direct = projection(fragment, ("id", "name"))
    expected = scanner_rows(fragment, ("id", "name"))
    first = read(direct, fragment, size)
    assert pa.Table.from_batches(first).equals(expected) and len(DECODED) == 2 * (ROWS // GROUP_ROWS)
    assert [b.num_rows for b in first] == [GROUP_ROWS] * 4  # one batch per row group, never spanning two
    hits, misses, kept = DECODED.stats.hits, DECODED.stats.misses, len(DECODED)
    again = read(direct, fragment, size)
    assert pa.Table.from_batches(again).equals(expected) and all(b.schema == direct.schema for b in again)
    assert DECODED.stats.misses == misses and DECODED.stats.hits == hits + kept and len(DECODED) == kept


def test_only_the_missing_columns_are_decoded_and_batches_keep_the_row_limit(
    alice_file: tuple[Path, int, ds.ParquetFileFragment],
) -> None:
    _, size, fragment = alice_file
    read(projection(fragment, ("id",)), fragment, size)
    misses = DECODED.stats.misses
    wider = projection(fragment, ("x", "id"))
    batches = read(wider, fragment, size, batch_bytes=3000 * 16)  # 16 bytes a row: below the 8,192-row floor
    assert DECODED.stats.misses == misses + 4  # "x" of each row group; "id" came from the cache
    assert max(b.num_rows for b in batches) == 8_192 and sum(b.num_rows for b in batches) == ROWS
    assert pa.Table.from_batches(batches).equals(scanner_rows(fragment, ("x", "id")))


def test_a_filter_prunes_row_groups_by_statistics_and_keeps_exactly_the_scanners_rows(
    alice_file: tuple[Path, int, ds.ParquetFileFragment],
) -> None:
    _, size, fragment = alice_file
    # The filter reads "x", which the projection does not return.
    keep = (pc.field("x") >= 12_000.0) & (pc.field("x") < 12_010.0)
    direct = projection(fragment, ("id", "name"), keep, ("x",))
    expected = scanner_rows(fragment, ("id", "name"), keep)
    assert expected.num_rows == 20
    for _ in range(2):
        assert pa.Table.from_batches(read(direct, fragment, size)).equals(expected)
    # Only the row group holding x in [12000, 12010) (rows 24000..24019: the third) was decoded and kept.
    assert len(DECODED) == 3 and set(key[3] for key in DECODED.snapshot_keys()) == {2}


def test_the_compiled_row_filter_keeps_the_scanners_rows_and_is_what_filters_the_groups(
    alice_file: tuple[Path, int, ds.ParquetFileFragment],
) -> None:
    """direct_projection compiles the row filter to compute calls; the assembled row groups go through it."""
    _, size, fragment = alice_file
    file_schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "name", StringType(), required=False),
        NestedField(3, "x", DoubleType(), required=False),
    )
    bound = bind(file_schema, parse("x >= 12000.0 AND x < 12010.0 AND name <> 'n24005'"), case_sensitive=True)
    keep = expression_to_pyarrow(bound, file_schema)
    mask = compile_row_filter(bound, file_schema, fragment.physical_schema)
    assert mask is not None
    direct = dataclasses.replace(projection(fragment, ("id", "name"), keep, ("x",)), row_mask=mask)
    expected = scanner_rows(fragment, ("id", "name"), keep)
    assert expected.num_rows == 19
    for _ in range(2):  # decoded, then assembled from the kept columns
        assert pa.Table.from_batches(read(direct, fragment, size)).equals(expected)
    # The groups are filtered by the mask, not by the expression (a mask that keeps nothing shows which runs).
    nothing = dataclasses.replace(direct, row_mask=lambda table: pa.scalar(False))
    assert read(nothing, fragment, size) == []


def test_another_credential_set_never_reads_the_first_ones_columns(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    size = write_file(path)
    alice = parquet_fragment(scoped_io(tmp_path, "AKIA-ALICE"), f"file://{path}", size, FORMAT)
    bob = parquet_fragment(scoped_io(tmp_path, "AKIA-BOB"), f"file://{path}", size, FORMAT)
    alice_key, bob_key = cached_file_key(alice), cached_file_key(bob)
    assert alice_key is not None and bob_key is not None and alice_key[2] != bob_key[2]
    expected = pa.Table.from_batches(read(projection(alice, ("id",)), alice, size))
    hits = DECODED.stats.hits
    assert pa.Table.from_batches(read(projection(bob, ("id",)), bob, size)).equals(expected)
    assert DECODED.stats.hits == hits and len(DECODED) == 8  # bob decoded and kept his own
    assert {key[0] for key in DECODED.snapshot_keys()} == {alice_key[2], bob_key[2]}
    assert "AKIA" not in repr(DECODED)


def test_off_not_range_cached_or_without_columns_reads_as_before_and_keeps_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    size = write_file(path)
    configure_process_caches(data_bytes=64 << 20, manifest_bytes=8 << 20, decoded_bytes=0)
    fragment = parquet_fragment(scoped_io(tmp_path, "AKIA-ALICE"), f"file://{path}", size, FORMAT)
    assert pa.Table.from_batches(read(projection(fragment, ("id",)), fragment, size)).num_rows == ROWS
    assert len(DECODED) == 0
    configure_process_caches(data_bytes=0, manifest_bytes=0, decoded_bytes=64 << 20)  # no range cache: no key
    FRAGMENTS.clear()
    plain = parquet_fragment(scoped_io(tmp_path, "AKIA-ALICE"), f"file://{path}", size, FORMAT)
    assert cached_file_key(plain) is None
    assert pa.Table.from_batches(read(projection(plain, ("id",)), plain, size)).num_rows == ROWS
    assert len(DECODED) == 0
    configure_process_caches(data_bytes=64 << 20, manifest_bytes=8 << 20, decoded_bytes=64 << 20)
    FRAGMENTS.clear()
    cached = parquet_fragment(scoped_io(tmp_path, "AKIA-ALICE"), f"file://{path}", size, FORMAT)
    count_only = DirectProjection((), pa.schema([]), None)  # no column at all: nothing to keep
    read(count_only, cached, size)
    assert len(DECODED) == 0
    unreadable = projection(cached, ("id",), pc.field("id") > 5, None)  # a filter on a nested column, say
    assert sum(b.num_rows for b in read(unreadable, cached, size)) == ROWS - 6 and len(DECODED) == 0


def test_a_row_group_too_large_for_its_share_of_the_bound_streams_uncached(
    alice_file: tuple[Path, int, ds.ParquetFileFragment],
) -> None:
    _, size, fragment = alice_file
    configure_process_caches(data_bytes=64 << 20, manifest_bytes=8 << 20, decoded_bytes=8 * GROUP_ROWS * 4)
    # 80 KB of "id" per group, over an eighth of 320 KB: decoded batch by batch as without the cache.
    assert pa.Table.from_batches(read(projection(fragment, ("id",)), fragment, size)).num_rows == ROWS
    assert len(DECODED) == 0


def test_clear_process_caches_empties_it(alice_file: tuple[Path, int, ds.ParquetFileFragment]) -> None:
    _, size, fragment = alice_file
    read(projection(fragment, ("id",)), fragment, size)
    assert DECODED.kept_bytes > 0
    clear_process_caches()
    assert len(DECODED) == 0 and DECODED.kept_bytes == 0


def test_a_consumer_leaving_mid_group_keeps_no_partial_column(
    alice_file: tuple[Path, int, ds.ParquetFileFragment],
) -> None:
    _, size, fragment = alice_file
    direct = projection(fragment, ("id",))
    batches = direct.batches(fragment, 3000 * 8, file_size=size)  # 8,192-row pieces: a group takes two
    first = next(batches)
    assert first.num_rows == 8_192
    batches.close()  # the query went away inside the first row group
    assert len(DECODED) == 0  # a group is kept only once all its rows were decoded
    assert pa.Table.from_batches(read(direct, fragment, size)).equals(scanner_rows(fragment, ("id",)))
    assert len(DECODED) == ROWS // GROUP_ROWS


def test_columns_go_when_their_credential_set_leaves_the_pool() -> None:
    from sqe.credentials.pool import FILE_IOS

    DECODED.put_column(("s3://b/t/f.parquet", 10, "identity-gone"), 0, "a", column([1]))
    DECODED.put_column(("s3://b/t/f.parquet", 10, "identity-live"), 0, "a", column([2]))
    FILE_IOS.file_io("identity-gone", {}, expires_at=None)
    FILE_IOS.clear()  # released: no read can look its entries up again
    assert [key[0] for key in DECODED.snapshot_keys()] == ["identity-live"]


def write_skewed_file(path: Path) -> int:
    """Two row groups: short names first, then long ones, so an estimate from the first group is far too low."""
    long_rows = 40_000
    short = pa.table({"name": ["n"] * GROUP_ROWS})
    long = pa.table({"name": ["x" * 390 + f"{i:010d}" for i in range(long_rows)]})  # 16 MB decoded
    with pq.ParquetWriter(path, short.schema) as writer:
        writer.write_table(short, row_group_size=GROUP_ROWS)
        writer.write_table(long, row_group_size=long_rows)
    return path.stat().st_size


def settled_allocated_bytes(quiet_polls: int = 5, most_polls: int = 400) -> int:
    """Arrow's allocated bytes once they stop changing. A finished scan's last buffers are let go by Arrow's own
    threads a moment after its iterator ends, so a figure taken at once may still count them or be mid-way."""
    last, quiet = pa.total_allocated_bytes(), 0
    for _ in range(most_polls):
        time.sleep(0.005)
        now = pa.total_allocated_bytes()
        quiet = quiet + 1 if now == last else 0
        if quiet == quiet_polls:
            break
        last = now
    return last


def peak_bytes_while_reading(direct: DirectProjection, fragment: ds.ParquetFileFragment, size: int) -> tuple[int, int]:
    """(rows, the most Arrow memory held at once) over a scan whose batches are let go as they arrive."""
    baseline, peak, rows = settled_allocated_bytes(), 0, 0
    for batch in direct.batches(fragment, 3000 * 8, file_size=size):  # 8,192-row pieces
        rows += batch.num_rows
        del batch
        peak = max(peak, pa.total_allocated_bytes() - baseline)
    return rows, peak


@pytest.mark.parametrize("whole", [True, False], ids=["kept-whole", "by-ranges"])
def test_a_row_group_larger_than_its_share_once_decoded_is_neither_kept_nor_held_whole(
    tmp_path: Path, whole: bool
) -> None:
    path = tmp_path / "skewed.parquet"
    size = write_skewed_file(path)
    bound = 32 << 20  # an eighth is 4 MB; the second group's names decode to 16 MB
    data_bytes = (64 << 20) if whole else 2 * size
    configure_process_caches(data_bytes=data_bytes, manifest_bytes=8 << 20, decoded_bytes=0)
    fragment = parquet_fragment(scoped_io(tmp_path, "AKIA-ALICE"), f"file://{path}", size, FORMAT)
    direct = projection(fragment, ("name",))
    _, uncached_peak = peak_bytes_while_reading(direct, fragment, size)
    configure_process_caches(data_bytes=data_bytes, manifest_bytes=8 << 20, decoded_bytes=bound)
    assert kept_whole(size) == whole and cached_file_key(fragment) is not None
    rows, peak = peak_bytes_while_reading(direct, fragment, size)
    assert rows == GROUP_ROWS + 40_000
    assert [key[3] for key in DECODED.snapshot_keys()] == [0]  # the short group only
    assert all(DECODED.get(key).get_total_buffer_size() <= bound // 8 for key in DECODED.snapshot_keys())
    assert peak <= uncached_peak + bound // 8  # at most a share more than without the cache, never the group


def test_a_scan_holds_no_kept_column_of_a_later_row_group_so_eviction_frees_it_and_the_rows_stay_exact(
    alice_file: tuple[Path, int, ds.ParquetFileFragment],
) -> None:
    _, size, fragment = alice_file
    direct = projection(fragment, ("id",))
    expected = scanner_rows(fragment, ("id",))
    read(direct, fragment, size)
    kept_bytes = DECODED.kept_bytes  # "id" of all four groups, 80 KB each
    batches = direct.batches(fragment, 1 << 20, file_size=size)
    got = [next(batches)]  # the repeat scan is inside the first group; it decodes nothing, so nothing else runs
    before = settled_allocated_bytes()  # not counting what the first scan's threads were still letting go
    DECODED.clear()  # another scan's columns evicted every kept one meanwhile
    freed = before - pa.total_allocated_bytes()
    assert freed >= kept_bytes - 2 * (kept_bytes // 4)  # at most the group being read stays alive
    got.extend(batches)  # the evicted groups are decoded again: still the scanner's rows
    assert pa.Table.from_batches(got).equals(expected)


def test_a_kept_column_evicted_while_the_other_columns_are_decoded_is_decoded_again_for_its_group(
    alice_file: tuple[Path, int, ds.ParquetFileFragment],
) -> None:
    _, size, fragment = alice_file
    read(projection(fragment, ("id",)), fragment, size)  # "id" kept; "x" is not
    wider = projection(fragment, ("x", "id"))
    batches = wider.batches(fragment, 1 << 20, file_size=size)
    got = [next(batches)]
    DECODED.clear()
    got.extend(batches)
    assert pa.Table.from_batches(got).equals(scanner_rows(fragment, ("x", "id")))
    assert {key[4] for key in DECODED.snapshot_keys()} == {"x"}  # the re-decoded "id" was not kept again


def test_concurrent_scans_of_one_file_filling_and_evicting_the_same_keys_all_get_the_scanners_rows(
    alice_file: tuple[Path, int, ds.ParquetFileFragment],
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    _, size, fragment = alice_file
    configure_process_caches(data_bytes=64 << 20, manifest_bytes=8 << 20, decoded_bytes=3 * 8 * GROUP_ROWS * 8)
    scans = [
        projection(fragment, ("id",)),
        projection(fragment, ("x", "id")),
        projection(fragment, ("x",), pc.field("id") > 5_000, ("id",)),
        projection(fragment, ("id", "name"), pc.field("x") < 15_000.0, ("x",)),
    ]
    expected = [scanner_rows(fragment, scan.file_columns, scan.arrow_filter) for scan in scans]

    def exact(i: int) -> bool:
        scan = scans[i % len(scans)]
        got = pa.Table.from_batches(read(scan, fragment, size), schema=scan.schema)
        return got.equals(expected[i % len(scans)])

    with ThreadPoolExecutor(6) as pool:
        assert all(pool.map(exact, range(60)))
    assert DECODED.stats.evictions > 0 and DECODED.kept_bytes <= DECODED.max_bytes


def test_a_kept_column_that_does_not_fit_the_files_footer_is_decoded_again_not_served(
    alice_file: tuple[Path, int, ds.ParquetFileFragment],
) -> None:
    _, size, fragment = alice_file
    key = cached_file_key(fragment)
    assert key is not None
    # As if the path had been rewritten in place at the same size: a kept "id" of another type, and a short one.
    DECODED.put_column(key, 0, "id", pa.chunked_array([pa.array([str(-i) for i in range(GROUP_ROWS)])]))
    DECODED.put_column(key, 1, "id", column(list(range(10))))
    direct = projection(fragment, ("id",))
    for _ in range(2):
        assert pa.Table.from_batches(read(direct, fragment, size)).equals(scanner_rows(fragment, ("id",)))


@pytest.mark.parametrize("whole", [True, False], ids=["kept-whole", "by-ranges"])
def test_a_row_group_read_in_slices_of_one_decoded_buffer_weighs_that_buffer_once(tmp_path: Path, whole: bool) -> None:
    """A reader may decode a column chunk whole and slice the batches from it: the group then holds that buffer
    once, not once per batch, and is kept when the buffer fits its share."""
    path = tmp_path / "one-group.parquet"
    rows = 200_000  # 1.6 MB of int64 decoded; in 8,192-row batches 25 slices, 40 MB if each counted the buffer
    pq.write_table(pa.table({"id": pa.array(range(rows), pa.int64())}), path, row_group_size=rows)
    size = path.stat().st_size
    data_bytes = (64 << 20) if whole else 2 * size
    configure_process_caches(data_bytes=data_bytes, manifest_bytes=8 << 20, decoded_bytes=32 << 20)  # share 4 MB
    fragment = parquet_fragment(scoped_io(tmp_path, "AKIA-ALICE"), f"file://{path}", size, FORMAT)
    assert kept_whole(size) == whole and cached_file_key(fragment) is not None
    direct = projection(fragment, ("id",))
    batches = read(direct, fragment, size, batch_bytes=8192 * 8)
    assert sum(batch.num_rows for batch in batches) == rows and max(batch.num_rows for batch in batches) <= 8192
    assert [key[3:] for key in DECODED.snapshot_keys()] == [(0, "id")]
    assert pa.Table.from_batches(read(direct, fragment, size, batch_bytes=8192 * 8)).equals(
        scanner_rows(fragment, ("id",))
    )


@pytest.mark.parametrize("decoded", [True, False], ids=["decoded-cache", "no-decoded-cache"])
def test_a_row_group_short_of_its_stated_rows_read_by_ranges_is_refused_and_nothing_of_it_is_kept(
    tmp_path: Path, decoded: bool
) -> None:
    # Two row groups of 1,000 rows whose footer says 1,005 and 995 (every count agreeing: 2,000). Before, read in
    # ranges: with the cache, the scanner's batches were cut at the stated counts, so group 0 was completed with
    # the first 5 rows of group 1 and kept before the read was refused; the next scan took that entry (1,005 rows,
    # as stated) and read group 1's 995, without error: ids 1000-1004 twice, 1995-1999 never. Without the cache
    # the scanner read 1,995 rows, without error.
    buffer = pa.BufferOutputStream()
    pq.write_table(numbers_batch(0, 2000), buffer, row_group_size=1000)
    data = restated_counts(buffer.getvalue().to_pybytes(), 1000, {0: 1005, 1: 995})
    path = tmp_path / "short.parquet"
    path.write_bytes(data)
    size = len(data)
    configure_process_caches(data_bytes=8 * size, manifest_bytes=8 << 20, decoded_bytes=(64 << 20) if decoded else 0)
    fragment = parquet_fragment(scoped_io(tmp_path, "AKIA-ALICE"), f"file://{path}", size, FORMAT)
    assert not kept_whole(size) and cached_file_key(fragment) is not None
    direct = projection(fragment, ("id", "name"))
    for _ in range(2):
        with pytest.raises(QueryError) as raised:
            read(direct, fragment, size)
        assert len(DECODED) == 0  # nothing of a refused read is kept
        assert str(raised.value) == (
            "cannot read a data file of the table: its row group 0 states 1005 rows, its pages held 1000"
        )
