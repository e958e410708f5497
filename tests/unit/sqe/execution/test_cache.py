"""The bounded per-process cache behind the footer cache, and kept fragments on a local warehouse."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import PyArrowFileIO

from sqe.execution.cache import FRAGMENTS, BoundedCache, clear_process_caches, parquet_fragment


def test_least_recently_used_goes_first_and_counts() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
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
