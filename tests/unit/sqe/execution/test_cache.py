"""The bounded per-process cache behind the footer cache (bounded by footer size), and kept fragments on a local
warehouse."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from pyiceberg.io import InputFile
from pyiceberg.io.pyarrow import PyArrowFileIO

from sqe._lru import LRUCache
from sqe.credentials.model import StorageSettings
from sqe.credentials.scope import ResolvedCredentials
from sqe.execution.cache import FRAGMENTS, clear_process_caches, footer_weight, parquet_fragment


def test_least_recently_used_goes_first_and_counts() -> None:
    cache: LRUCache[str, int] = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (3, 1, 1)
    cache.clear()
    assert len(cache) == 0


def test_a_plain_pyiceberg_fileio_has_no_credential_scope_so_nothing_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3]}), path)
    clear_process_caches()
    fragment = parquet_fragment(PyArrowFileIO(), f"file://{path}", path.stat().st_size, ds.ParquetFileFormat())
    assert fragment.metadata.num_rows == 3 and fragment.to_table().column("id").to_pylist() == [1, 2, 3]
    assert len(FRAGMENTS) == 0  # only SQE's ScopedFileIO names a scope to key on


def test_kept_footers_are_bounded_by_their_size_not_their_count(tmp_path: Path) -> None:
    # Found by review: 1,024 kept footers of wide, many-row-group files could take gigabytes outside [cache].
    wide = pa.table({f"c{i}": list(range(200)) for i in range(200)})
    path = tmp_path / "wide.parquet"
    pq.write_table(wide, path, row_group_size=10)  # 20 row groups x 200 columns: a footer of several hundred KB
    fragment = ds.ParquetFileFormat().make_fragment(str(path), filesystem=pafs.LocalFileSystem())
    fragment.ensure_complete_metadata()
    weight = footer_weight(fragment)
    assert weight > fragment.metadata.serialized_size > 100_000
    kept: LRUCache[int, ds.ParquetFileFragment] = LRUCache(3 * weight, weigh=footer_weight)  # as FRAGMENTS
    for index in range(10):
        kept.put(index, fragment)
    assert len(kept) == 3 and kept.weight <= kept.bound
    assert FRAGMENTS.bound == 64 * 1024 * 1024


class _RefreshedWhileOpening(PyArrowFileIO):
    """A FileIO naming a vended credential set; with ``refreshing``, a newer set replaces it as a file is opened, as
    a refresh on another thread may do between the cache's look at the set and the open."""

    def __init__(self, *, refreshing: bool) -> None:
        super().__init__()
        self.generation = 0
        self.refreshing = refreshing

    def resolve(self, location: str) -> ResolvedCredentials:
        properties = MappingProxyType({"s3.access-key-id": f"key-{self.generation}"})
        return ResolvedCredentials(properties, "vended", "file://", None, StorageSettings())

    def new_input(self, location: str) -> InputFile:
        self.generation += self.refreshing
        return super().new_input(location)


@pytest.mark.parametrize("refreshing", [False, True])
def test_a_file_opened_while_its_credentials_were_refreshed_is_not_kept_under_either_set(
    tmp_path: Path, refreshing: bool
) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3]}), path)
    clear_process_caches()
    io = _RefreshedWhileOpening(refreshing=refreshing)
    fragment = parquet_fragment(io, f"file://{path}", path.stat().st_size, ds.ParquetFileFormat())
    assert fragment.to_table().column("id").to_pylist() == [1, 2, 3]
    # read with the older set, it must not serve reads made under the newer one; with one set, it is kept
    assert len(FRAGMENTS) == (0 if refreshing else 1)
    clear_process_caches()
