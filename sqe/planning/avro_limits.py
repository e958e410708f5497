"""Bounded reads of a table's manifest lists and manifests, for the engine's planning and the catalog's.

pyiceberg reads such a file whole and inflates each of its blocks whole, and a writer of the table decides what
they hold: a deflate block inflates about a thousandfold, so one small file could make one plan hold gigabytes.
A file is read at most ``MAX_MANIFEST_BYTES`` far, and its blocks are inflated here, counted a chunk at a time,
before pyiceberg decodes it: past ``MAX_MANIFEST_DECOMPRESSED_BYTES`` (nothing more is inflated) it is refused.
Within it, pyiceberg decodes the blocks inflated here, stored in a container of the null codec, and inflates
none again. The engine checks a file once, when it is read from the store (its manifest cache keeps only checked
bytes, as stored; pyiceberg inflates a hit's blocks). Inside the blocks, every value pyiceberg decodes is
checked against its block's end by ``sqe.planning.avro_decoder``, and each block's records must take all of its
bytes (``sqe.planning.pyiceberg_patches``, installed here, where manifests are read). A block stating a negative
count, or none but holding bytes, or none before another block, is refused here: pyiceberg stops reading at such
a block, and would drop the records after it without error.

:class:`ManifestBounds` words the refusal and picks its error type: the engine's
:class:`sqe.errors.ManifestLimitError`, or the catalog's own 422 (``sqe_catalog.avro_limits``).
"""

from __future__ import annotations

import bz2
import copy
import hashlib
import importlib.util
import io
import json
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import zstandard
from pyiceberg import types
from pyiceberg.exceptions import ResolveError
from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile
from pyiceberg.types import (
    BinaryType,
    FixedType,
    IcebergType,
    ListType,
    MapType,
    StructType,
    UnknownType,
)
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from sqe._lru import LRUCache
from sqe.errors import ManifestLimitError
from sqe.planning import pyiceberg_patches
from sqe.planning.avro_decoder import MisstatedAvroError

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

__all__ = [
    "MAX_AVRO_SCHEMA_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_DECOMPRESSED_BYTES",
    "UNDECODABLE",
    "UNDECODED",
    "BoundedManifestFile",
    "BoundedManifestIO",
    "CommitIO",
    "Inflated",
    "MalformedAvroError",
    "ManifestBounds",
    "UnreadableCodecError",
    "UnreadableSchemaError",
    "bounded_io",
    "bounded_table",
    "inflated",
    "inflated_size",
    "read_bounded",
    "table_bounds",
]

pyiceberg_patches.install()  # before any manifest of this process is decoded: every reader of one imports this module

# Iceberg writers aim at 8 MiB manifests (commit.manifest.target-size-bytes); a manifest list holds a few hundred
# bytes per manifest. Eight and 32 times that target leave room for any table, while one plan's decoded entries
# (several times the inflated bytes as Python objects) stay within a process's memory.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_MANIFEST_DECOMPRESSED_BYTES = 256 * 1024 * 1024
# A manifest's Avro schema holds its fixed fields and its partition's: a few KiB. pyiceberg parses it whole into
# objects about twenty times its size (measured: 4.9 MB took 97 MB and 0.7 s), for each file it reads.
MAX_AVRO_SCHEMA_BYTES = 1024 * 1024

_MAGIC = b"Obj\x01"
_CODEC_KEY = b"avro.codec"
_SCHEMA_KEY = b"avro.schema"
_SYNC_SIZE = 16
_CHUNK = 1 << 20
_SNAPPY_CRC_SIZE = 4


# What pyiceberg's decoder raises, besides ValueError, for records that do not decode: EOFError for a block
# that ends early, SystemError from its compiled decoder for a negative length, and ResolveError for a header
# schema whose fields do not promote to the ones it reads (a manifest path stated as a boolean); and SQE's
# MisstatedAvroError, for a block whose records leave bytes unread, or a manifest whose entries are not those
# its manifest list counts.
UNDECODABLE: tuple[type[Exception], ...] = (EOFError, SystemError, ResolveError, MisstatedAvroError)
UNDECODED = "a manifest list or manifest of the table does not decode"


class MalformedAvroError(ValueError):
    """Not an Avro container file (or a block that does not decompress)."""


class UnreadableCodecError(MalformedAvroError):
    """An Avro container in a codec pyiceberg cannot inflate in this process."""


class UnreadableSchemaError(MalformedAvroError):
    """An Avro container whose header's schema pyiceberg cannot read safely; ``why`` says how (no writer text)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True)
class ManifestBounds:
    """How a refusal reads: ``refused`` says what it stops; a location in ``manifest_lists`` is named a manifest
    list, any other a manifest (with no lists given, either). ``error`` is the refusal's type."""

    error: ClassVar[type[Exception]] = ManifestLimitError

    refused: str = "cannot plan this scan"
    manifest_lists: frozenset[str] = frozenset()

    def kind(self, location: str) -> str:
        if not self.manifest_lists:
            return "manifest list or manifest"
        return "manifest list" if location in self.manifest_lists else "manifest"

    def checked(self, location: str, data: bytes) -> bytes:
        """``data`` (read at most ``MAX_MANIFEST_BYTES + 1`` far) once it is known to stay within the limits, as
        pyiceberg is to read it: its blocks inflated once, here (see :func:`inflated`)."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise self.refusal(location, f"holds more than {MAX_MANIFEST_BYTES} bytes (MAX_MANIFEST_BYTES)")
        try:
            checked = inflated(data, MAX_MANIFEST_DECOMPRESSED_BYTES)
        except UnreadableCodecError:
            raise self.refusal(
                location, f"is written with an Avro codec SQE cannot read (it reads {_READABLE})"
            ) from None
        except UnreadableSchemaError as exc:
            raise self.refusal(location, exc.why) from None
        except MalformedAvroError:
            raise self.refusal(location, "is not an Avro container file") from None
        if checked.size > MAX_MANIFEST_DECOMPRESSED_BYTES:
            limit = MAX_MANIFEST_DECOMPRESSED_BYTES
            raise self.refusal(location, f"inflates to more than {limit} bytes (MAX_MANIFEST_DECOMPRESSED_BYTES)")
        return checked.readable

    def refusal(self, location: str, what: str) -> Exception:
        """The error for a file past a limit; the message names no path (a writer's text)."""
        return self.error(f"{self.refused}: a {self.kind(location)} of the table {what}")


def read_bounded(inner: InputFile) -> bytes:
    """At most ``MAX_MANIFEST_BYTES + 1`` bytes of ``inner``: one byte past the limit tells a larger file. Read a
    chunk at a time: pyarrow allocates what one read asks for, whatever the file holds."""
    chunks: list[bytes] = []
    left = MAX_MANIFEST_BYTES + 1
    with inner.open(seekable=False) as stream:
        while left > 0 and (chunk := stream.read(min(left, _CHUNK))):
            chunks.append(chunk)
            left -= len(chunk)
    return b"".join(chunks)


class BoundedManifestFile(InputFile):
    """``inner``, opened as its bytes once they are known to stay within the limits."""

    def __init__(self, inner: InputFile, bounds: ManifestBounds) -> None:
        super().__init__(inner.location)
        self._inner, self._bounds = inner, bounds

    def __len__(self) -> int:
        return len(self._inner)

    def exists(self) -> bool:
        return self._inner.exists()

    def open(self, seekable: bool = True) -> InputStream:
        return io.BytesIO(self._bounds.checked(self.location, read_bounded(self._inner)))


class BoundedManifestIO(FileIO):
    """``io`` for reading a table's manifest lists and manifests only, each as a ``BoundedManifestFile``."""

    def __init__(self, io: FileIO, bounds: ManifestBounds) -> None:
        super().__init__(io.properties)
        self._io, self._bounds = io, bounds

    def new_input(self, location: str) -> InputFile:
        return BoundedManifestFile(self._io.new_input(location), self._bounds)

    def new_output(self, location: str) -> OutputFile:
        raise NotImplementedError("reading manifests never writes")

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise NotImplementedError("reading manifests never deletes")


def bounded_io(io: FileIO, bounds: ManifestBounds) -> FileIO:
    """``io`` reading within the limits: its own ``bounded(bounds)`` when it has one (a manifest cache checks a
    file once, before keeping it), else wrapped in a :class:`BoundedManifestIO`."""
    bounded = getattr(io, "bounded", None)
    return bounded(bounds) if callable(bounded) else BoundedManifestIO(io, bounds)


class CommitIO(FileIO):
    """``io`` for pyiceberg's commit path, which reads the previous manifest list and manifests and writes the new
    ones through one FileIO: each read is a manifest list or manifest, within the limits; writes and deletes go to
    ``io`` itself."""

    def __init__(self, io: FileIO, bounds: ManifestBounds) -> None:
        super().__init__(io.properties)
        self._io, self._reads = io, bounded_io(io, bounds)

    def rebind(self, io: FileIO, bounds: ManifestBounds) -> None:
        """Go through ``io`` within ``bounds`` from now on (a refreshed table's): pyiceberg's snapshot producers
        keep the FileIO they were built with when they commit again after a conflict."""
        self.properties = io.properties
        self._io, self._reads = io, bounded_io(io, bounds)

    def new_input(self, location: str) -> InputFile:
        return self._reads.new_input(location)

    def new_output(self, location: str) -> OutputFile:
        return self._io.new_output(location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        self._io.delete(location)


def table_bounds(refused: str, metadata: TableMetadata) -> ManifestBounds:
    """A refusal saying ``refused``, naming each of ``metadata``'s snapshots' manifest lists by its kind."""
    return ManifestBounds(refused, frozenset(snapshot.manifest_list for snapshot in metadata.snapshots))


def bounded_table(table: Table, refused: str) -> Table:
    """``table`` (a shallow copy: the same metadata, another FileIO) reading its manifest lists and manifests
    within the limits; a refusal says ``refused``."""
    bounded = copy.copy(table)
    bounded.io = bounded_io(table.io, table_bounds(refused, table.metadata))
    return bounded


def inflated_size(data: bytes, budget: int) -> int:
    """The bytes the Avro container ``data``'s blocks hold once decompressed; past ``budget``, some count past it
    (nothing more is inflated). A codec pyiceberg cannot inflate here is :class:`UnreadableCodecError`."""
    return inflated(data, budget).size


@dataclass(frozen=True)
class Inflated:
    """An Avro container's inflated size, and the container as pyiceberg is to read it (``readable``)."""

    size: int
    readable: bytes


def inflated(data: bytes, budget: int) -> Inflated:
    """The Avro container ``data`` with each of its blocks inflated once, here: ``readable`` is the same container
    with those blocks stored inflated (codec null), so that pyiceberg decodes them without inflating them again;
    it is ``data`` itself for blocks pyiceberg inflates (snappy's, sized by the length they state) or never
    has to (null). Past ``budget``, ``size`` is some count past it, nothing more is inflated, and ``readable`` is
    not to be read. A codec pyiceberg cannot inflate here is :class:`UnreadableCodecError`, a schema it cannot
    read safely :class:`UnreadableSchemaError`."""
    meta, sync, pos = _header(data)
    _check_schema(meta.get(_SCHEMA_KEY))
    codec = meta.get(_CODEC_KEY, b"null")
    sized = _SIZED.get(codec)
    if sized is not None:
        total = 0
        for count, _records, block, _sync in _blocks(data, pos):
            size = sized(block)
            _check_count(count, size)
            total += size
            if total > budget:
                break
        return Inflated(total, data)
    inflate = _INFLATERS.get(codec)
    if inflate is None:  # pyiceberg would fail untyped: a ValueError, or snappy's ImportError
        raise UnreadableCodecError
    out = io.BytesIO(_null_codec_header(meta, sync))  # written a block at a time: one copy of what it inflates
    out.seek(0, io.SEEK_END)
    total = 0
    for count, records, block, block_sync in _blocks(data, pos):
        chunks = inflate(block, budget - total)
        size = sum(len(chunk) for chunk in chunks)
        total += size
        if total > budget:
            return Inflated(total, b"")
        _check_count(count, size)
        # the count and sync marker as written: pyiceberg acts on the count and compares the marker with the header's
        out.writelines([records, _encoded_long(size), *chunks, block_sync])
    return Inflated(total, out.getvalue())


# The header's schema drives pyiceberg's decoding, and a writer chooses it. Files of one table share a few schema
# texts: each text's verdict is kept, by digest (a header may be as large as the file).
_SCHEMA_VERDICTS: LRUCache[bytes, str] = LRUCache(64)
_SCHEMA_OK = ""
_NOT_ICEBERG = "states an Avro schema that is not an Iceberg schema"
_EMPTY_ITEMS = "states records, or list or map items, that take no bytes (a stated count of them is read without end)"
_INT_KEYED_MAP = (
    "states a map of integer keys to values other than required integers or bytes (pyiceberg cannot read it)"
)
# Types pyiceberg reads with an IntegerReader: a map keyed by one reads its values as integers or bytes only.
_INTEGER_TYPES: tuple[type[IcebergType], ...] = (types.IntegerType, types.LongType, types.DateType, types.TimeType)
_INTEGER_TYPES += (types.TimestampType, types.TimestamptzType, types.TimestampNanoType, types.TimestamptzNanoType)


def _check_schema(text: bytes | None) -> None:
    """Refuse a header schema pyiceberg cannot read, or reads into an endless loop: records, or a list or map of
    items, that take no bytes (null, fixed(0), records of only those) are read as many as the writer states, each
    from nothing. No Iceberg manifest list or manifest has them. (A file without a schema fails in pyiceberg,
    typed.)"""
    if text is None:
        return
    if len(text) > MAX_AVRO_SCHEMA_BYTES:
        raise UnreadableSchemaError(
            f"states an Avro schema of more than {MAX_AVRO_SCHEMA_BYTES} bytes (MAX_AVRO_SCHEMA_BYTES)"
        )
    key = hashlib.blake2b(text, digest_size=16).digest()
    verdict = _SCHEMA_VERDICTS.get(key)
    if verdict is None:
        verdict = _schema_verdict(text)
        _SCHEMA_VERDICTS.put(key, verdict)
    if verdict:
        raise UnreadableSchemaError(verdict)


def _schema_verdict(text: bytes) -> str:
    """Why pyiceberg cannot read a container of the schema ``text`` safely, or ``_SCHEMA_OK``."""
    try:  # as pyiceberg converts it: UTF-8 JSON; any failure there (KeyError, TypeError, ...) is the writer's
        schema = AvroSchemaConversion().avro_to_iceberg(json.loads(text.decode("utf-8")))
    except Exception:
        return _NOT_ICEBERG
    if _takes_no_bytes(schema.as_struct()):  # a block states how many records it holds
        return _EMPTY_ITEMS
    pending: list[IcebergType] = [schema.as_struct()]
    while pending:
        kind = pending.pop()
        if isinstance(kind, StructType):
            pending.extend(field.field_type for field in kind.fields)
        elif isinstance(kind, ListType):
            if kind.element_required and _takes_no_bytes(kind.element_type):
                return _EMPTY_ITEMS
            pending.append(kind.element_type)
        elif isinstance(kind, MapType):
            value_empty = kind.value_required and _takes_no_bytes(kind.value_type)
            if _takes_no_bytes(kind.key_type) and value_empty:
                return _EMPTY_ITEMS
            if isinstance(kind.key_type, _INTEGER_TYPES) and not (
                kind.value_required and isinstance(kind.value_type, (*_INTEGER_TYPES, BinaryType))
            ):
                return _INT_KEYED_MAP
            pending.extend([kind.key_type, kind.value_type])
    return _SCHEMA_OK


def _takes_no_bytes(kind: IcebergType) -> bool:
    """Whether a value of ``kind`` may be encoded in no bytes at all (an optional one takes its union index)."""
    if isinstance(kind, StructType):
        return all(field.required and _takes_no_bytes(field.field_type) for field in kind.fields)
    return isinstance(kind, UnknownType) or (isinstance(kind, FixedType) and len(kind) == 0)


def _null_codec_header(meta: dict[bytes, bytes], sync: bytes) -> bytes:
    """The header of a container holding ``meta`` but for its codec, null."""
    meta = {**meta, _CODEC_KEY: b"null"}
    entries = (_encoded_long(len(part)) + part for entry in meta.items() for part in entry)
    return b"".join([_MAGIC, _encoded_long(len(meta)), *entries, _encoded_long(0), sync])


def _encoded_long(value: int) -> bytes:
    """``value`` as an Avro long: zigzag, then a little-endian base-128 varint."""
    encoded, out = (value << 1) ^ (value >> 63), bytearray()
    while encoded > 0x7F:
        out.append(encoded & 0x7F | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def _check_count(count: int, inflated_size: int) -> None:
    """Refuse a block pyiceberg would read as the container's end (it stops at a count below one), unless it
    is one: no bytes of records. A block of no records is the last (see :func:`_blocks`)."""
    if count < 0 or (count == 0 and inflated_size > 0):
        raise MalformedAvroError


def _blocks(data: bytes, pos: int) -> Iterator[tuple[int, bytes, bytes, bytes]]:
    """Each block of the container ``data`` from ``pos`` on: its record count, as read and as encoded, its bytes
    and the sync marker after it. Every length is checked against ``data`` here: pyiceberg's decoder reads past
    its buffer's end. A block stating no records must be the last: pyiceberg stops reading there."""
    while pos < len(data):
        start = pos
        count, pos = _long(data, pos)
        records = data[start:pos]
        size, pos = _long(data, pos)
        if size < 0 or pos + size + _SYNC_SIZE > len(data):
            raise MalformedAvroError
        end = pos + size
        if count <= 0 and end + _SYNC_SIZE < len(data):
            raise MalformedAvroError
        yield count, records, data[pos:end], data[end : end + _SYNC_SIZE]
        pos = end + _SYNC_SIZE


def _long(data: bytes, pos: int) -> tuple[int, int]:
    """An Avro (zigzag varint) long at ``pos``, and the position after it."""
    value, pos = _varint(data, pos)
    return (value >> 1) ^ -(value & 1), pos


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise MalformedAvroError
        byte = data[pos]
        value, pos, shift = value | (byte & 0x7F) << shift, pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _header(data: bytes) -> tuple[dict[bytes, bytes], bytes, int]:
    """The header's metadata, its sync marker and the position of the first block. Walked here, each length
    checked against ``data``: pyiceberg's header reader reads past its buffer's end (and allocates any length a
    file states) before it fails."""
    if not data.startswith(_MAGIC):
        raise MalformedAvroError
    meta: dict[bytes, bytes] = {}
    pos = len(_MAGIC)
    while True:
        count, pos = _long(data, pos)
        if count == 0:
            break
        if count < 0:  # a block with its size in bytes
            count = -count
            _size, pos = _long(data, pos)
        for _ in range(count):
            key, pos = _bytes(data, pos)
            meta[key], pos = _bytes(data, pos)
    if pos + _SYNC_SIZE > len(data):
        raise MalformedAvroError
    return meta, data[pos : pos + _SYNC_SIZE], pos + _SYNC_SIZE


def _bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    size, pos = _long(data, pos)
    if size < 0 or pos + size > len(data):
        raise MalformedAvroError
    return data[pos : pos + size], pos + size


def _inflated_by(feed: Callable[[bytes, int], bytes], block: bytes, budget: int) -> list[bytes]:
    """What a streaming decompressor (``feed(input, max_length)``) yields for ``block``, a chunk at a time, until
    it yields nothing or past ``budget``."""
    chunks, total, pending = [], 0, block
    while total <= budget:
        out = feed(pending, _CHUNK)
        pending = b""
        if not out:
            break
        chunks.append(out)
        total += len(out)
    return chunks


def _within(chunks: list[bytes], budget: int) -> bool:
    return sum(len(chunk) for chunk in chunks) <= budget


def _deflated(block: bytes, budget: int) -> list[bytes]:
    decompressor = zlib.decompressobj(-15)  # Avro's deflate: raw, no zlib header

    def feed(data: bytes, limit: int) -> bytes:
        try:
            return decompressor.decompress(decompressor.unconsumed_tail + data, limit)
        except zlib.error:
            raise MalformedAvroError from None

    chunks = _inflated_by(feed, block, budget)
    if not decompressor.eof and _within(chunks, budget):  # cut short: pyiceberg's codec raised zlib.error
        raise MalformedAvroError
    return chunks


def _bzip2(block: bytes, budget: int) -> list[bytes]:
    """Every stream in the block, as pyiceberg's codec (``bz2.decompress``) inflates them all; bytes after the
    first stream that start no stream are ignored there too, and a stream cut short is an error."""
    chunks, pending = _bzip2_stream(block, budget)
    while pending and _within(chunks, budget):
        try:
            more, pending = _bzip2_stream(pending, budget - sum(len(chunk) for chunk in chunks))
        except _NotAStream:
            break
        chunks += more
    return chunks


class _NotAStream(MalformedAvroError):
    """Bytes that start no bzip2 stream."""


def _bzip2_stream(data: bytes, budget: int) -> tuple[list[bytes], bytes]:
    """What one stream at the start of ``data`` inflates to (up to past ``budget``) and the bytes after it."""
    decompressor = bz2.BZ2Decompressor()

    def feed(chunk: bytes, limit: int) -> bytes:
        if decompressor.eof:
            return b""
        try:
            return decompressor.decompress(chunk, limit)
        except (OSError, EOFError):
            raise _NotAStream from None

    chunks = _inflated_by(feed, data, budget)
    if not _within(chunks, budget):
        return chunks, b""
    if not decompressor.eof:  # cut short: pyiceberg's codec raised ValueError
        raise MalformedAvroError
    return chunks, decompressor.unused_data


def _zstandard(block: bytes, budget: int) -> list[bytes]:
    """The block's first frame, read as pyiceberg's codec reads it (``stream_reader``, until it yields nothing)."""
    chunks: list[bytes] = []
    try:
        with _zstd_decompressor().stream_reader(io.BytesIO(block)) as reader:
            while _within(chunks, budget) and (chunk := reader.read(_CHUNK)):
                chunks.append(chunk)
    except zstandard.ZstdError:
        raise MalformedAvroError from None
    return chunks


_THREAD = threading.local()


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor, reused: building one costs more than inflating a small block, and one is not
    to be used by two threads at once (each read resets it)."""
    decompressor: zstandard.ZstdDecompressor | None = getattr(_THREAD, "zstd", None)
    if decompressor is None:
        decompressor = _THREAD.zstd = zstandard.ZstdDecompressor()
    return decompressor


def _snappy(block: bytes) -> int:
    """Snappy states the inflated length up front (an unsigned varint), and Avro adds a CRC-32 after the data."""
    length, _pos = _varint(block[:-_SNAPPY_CRC_SIZE], 0)
    return length


# Codecs whose blocks are inflated here, each chunk counted against the budget as it comes.
_INFLATERS: dict[bytes, Callable[[bytes, int], list[bytes]]] = {
    b"deflate": _deflated,
    b"bzip2": _bzip2,
    b"zstandard": _zstandard,
}
# Codecs whose blocks are sized without inflating them: pyiceberg reads such a file as it is.
_SIZED: dict[bytes, Callable[[bytes], int]] = {b"null": len}
if importlib.util.find_spec("snappy") is not None:  # pyiceberg's snappy codec needs python-snappy
    _SIZED[b"snappy"] = _snappy
_READABLE = ", ".join(codec.decode() for codec in dict.fromkeys([b"null", *_INFLATERS, *_SIZED]))
