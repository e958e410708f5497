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

import io
import threading
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile

from sqe.credentials.signed_reads import SignedObject, signed_object
from sqe.execution.byte_cache import DATA_RANGES, MANIFESTS, FileKey, vended_credentials
from sqe.planning.avro_limits import MAX_MANIFEST_BYTES, BoundedManifestFile, ManifestBounds, read_bounded

if TYPE_CHECKING:
    import pyarrow.dataset as ds

__all__ = ["MetadataCachingFileIO", "cached_file_key", "caching_filesystem"]


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

    @property
    def key(self) -> FileKey:
        return self._key

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
