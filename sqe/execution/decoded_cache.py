"""A byte-bounded, per-process cache of decoded Parquet columns, so a repeat scan skips the decode as well.

The data-range cache (:mod:`sqe.execution.byte_cache`) keeps a file's raw bytes; a repeat query still decodes
them. This cache keeps what decoding produced: one Arrow column of one row group of one file, keyed by
(credential identity, path, size, row-group index, physical column name), weighed by its Arrow buffers' bytes and
sized by ``[cache] decoded_bytes`` (0 turns it off). Least recently used goes first; a column larger than the
bound is never kept.

Authorization is the range cache's, with the same key: an entry is looked up only for a Parquet fragment that
reads through the range cache (:func:`sqe.execution.cached_files.cached_file_key`), which exists only for a file
read under a credential set the catalog vended for its prefix in the current query, and the identity in the key
is that set's (an HMAC over prefix, source and properties). Another user, or the same user after a new
credential is vended, never reads another identity's entries. Values are raw decoded values of the file: the
row filter, the masks and the user's predicates run on the batches assembled from them exactly as without the
cache. Nothing here logs; the cache's repr shows only counts and bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from sqe.execution.byte_cache import FileKey, MemoryBoundedCache

__all__ = [
    "DECODED",
    "DEFAULT_DECODED_BYTES",
    "ColumnKey",
    "DecodedColumnCache",
    "clear_decoded_cache",
    "configure_decoded_cache",
]

# Same default as the range cache's: it holds the columns repeat queries read (a few 8-byte columns of tens of
# millions of rows), costs no memory until a scan fills it, and is bounded whatever the table size.
DEFAULT_DECODED_BYTES = 256 << 20

ColumnKey = tuple[str, str, int, int, str]  # credential identity, file path, file size, row group, column


def _buffer_bytes(column: pa.ChunkedArray) -> int:
    # Whole buffers, not a slice's share: what the entry keeps alive is what bounds memory.
    return int(column.get_total_buffer_size())


class DecodedColumnCache(MemoryBoundedCache[ColumnKey, pa.ChunkedArray]):
    """Decoded columns of row groups, at most ``max_bytes`` of Arrow buffers in all."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, weigh=_buffer_bytes)

    def columns(
        self, file: FileKey, row_group: int, names: Iterable[str], *, counted: bool = True
    ) -> dict[str, pa.ChunkedArray]:
        """The kept columns among ``names`` of one row group of ``file`` (a miss is simply absent);
        ``counted=False`` for columns a scan already looked up (and counted)."""
        found: dict[str, pa.ChunkedArray] = {}
        for name in names:
            column = self.get(_key(file, row_group, name), counted=counted)
            if column is not None:
                found[name] = column
        return found

    def put_column(self, file: FileKey, row_group: int, name: str, column: pa.ChunkedArray) -> bool:
        return self.put(_key(file, row_group, name), column)

    def drop_columns(self, file: FileKey, columns: Iterable[tuple[int, str]]) -> None:
        """Drop the (row group, column) entries of ``file``: what a read that was refused kept."""
        doomed = {_key(file, row_group, name) for row_group, name in columns}
        if doomed:
            self.drop_where(doomed.__contains__)


def _key(file: FileKey, row_group: int, name: str) -> ColumnKey:
    path, size, identity = file
    return (identity, path, size, row_group, name)


DECODED = DecodedColumnCache(DEFAULT_DECODED_BYTES)


def configure_decoded_cache(max_bytes: int) -> None:
    """Bound this process's cache (the last configured session wins; scan workers keep the default)."""
    DECODED.resize(max_bytes)


def clear_decoded_cache() -> None:
    DECODED.clear()
