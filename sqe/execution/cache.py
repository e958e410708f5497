"""Per-process caches of what Iceberg never rewrites in place, and opening data files without a HEAD.

Iceberg data files are immutable: a path names one content forever, so a Parquet footer read once can be
reused. A footer is still data of the table, so an entry is keyed by the file path, its size and the **identity
of the credential set the catalog vended for that path in the current query** (see
:attr:`sqe.credentials.scope.ResolvedCredentials.identity`): a lookup happens only while a query reads the
file with a credential set the catalog has just vended for that prefix (the executor runs after the query's
load-table), and a footer kept under one set never answers a read under another. The cache is bounded (least
recently used goes first), and entries go with their credential: when the FileIO pool releases an identity
(expired, or over its cap) its footers are dropped too, since each holds that set's filesystem (a client,
sockets, eventfds) and no later read can use them.

What is kept is a pyarrow Parquet fragment with its footer loaded: pyarrow has no public way to hand a kept
footer to a new fragment. The fragment reads through the filesystem of its own credential set, which is why the
key names the set itself (its keys included, under an HMAC), not only the prefix. Files are opened with the
size the manifest gives, so the object store sees no HEAD request.

With the data-range cache on (``[cache] data_bytes``), the fragment reads through
:func:`sqe.execution.cached_files.caching_filesystem` under the same scope key, so a repeat query's column
chunks come from memory too (see :mod:`sqe.execution.byte_cache`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.dataset as ds
from pyiceberg.io.pyarrow import PyArrowFile

from sqe._lru import LRUCache
from sqe.credentials.pool import FILE_IOS
from sqe.credentials.signed_reads import close_pool, signed_object
from sqe.execution.byte_cache import (
    DATA_RANGES,
    clear_byte_caches,
    configure_byte_caches,
    scope_key,
    vended_credentials,
)
from sqe.execution.cached_files import caching_filesystem
from sqe.execution.decoded_cache import DECODED, DEFAULT_DECODED_BYTES, clear_decoded_cache, configure_decoded_cache
from sqe.planning.manifests import ENTRY_READERS

if TYPE_CHECKING:
    from pyiceberg.io import FileIO

__all__ = [
    "FRAGMENTS",
    "clear_process_caches",
    "configure_process_caches",
    "footer_weight",
    "parquet_fragment",
    "scope_key",
]


# Kept footers are bounded by their size: a wide file with many row groups has a footer of megabytes, so a
# count alone (1,024 before) let them take gigabytes outside every [cache] bound.
DEFAULT_FOOTER_BYTES = 64 * 1024 * 1024
FOOTER_OVERHEAD_BYTES = 16 * 1024  # a kept fragment's own objects, whatever its footer's size


def footer_weight(fragment: ds.ParquetFileFragment) -> int:
    """What a kept fragment weighs: its footer's serialized size (the parsed form is of that order) and more."""
    return FOOTER_OVERHEAD_BYTES + int(fragment.metadata.serialized_size)


FragmentKey = tuple[str, int, str]  # file path, file size, credential identity
FRAGMENTS: LRUCache[FragmentKey, ds.ParquetFileFragment] = LRUCache(DEFAULT_FOOTER_BYTES, weigh=footer_weight)


def _drop_fragments_of(identity: str) -> None:
    FRAGMENTS.drop_where(lambda key: key[2] == identity)


def _drop_decoded_columns_of(identity: str) -> None:
    # No later read can look these up (a lookup needs a live fragment of that set); free their memory now.
    DECODED.drop_where(lambda key: key[0] == identity)


def _close_store_connections_once_no_set_is_live(_identity: str) -> None:
    # Signed reads share one connection pool across credential sets. Once the last set is released no read can
    # use it, so its kept sockets to the store close too, as the released sets' filesystems' do.
    if len(FILE_IOS) == 0:
        close_pool()


FILE_IOS.add_eviction_listener(_drop_fragments_of)
FILE_IOS.add_eviction_listener(_drop_decoded_columns_of)
FILE_IOS.add_eviction_listener(_close_store_connections_once_no_set_is_live)


def configure_process_caches(
    *, data_bytes: int, manifest_bytes: int, decoded_bytes: int = DEFAULT_DECODED_BYTES
) -> None:
    """Bound the data-range, manifest and decoded-column caches (``[cache]``); switching the range cache on or
    off drops the kept fragments, which read through it or not (the decoded cache is used only through it)."""
    toggled = (data_bytes > 0) != DATA_RANGES.enabled
    configure_byte_caches(data_bytes=data_bytes, manifest_bytes=manifest_bytes)
    configure_decoded_cache(decoded_bytes)
    if toggled:
        FRAGMENTS.clear()


def clear_process_caches() -> None:
    """Empty every per-process cache (benchmarks' cold runs, tests), the pooled filesystems and the signed
    reads' kept connections included (a cold run opens its connections again, as pyarrow's path does), and
    planning's resolved manifest readers (a cold plan resolves its first manifest's reader again)."""
    FRAGMENTS.clear()
    FILE_IOS.clear()
    clear_byte_caches()
    clear_decoded_cache()
    close_pool()
    ENTRY_READERS.clear()


def parquet_fragment(io: FileIO, path: str, size: int, file_format: ds.ParquetFileFormat) -> ds.ParquetFileFragment:
    """A Parquet fragment of ``path`` with its footer loaded, opened with the manifest's ``size`` (no HEAD).

    Kept per (path, size, credential identity): the fragment reads through the filesystem of that very
    credential set, so a kept one is only ever used by a read the catalog has just vended that set for.
    """
    # Asked before opening and again after: a credential refresh in between (sets only move forward) must not
    # key one set's reads, or its ranges, to the next set.
    identity = scope_key(io, path)
    vended = vended_credentials(io, path) if identity is not None and DATA_RANGES.enabled else None
    input_file = io.new_input(path)
    if not isinstance(input_file, PyArrowFile):
        # Not pyarrow's filesystem: the fragment reads a buffer of the whole file (a stream would close on return).
        with input_file.open() as stream:
            fragment = file_format.make_fragment(pa.py_buffer(stream.read()))
        fragment.ensure_complete_metadata()
        return fragment
    if size <= 0:  # unknown (a ticket's unset field): pyarrow asks the store for it, and nothing is kept
        fragment = file_format.make_fragment(input_file._path, filesystem=input_file._filesystem)
        fragment.ensure_complete_metadata()
        return fragment
    if scope_key(io, path) != identity:  # refreshed meanwhile: which set this file reads with is not known
        identity = None
    key = (path, size, identity) if identity is not None else None
    cached = FRAGMENTS.get(key) if key is not None else None
    if cached is not None:
        return cached
    # pyiceberg keeps the filesystem and the scheme-less path of a PyArrowFile in these two attributes.
    fragment = file_format.make_fragment(input_file._path, filesystem=input_file._filesystem, file_size=size)
    if key is not None and vended is not None:
        # The same file, its byte ranges kept under the same scope (a catalog-vended one only); misses are
        # signed ranged GETs under that set with the manifest's size (no HEAD) where signed reads handle it.
        direct = signed_object(path, vended)
        filesystem = caching_filesystem(key, input_file._path, upstream=fragment, direct=direct)
        fragment = file_format.make_fragment(input_file._path, filesystem=filesystem, file_size=size)
    fragment.ensure_complete_metadata()  # the footer, read once
    if key is not None:
        FRAGMENTS.put(key, fragment)
    return fragment
