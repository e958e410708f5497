"""Reads that repeat queries answer from process memory: data-file byte ranges and whole manifest files.

Both caches hold immutable content only (an Iceberg data file, manifest list or manifest never changes once
written under its path) and key every entry by the **catalog-vended credential scope** the bytes were read
under (see :func:`sqe.execution.byte_cache.vended_credentials`; SQE's static key or no key caches nothing). A
lookup happens only while a query reads the file through the ScopedFileIO the catalog has just vended for it
(the executor and planner run after the query's load-table), and an entry read under one credential set never
answers a read under another. So nothing crosses users or credential sets, and a user the catalog refuses
never reaches a lookup at all.

- **Data ranges.** A Parquet fragment is built over a small pyarrow file system (:class:`_RangeFileHandler`)
  whose files read through :class:`_RangeReader`: every byte range pyarrow asks for (its coalesced column-chunk
  reads and the footer's tail) is served from :data:`sqe.execution.byte_cache.DATA_RANGES` when one kept
  range covers it, else read from the object store and kept. A miss is one signed ranged GET
  (:mod:`sqe.credentials.signed_reads`; the file's size is the manifest's), so no HEAD; only a case that module
  leaves to pyarrow opens the file through pyarrow, which costs one HEAD per file.
- **Merged reads** (always). pyarrow pre-buffers each row group's column chunks on its own (the scanner reads
  each group as its own fragment), so a file of small row groups costs at least a GET per group.
  :func:`prefetched` plans a scan's reads (its row groups after statistics pruning, its projected and filter
  columns only) as pyarrow coalesces them, and joins consecutive ones at most :data:`MERGE_HOLE_BYTES` (1 MiB)
  apart into merged reads of at most :func:`merged_part_bytes` (:data:`PREFETCH_PART_BYTES`, and 1/16 of the
  range cache's bound so one is kept): a GET's first byte costs about what 1 MiB of transfer does, so a gap's
  bytes are read rather than another request sent. A merged read that joins two or more of pyarrow's reads is
  fetched, whole and once, when a read it holds misses (by that reader; a concurrent reader of the same part
  waits for it), kept in :data:`sqe.execution.byte_cache.DATA_RANGES` and the read served from it. Nothing is
  fetched ahead and nothing is reserved, so a file of any size is merged end to end; a read that joins none is
  sent as pyarrow asks, as without merging. The cost: the gaps' bytes (other columns' chunks) are read too, and
  a merged read is one connection's transfer where the scanner would have sent its groups' reads in parallel:
  so without the prefetch a read joins only while it and its gap are small (:data:`MERGE_SMALL_BYTES`).
- **Prefetch** (opt-in: ``[cache] prefetch``, ``sqe-worker --prefetch``). pyarrow reads such a file through one
  Python file per row group, whose reads are serialised, so a group's GETs go one after another. With it,
  :func:`prefetched` sends the GETs of the merged reads above (and of pyarrow's reads that join none) in parallel
  before pyarrow asks, in parts of at most :data:`PREFETCH_PART_BYTES`, through the same signed reader into the
  same cache entries. A read waits for its parts (a part's error is raised there) and is served from them, as a
  later read of the same bytes is while they stay kept. At most :data:`PREFETCH_THREADS` GETs run at once in the
  process, a file's prefetch covers at most :data:`PREFETCH_FILE_BYTES`, and all prefetches together at most
  half the range cache's bound (merged reads past that are fetched as they are read, as above).
- Either way a scan that ends (or whose stop is set: a cancel, a LIMIT met) stops its plan: parts not yet sent
  are never sent, and a read after that is sent as pyarrow asks.
- **Manifests.** Planning reads the manifest list and manifests through :class:`MetadataCachingFileIO`, which
  keeps each file's bytes whole in :data:`sqe.execution.byte_cache.MANIFESTS`; a miss is one signed GET of the
  whole object (pyarrow's open would add a HEAD), read no further than ``MAX_MANIFEST_BYTES`` and checked
  against the inflated limit (:mod:`sqe.planning.avro_limits`) before it is kept, so a hit is never checked again.
  The check inflates each block once and the miss is decoded from those inflated blocks; a hit's stored bytes
  are inflated by pyiceberg, once.

The kept bytes are raw file content; the restriction order (row filter, masks, then the user's predicates)
runs on the decoded batches exactly as without the cache. Nothing here logs, and no repr shows content.

A small data file (:data:`WHOLE_FILE_BYTES`) is read and kept whole on its first miss; once kept whole it opens
as a ``pa.BufferReader`` over the kept bytes, so pyarrow decodes it without calling back into Python.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile

from sqe.credentials.signed_reads import SignedObject, signed_object
from sqe.execution.byte_cache import DATA_RANGES, MANIFESTS, FileKey, gapless_end, vended_credentials
from sqe.planning.avro_limits import MAX_MANIFEST_BYTES, BoundedManifestFile, ManifestBounds, read_bounded

if TYPE_CHECKING:
    import pyarrow.dataset as ds

__all__ = ["MetadataCachingFileIO", "cached_file_key", "caching_filesystem", "prefetched", "stopping_prefetches"]


class _RangeSource(Protocol):
    """What a miss reads from: a pyarrow file, or a signed reader of the object (same call, no HEAD)."""

    def read_at(self, nbytes: int, offset: int) -> bytes: ...

    def close(self) -> None: ...


# ------------------------------------------------------------------------------------------ data ranges


CACHED_RANGE_FS = "sqe-cached-range"  # the type name of the file systems caching_filesystem returns

# Data files up to this size are fetched whole on their first miss and kept as one range. A scan of a small file
# reads most of it anyway (footer, column chunks), and per-request and per-read costs dominate its time.
WHOLE_FILE_BYTES = 8 << 20
_WHOLE_FILE_SHARE = 16  # ... and only while such a file is at most this fraction of the cache's bound


def kept_whole(size: int) -> bool:
    """Whether a data file of this size is kept whole, so that once cached it opens as an in-memory buffer."""
    return 0 < size <= min(WHOLE_FILE_BYTES, DATA_RANGES.max_bytes // _WHOLE_FILE_SHARE)


class _Upstream:
    """The data file under its own credential set, for misses: a signed reader when there is one (each miss one
    ranged GET, no HEAD), else the file on its pyarrow file system, opened on the first miss only.

    pyarrow's Python API opens a file by path alone, so each open costs the object store one HEAD. An
    object-store handle holds no descriptor and its ranged reads are thread-safe, so it is opened once and
    shared by every reader of the kept fragment (one HEAD per file and credential set while the fragment is
    kept); a local file is opened per reader and closed with it."""

    def __init__(self, fragment: ds.ParquetFileFragment, direct: SignedObject | None = None) -> None:
        self._fragment = fragment
        self._direct = direct
        self._shared = fragment.filesystem.type_name == "s3"
        self._lock = threading.Lock()
        self._native: pa.NativeFile | None = None

    def open(self) -> tuple[_RangeSource, bool]:
        """A handle to read from, and whether the caller owns (and so closes) it."""
        if self._direct is not None:
            return self._direct, False
        if not self._shared:
            return self._fragment.open(), True
        with self._lock:
            if self._native is None:
                self._native = self._fragment.open()
            return self._native, False


class _RangeReader(io.RawIOBase):
    """A seekable read-only file of known size; each read is served from the range cache or the object store.

    ``pa.PythonFile`` serialises seek+read pairs, so the position needs no lock of its own. A fully cached read
    opens nothing."""

    def __init__(self, key: FileKey, upstream: _Upstream) -> None:
        super().__init__()
        self._key = key
        self._size = key[1]
        self._upstream = upstream
        self._native: _RangeSource | None = None
        self._owned = False
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def read(self, size: int = -1) -> memoryview:  # type: ignore[override]
        length = self._size - self._position if size is None or size < 0 else size
        length = max(0, min(length, self._size - self._position))
        data = self._range(self._position, length)
        self._position += len(data)
        return data

    def _range(self, offset: int, length: int) -> memoryview:
        if length == 0:
            return memoryview(b"")
        kept = DATA_RANGES.covering(self._key, offset, length)
        if kept is not None:
            return kept
        # With no prefetch running in the process and no prefetched parts kept a miss adds only these two unlocked
        # checks. A prefetch's parts in flight are waited for, and a merged read holding this one is fetched now
        # if no reader has yet (a failed part raises here); parts kept, by this scan's prefetch or an earlier
        # one's, are joined (a repeat scan sends no GET).
        if _PREFETCHES.any_running() and _PREFETCHES.awaited(self._key, offset, length):
            kept = None if DATA_RANGES.parted(self._key) else DATA_RANGES.covering(self._key, offset, length)
            if kept is not None:
                return kept  # within a merged read, kept whole
        if DATA_RANGES.parted(self._key):
            joined = DATA_RANGES.assembled(self._key, offset, length)
            if joined is not None:
                return memoryview(joined)
        if self._native is None:
            self._native, self._owned = self._upstream.open()
        if kept_whole(self._size):
            # A small file is fetched and kept whole on its first miss (the footer's): one GET instead of one
            # per range, and later opens are served natively from memory (see _RangeFileHandler).
            data = self._native.read_at(self._size, 0)
            DATA_RANGES.put_range(self._key, 0, data)
            return memoryview(data)[offset : offset + length]
        data = self._native.read_at(length, offset)
        DATA_RANGES.put_range(self._key, offset, data)
        return memoryview(data)

    def close(self) -> None:
        if self._native is not None and self._owned:
            self._native.close()
        self._native = None
        super().close()

    def __reduce__(self) -> NoReturn:
        raise TypeError("a cached-range reader reads with vended credentials and cannot be pickled")


class _RangeFileHandler(pafs.FileSystemHandler):  # type: ignore[misc]  # pyarrow ships no stubs for it
    """A one-file pyarrow file system: ``open_input_file`` of that file reads through the range cache."""

    def __init__(
        self, key: FileKey, path: str, upstream: ds.ParquetFileFragment, direct: SignedObject | None = None
    ) -> None:
        self._key = key
        self._path = path
        self._upstream = _Upstream(upstream, direct)
        self._direct = direct

    @property
    def key(self) -> FileKey:
        return self._key

    @property
    def direct(self) -> SignedObject | None:
        """The signed reader misses go through, if any (prefetches read with the very same one)."""
        return self._direct

    def open_input_file(self, path: str) -> pa.NativeFile:
        """A file kept whole is served as a native buffer: pyarrow decodes it without calling into Python (no
        GIL per read, so files decode in parallel); otherwise each read goes through :class:`_RangeReader`."""
        self._only_mine(path)
        whole = DATA_RANGES.covering(self._key, 0, self._key[1]) if kept_whole(self._key[1]) else None
        if whole is not None:
            return pa.BufferReader(pa.py_buffer(whole))  # zero-copy over the kept bytes
        return pa.PythonFile(_RangeReader(self._key, self._upstream), mode="r")

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        for path in paths:
            self._only_mine(path)
        return [pafs.FileInfo(path, pafs.FileType.File, size=self._key[1]) for path in paths]

    def get_type_name(self) -> str:
        return CACHED_RANGE_FS

    def normalize_path(self, path: str) -> str:
        return path

    def _only_mine(self, path: str) -> None:
        if path != self._path:
            raise FileNotFoundError("this file system serves one data file only")

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def __hash__(self) -> int:
        return id(self)

    def __reduce__(self) -> NoReturn:
        raise TypeError("a cached-range file system reads with vended credentials and cannot be pickled")

    # Everything else a file system can do is refused: this one only reads one immutable file.
    def _refuse(self, *_: Any) -> NoReturn:
        raise OSError("the cached-range file system is read-only and serves one file")

    get_file_info_selector = create_dir = delete_dir = delete_dir_contents = _refuse
    delete_root_dir_contents = delete_file = move = copy_file = _refuse
    open_input_stream = open_output_stream = open_append_stream = _refuse


def caching_filesystem(
    key: FileKey, path: str, upstream: ds.ParquetFileFragment, direct: SignedObject | None = None
) -> pafs.PyFileSystem:
    """A file system serving ``path`` (pyarrow's scheme-less form) through the range cache under ``key``;
    misses read through ``direct`` (signed ranged GETs of the same file under the same credential set) when
    given, else through ``upstream``, a fragment of the same file on the object store's own file system."""
    return pafs.PyFileSystem(_RangeFileHandler(key, path, upstream, direct))


def cached_file_key(fragment: ds.ParquetFileFragment) -> FileKey | None:
    """The range-cache key (path, size, credential identity) a fragment reads under, or None when it does not
    read through the range cache. Such a fragment exists only for a file read with a credential set the catalog
    vended in the current query, so the key may also authorize lookups of what was decoded from those bytes."""
    filesystem = fragment.filesystem
    handler = filesystem.handler if isinstance(filesystem, pafs.PyFileSystem) else None
    return handler.key if isinstance(handler, _RangeFileHandler) else None


# ----------------------------------------------------------------------------------------------- prefetch

# pyarrow reads a file through the one Python file above, which serialises reads: a scan of a large file sends
# its ranged GETs one after another. A prefetch sends them in parallel before pyarrow asks, in parts of at most
# PREFETCH_PART_BYTES, through the same signed reader and into the same cache entries (so under the same
# credential set and scope key). A read of pyarrow's that parts in flight cover waits for them and is assembled
# from the kept parts; one they do not cover is a miss as without a prefetch.
# Measured (bench/prefetch.py): 4 MiB parts cost a store that reads the whole object per ranged GET (moto) far
# more requests than they save; parts of 16 MiB leave most reads whole (the same GETs as without a prefetch).
PREFETCH_PART_BYTES = 16 << 20
PREFETCH_THREADS = 8  # at most this many prefetch GETs in flight in the process (so at most 8 parts' bytes)
PREFETCH_FILE_BYTES = 64 << 20  # a file's prefetch covers at most this many bytes of its reads
# Prefetched parts not yet read by their scan are at most this fraction of the range cache's bound in all, so one
# scan's parts do not evict another's before they are read.
_PREFETCH_CACHE_SHARE = 2
# pyarrow's read coalescing (its default cache options): column chunks less than this apart are read as one ...
_HOLE_BYTES = 8 << 10
_COALESCED_BYTES = 32 << 20  # ... up to this size
# Merged reads (see prefetched): a scan's reads at most this far apart are fetched as one GET.
MERGE_HOLE_BYTES = 1 << 20  # a GET's first byte costs what ~1 MiB of transfer does (20-50 ms at 50-100 MB/s)
# Without the prefetch, a read joins the one before it only while it and the gap before it are at most this many
# bytes together. The scanner reads four row groups at once, each on its own connection, while a merged read is
# one connection's transfer: joining saves a first byte (20-50 ms) but moves the read's and the gap's bytes onto
# that one connection. It pays while those take at most about a quarter of a first byte to transfer (0.5 MB at
# 100 MB/s and 20 ms); measured behind a 20 ms / 100 MB/s relay, joining reads of 1.3 MB ran 2x slower.
MERGE_SMALL_BYTES = 512 << 10
_MERGED_PART_SHARE = 16  # a merged read is at most this fraction of the range cache's bound
_Range = tuple[int, int]  # offset, length
_Merged = tuple[int, int, int]  # offset, length, how many of pyarrow's reads it joins
_T = TypeVar("_T")


def _leaf_indices(schema: pa.Schema, names: set[str]) -> set[int]:
    """The Parquet leaf columns of the named top-level fields (a nested field has several)."""

    def leaves(data_type: pa.DataType) -> int:
        if pa.types.is_struct(data_type):
            return sum(leaves(data_type.field(i).type) for i in range(data_type.num_fields))
        if pa.types.is_map(data_type):
            return leaves(data_type.key_type) + leaves(data_type.item_type)
        if pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type):
            return leaves(data_type.value_type)
        return 1

    indices: set[int] = set()
    position = 0
    for field in schema:
        count = leaves(field.type)
        if field.name in names:
            indices.update(range(position, position + count))
        position += count
    return indices


def coalesced_reads(metadata: Any, row_groups: list[int], leaves: set[int], file_size: int) -> list[_Range]:
    """The byte ranges pyarrow's pre-buffering reads for these row groups' column chunks, in file order: each
    chunk's range (its dictionary page on), chunks of one row group close together read as one, as pyarrow
    coalesces them (it pre-buffers each row group on its own, so two groups' chunks are never one read)."""
    reads: list[_Range] = []
    for index in row_groups:
        chunks = _chunk_ranges(metadata.row_group(index), leaves, file_size)
        joined = _joined(chunks, _COALESCED_BYTES, lambda gap, _length: gap <= _HOLE_BYTES)
        reads.extend((offset, length) for offset, length, _ in joined)
    return sorted(reads)


def merged_reads(
    metadata: Any, row_groups: list[int], leaves: set[int], file_size: int, part_bytes: int, *, eager: bool
) -> list[_Merged]:
    """pyarrow's reads of these row groups' chunks (:func:`coalesced_reads`), consecutive ones at most
    :data:`MERGE_HOLE_BYTES` apart joined into one read of at most ``part_bytes`` (one GET, the gap's bytes
    read too): each as (offset, length, how many of pyarrow's reads it joins). A read larger than ``part_bytes``
    is joined with none. Without ``eager`` (the prefetch off) a read joins only while it and its gap are at most
    :data:`MERGE_SMALL_BYTES` together."""

    def joins(gap: int, length: int) -> bool:
        return gap <= MERGE_HOLE_BYTES and (eager or gap + length <= MERGE_SMALL_BYTES)

    return _joined(coalesced_reads(metadata, row_groups, leaves, file_size), part_bytes, joins)


def merged_part_bytes() -> int:
    """The largest read :func:`merged_reads` joins: a prefetch part, and at most a 1/16 of the range cache (so a
    merged read is kept, and the reads pyarrow's I/O threads (8) serve from parts at once hold at most half)."""
    return max(1, min(PREFETCH_PART_BYTES, _COALESCED_BYTES, DATA_RANGES.max_bytes // _MERGED_PART_SHARE))


def _chunk_ranges(group: Any, leaves: set[int], file_size: int) -> list[_Range]:
    """The byte range of each of a row group's column chunks of these leaves (its dictionary page on), within the
    file: a chunk a corrupt footer places before its start is left out (pyarrow refuses it, reading nothing; planned,
    it would send a GET of a range that is no range and pull the next groups' reads into it)."""
    chunks: list[_Range] = []
    for leaf in sorted(leaves):
        column = group.column(leaf)
        start = column.data_page_offset
        dictionary = column.dictionary_page_offset
        if column.has_dictionary_page and dictionary and 0 < dictionary < start:
            start = dictionary
        length = min(column.total_compressed_size, file_size - start)
        if start >= 0 and length > 0:
            chunks.append((start, length))
    return chunks


def _joined(ranges: list[_Range], limit: int, joins: Callable[[int, int], bool]) -> list[_Merged]:
    """Ranges in offset order, each joined to the one before it when ``joins(gap, its length)`` and the joined one
    stays at most ``limit``: as (offset, length, how many ranges it joins)."""
    joined: list[_Merged] = []
    for start, length in sorted(ranges):
        if joined:
            first, size, count = joined[-1]
            end = max(first + size, start + length)
            if joins(start - (first + size), length) and end - first <= limit:
                joined[-1] = (first, end - first, count + 1)
                continue
        joined.append((start, length, 1))
    return joined


def _parts(read: _Range) -> list[_Range]:
    """A read cut into near-equal parts of at most PREFETCH_PART_BYTES."""
    offset, length = read
    count = -(-length // PREFETCH_PART_BYTES)
    size = -(-length // count)
    return [(start, min(size, offset + length - start)) for start in range(offset, offset + length, size)]


class _Prefetch:
    """One scan's fetch of one file's reads, in parts, into the range cache. Eager parts are sent in parallel at
    once; lazy ones (merged reads) only when a read of pyarrow's needs one, by the first reader thread that does,
    while a concurrent reader of the same part waits for it (so each part is one GET)."""

    def __init__(
        self,
        key: FileKey,
        source: SignedObject,
        reads: list[_Range],
        reserved: int,
        scan_stop: threading.Event | None = None,
        lazy: Sequence[_Range] = (),
    ) -> None:
        self.key = key
        self.reserved = reserved  # the eager reads' bytes (lazy parts are fetched as read: nothing held ahead)
        self._source = source
        self._stopped = threading.Event()
        # The scan's own stop (its consumer left: cancelled, a LIMIT met), set while its reader thread may still
        # wait inside pyarrow for a read, before the scan's generators are closed.
        self._scan_stop = scan_stop
        self._reads = reads
        self._parts: list[tuple[int, int, Future[None]]] = [(offset, length, Future()) for offset, length in lazy]
        self._lazy = frozenset(future for _, _, future in self._parts)
        self._claims = threading.Lock()
        self._unclaimed = set(self._lazy)  # a reader takes a lazy part out of here to fetch it: one reader does

    def start(self, executor: Callable[[], ThreadPoolExecutor]) -> None:
        """Send the eager reads' parts (to the pool ``executor`` gives, made only when there are any)."""
        sent = [
            (offset, length, executor().submit(self._fetch, offset, length))
            for read in self._reads
            for offset, length in _parts(read)
        ]
        # One assignment: a reader may be walking the list meanwhile (an in-place sort empties it while sorting).
        self._parts = sorted(self._parts + sent, key=lambda part: part[0])

    def scan_stopped(self) -> bool:
        """Whether the scan that started this prefetch has stopped (cancelled, a LIMIT met), its generators
        perhaps not closed yet: nothing of it is sent any more."""
        return self._scan_stop is not None and self._scan_stop.is_set()

    def _fetch(self, offset: int, length: int) -> None:
        if self.scan_stopped():
            _PREFETCHES.stop(self)  # the scan is over: no part of it is sent any more, its reservation goes now
        if self._stopped.is_set():
            return
        data = self._source.read_at(length, offset)  # errors: the signed reader's OSError classes
        if not self._stopped.is_set():
            DATA_RANGES.put_range(self.key, offset, data, part=True)

    def awaited(self, offset: int, length: int) -> bool:
        """Wait for the parts overlapping these bytes, fetching lazy ones no reader has taken yet; whether there
        were any and none was cancelled. A failed part's error is raised here, in the reading scan, as its own
        read's would be. Lazy parts are fetched only for a read they hold whole (pyarrow's reads are what
        :func:`merged_reads` joined; any other read is left to its own GET)."""
        overlapping = [part for part in self._parts if part[0] < offset + length and offset < part[0] + part[1]]
        if gapless_end([(o, n) for o, n, _ in overlapping], offset, offset + length) < offset + length:
            overlapping = [part for part in overlapping if part[2] not in self._lazy]
        try:
            for part_offset, part_length, future in overlapping:
                if future in self._lazy and self._claimed(future):
                    self._fetch_lazy(part_offset, part_length, future)
                else:
                    future.result()
        except CancelledError:
            return False
        return bool(overlapping)

    def _claimed(self, future: Future[None]) -> bool:
        """Whether this reader takes a lazy part to fetch: False when another reader has (wait for it), or the
        prefetch stopped (its parts are cancelled: none is sent any more)."""
        if self.scan_stopped():
            _PREFETCHES.stop(self)
        with self._claims:
            if future not in self._unclaimed:
                return False
            self._unclaimed.discard(future)
        return future.set_running_or_notify_cancel()

    def _fetch_lazy(self, offset: int, length: int, future: Future[None]) -> None:
        """Fetch a claimed lazy part in this reader's thread and keep it, even if the scan stopped meanwhile (the
        read that claimed it is served from it); its error goes to the readers waiting for it too."""
        try:
            data = self._source.read_at(length, offset)  # errors: the signed reader's OSError classes
            DATA_RANGES.put_range(self.key, offset, data)
        except BaseException as error:
            future.set_exception(error)
            raise
        future.set_result(None)

    def stop(self) -> None:
        """Parts not yet started never start (lazy ones: no reader claims them any more); running eager ones finish
        (each bounded) and are dropped, a lazy one being fetched is kept for the read that claimed it."""
        self._stopped.set()
        for _, _, future in self._parts:
            future.cancel()


def _planned(key: FileKey, reads: list[_Merged], budget: int) -> tuple[list[_Merged], list[_Merged]]:
    """The reads a prefetch sends at once (not kept yet, in file order while they fit ``budget``), and the merged
    reads (joining two or more of pyarrow's) of the rest, fetched when a read needs one. A read of pyarrow's that
    joins none is left to be sent as pyarrow asks, as without a prefetch."""
    taken: list[_Merged] = []
    rest: list[_Merged] = []
    for read in reads:
        offset, length, _ = read
        if DATA_RANGES.holds(key, offset, length):
            continue
        if not rest and length <= budget:
            taken.append(read)
            budget -= length
        else:
            rest.append(read)  # from the first that does not fit on: read as pyarrow asks
    if len(taken) < 2 and sum(length for _, length, _ in taken) <= PREFETCH_PART_BYTES:
        taken, rest = [], taken + rest  # one small read: nothing to overlap
    return taken, [read for read in rest if read[2] > 1]


class _Prefetches:
    """The process's running prefetches, one per file key, and the bytes they have reserved."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[FileKey, _Prefetch] = {}
        self._reserved = 0
        self._executor: ThreadPoolExecutor | None = None

    def start(
        self,
        key: FileKey,
        source: SignedObject,
        reads: list[_Merged],
        scan_stop: threading.Event | None = None,
        *,
        eager: bool = True,
    ) -> _Prefetch | None:
        """A prefetch of the file's ``reads`` (:func:`merged_reads`), or None when there is nothing to do or one
        runs for the file already. ``eager``: reads are sent at once within the budget (their bytes reserved), the
        merged ones beyond it are fetched when read; else only merged reads are, all of them when read."""
        with self._lock:
            held = self._running.get(key)
            if held is not None and not held.scan_stopped():
                return None  # another scan of the same file is prefetching it: its parts serve this one too
            if held is not None:  # a stopped scan's, not yet closed: it serves nothing more, so it yields the key
                held.stop()
                self._forget(held)
            budget = min(PREFETCH_FILE_BYTES, DATA_RANGES.max_bytes // _PREFETCH_CACHE_SHARE - self._reserved)
            taken, lazy = _planned(key, reads, budget if eager else 0)
            if not taken and not lazy:
                return None
            sent = [(offset, length) for offset, length, _ in taken]
            prefetch = _Prefetch(key, source, sent, sum(n for _, n in sent), scan_stop, [(o, n) for o, n, _ in lazy])
            self._running[key] = prefetch
            self._reserved += prefetch.reserved
            prefetch.start(self._pool)
            return prefetch

    def stop(self, prefetch: _Prefetch) -> None:
        prefetch.stop()
        with self._lock:
            self._forget(prefetch)

    def _forget(self, prefetch: _Prefetch) -> None:
        """Unregister a stopped prefetch and free its reservation, once (the caller holds the lock)."""
        if self._running.get(prefetch.key) is prefetch:
            del self._running[prefetch.key]
            self._reserved -= prefetch.reserved

    def awaited(self, key: FileKey, offset: int, length: int) -> bool:
        with self._lock:
            prefetch = self._running.get(key)
        return prefetch is not None and prefetch.awaited(offset, length)

    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def any_running(self) -> bool:
        """Whether any prefetch may be running, without the lock (a dict's emptiness reads atomically): a read
        that finds none skips the lookup, so a process scanning no file whose reads merge (with the setting off)
        does no prefetch work at all."""
        return bool(self._running)

    def forget_in_forked_child(self) -> None:
        """A forked child inherits the parent's prefetches but not the threads running them (nor the owner of a
        lock one of them held at the fork): they would never finish there, so the child starts afresh, with a
        new lock, and makes threads of its own on its first prefetch."""
        self._lock = threading.Lock()
        self._running = {}
        self._reserved = 0
        self._executor = None

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="sqe-prefetch")
        return self._executor


_PREFETCHES = _Prefetches()
os.register_at_fork(after_in_child=_PREFETCHES.forget_in_forked_child)
_scan = threading.local()  # .stop: the stop event of the scan whose reader this thread is (stopping_prefetches)


@contextlib.contextmanager
def stopping_prefetches(stop: threading.Event) -> Iterator[None]:
    """Within this, prefetches this thread starts end once ``stop`` is set: a scan's reader thread passes the
    scan's stop, so a cancelled query's prefetch sends no more parts even while the thread still waits in pyarrow
    for a read (its generators, whose closing stops the prefetch too, are closed only after that read)."""
    _scan.stop = stop
    try:
        yield
    finally:
        _scan.stop = None


def prefetched(
    fragment: ds.ParquetFileFragment,
    row_groups: list[int],
    columns: Sequence[str],
    batches: Iterator[_T],
    *,
    eager: bool,
) -> Iterator[_T]:
    """``batches`` (a scan of ``fragment``), its reads of the column chunks of ``columns`` in ``row_groups`` (the
    ones the scan reads: after statistics pruning, within its projection) planned ahead: reads of pyarrow's close
    together are fetched as one (:func:`merged_reads`) when the first of them is read, and with ``eager`` (``[cache]
    prefetch``) the reads are fetched in parallel before pyarrow asks. Only for a file read range by range through
    the cache with a signed reader; the plan starts with the first batch asked for, and ending the scan
    (exhausted, closed, failed) stops what is not yet sent."""
    prefetch = _start_prefetch(fragment, row_groups, tuple(columns), eager=eager)
    try:
        yield from batches
    finally:
        if prefetch is not None:
            _PREFETCHES.stop(prefetch)


def _start_prefetch(
    fragment: ds.ParquetFileFragment, row_groups: list[int], columns: tuple[str, ...], *, eager: bool = True
) -> _Prefetch | None:
    filesystem = fragment.filesystem
    handler = filesystem.handler if isinstance(filesystem, pafs.PyFileSystem) else None
    if not row_groups or not isinstance(handler, _RangeFileHandler) or handler.direct is None:
        return None
    size = handler.key[1]
    if kept_whole(size):
        return None  # fetched whole with its footer
    leaves = _leaf_indices(fragment.physical_schema, set(columns))
    if not leaves:
        return None
    reads = merged_reads(fragment.metadata, row_groups, leaves, size, merged_part_bytes(), eager=eager)
    return _PREFETCHES.start(handler.key, handler.direct, reads, getattr(_scan, "stop", None), eager=eager)


# ---------------------------------------------------------------------------------------------- manifests


class _CachedInputFile(InputFile):
    """A manifest list or manifest, read whole once per credential scope and then served from memory. A miss is
    one signed GET when there is a signed reader (pyarrow's open adds a HEAD), else read through ``inner``."""

    def __init__(
        self, inner: InputFile, key: tuple[str, str], bounds: ManifestBounds, direct: SignedObject | None = None
    ) -> None:
        super().__init__(inner.location)
        self._inner = inner
        self._key = key
        self._bounds = bounds
        self._direct = direct

    def __len__(self) -> int:
        kept = MANIFESTS.get(self._key)
        if kept is None and self._direct is not None:
            kept = self._fetch()[0]  # it is about to be read whole anyway: one GET instead of a HEAD and a GET
        return len(kept) if kept is not None else len(self._inner)

    def exists(self) -> bool:
        return MANIFESTS.get(self._key) is not None or self._inner.exists()

    def open(self, seekable: bool = True) -> InputStream:
        kept = MANIFESTS.get(self._key)
        return io.BytesIO(kept if kept is not None else self._fetch()[1])

    def _fetch(self) -> tuple[bytes, bytes]:
        """The file's bytes, kept once checked, and the check's inflated form for this read: pyiceberg inflates
        a miss's blocks no second time (a hit's once). The kept bytes stay as stored: smaller than inflated."""
        if self._direct is not None:
            read = self._direct.read_all(limit=MAX_MANIFEST_BYTES + 1)  # one byte past the limit tells a larger file
        else:
            read = read_bounded(self._inner)
        readable = self._bounds.checked(self.location, read)  # only checked bytes are kept
        MANIFESTS.put(self._key, read)
        return read, readable


class MetadataCachingFileIO(FileIO):
    """Planning's view of a table's ScopedFileIO: reads of immutable metadata files go through the manifest
    cache, keyed by path and the path's credential scope. Writes and deletes are refused (planning only
    reads). Every file is read within the manifest limits of ``bounds`` (:mod:`sqe.planning.avro_limits`), kept
    or not. Like the FileIO it wraps, it is never pickled."""

    def __init__(self, inner: FileIO, bounds: ManifestBounds | None = None) -> None:
        super().__init__(properties={})
        self._inner = inner
        self._bounds = bounds or ManifestBounds()

    def bounded(self, bounds: ManifestBounds) -> MetadataCachingFileIO:
        """The same reads, refused in the words of ``bounds``."""
        return MetadataCachingFileIO(self._inner, bounds)

    def new_input(self, location: str) -> InputFile:
        inner = self._inner.new_input(location)  # the inner FileIO's own checks (expiry, coverage) run first
        resolved = vended_credentials(self._inner, location)  # after them: the set a refresh there put in place
        if resolved is None or not MANIFESTS.enabled:
            return BoundedManifestFile(inner, self._bounds)
        direct = signed_object(location, resolved)
        return _CachedInputFile(inner, (location, resolved.identity), self._bounds, direct)

    def new_output(self, location: str) -> OutputFile:
        raise OSError("planning reads metadata only; it never writes")

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise OSError("planning reads metadata only; it never deletes")

    def __reduce__(self) -> NoReturn:
        raise TypeError("MetadataCachingFileIO wraps a FileIO holding credentials and cannot be pickled")

    def __repr__(self) -> str:
        return f"MetadataCachingFileIO({self._inner!r})"
