"""Bounds on the position delete files a scan reads whole (pyiceberg reads each into one Arrow table).

A writer of the table decides what a delete file holds: positions repeat and run-length encode, so a file of a
few KiB can hold hundreds of millions of rows, and every reader of the table would decode them all. Before a
Parquet delete file is read, its footer's row count and its row groups' stated uncompressed size are checked;
past ``MAX_POSITION_DELETE_ROWS`` or ``MAX_POSITION_DELETE_BYTES`` the scan fails with
:class:`sqe.errors.DeleteFileLimitError`. An ORC delete file is checked the same way, by its footer's (and its
stripes') row count and the size its values decode to, as its column statistics state it
(``sqe.execution.orc_footer``): pyiceberg decodes its paths one string a row.

A deletion vector (format v3) is a roaring bitmap in a Puffin file, which pyiceberg reads whole and expands into
one position a row (and one empty bitmap for every unused high key below the last): a bitmap of a few KiB names
2^32 positions. The file is read at most ``MAX_DELETION_VECTOR_BYTES`` far and its bitmaps deserialized (run
containers stay runs) before that: a vector naming a position past its data file's ``record_count`` deletes rows
that file does not hold, and is refused; so is one past ``MAX_DELETED_POSITION`` or a file holding more than
``MAX_POSITION_DELETE_ROWS`` positions in all. A blob is held to what its delete-file entry in the manifest
states (:class:`VectorEntry`: ``content_offset``, ``content_size_in_bytes``, and ``record_count``, a vector's
cardinality): a blob elsewhere, of another size or naming another count of positions is refused. A blob naming a
data file the scan does not read (pruned by planning) is neither deserialized nor expanded: the bytes handed on
are a Puffin file of the blobs the scan reads only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from io import BytesIO
from typing import TYPE_CHECKING

import pyarrow.orc as orc
import pyarrow.parquet as pq
import zstandard
from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile
from pyiceberg.manifest import DATA_FILE_TYPE, FileFormat
from pyiceberg.table.puffin import Footer, PuffinBlobMetadata
from pyroaring import BitMap

from sqe.errors import DeleteFileLimitError
from sqe.execution import orc_footer

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask

__all__ = [
    "MAX_DELETED_POSITION",
    "MAX_DELETION_VECTOR_BYTES",
    "MAX_POSITION_DELETE_BYTES",
    "MAX_POSITION_DELETE_ROWS",
    "MAX_PUFFIN_FOOTER_BYTES",
    "VectorEntry",
    "check_position_deletes",
    "check_task_deletes",
    "record_counts",
    "task_vector_entries",
    "vector_entries",
]

# 32 Mi deleted positions (a quarter GiB as Arrow arrays): far more than one data file's rows at Iceberg's
# 512 MiB target file size, so only a file no writer needs is refused.
MAX_POSITION_DELETE_ROWS = 1 << 25
MAX_POSITION_DELETE_BYTES = 1 << 30  # the row groups' stated uncompressed size: long paths, not many rows
# A Puffin file may hold the vectors of many data files; a bitmap takes at most about 2 bytes a position.
MAX_DELETION_VECTOR_BYTES = 1 << 28
# A position's high 32 bits are the bitmap's key, and pyiceberg lists a bitmap for every key up to the last:
# 2^40 rows is far past any data file, and 256 keys cost nothing.
MAX_DELETED_POSITION = (1 << 40) - 1
# A footer's JSON is parsed whole into objects about ten times its size; a blob's entry takes about 200 bytes,
# so 16 MiB lists some 80,000 data files' vectors.
MAX_PUFFIN_FOOTER_BYTES = 1 << 24

_PUFFIN_MAGIC = b"PFA1"
_VECTOR_MAGIC = b"\xd1\xd3\x39\x64"
_FOOTER_TAIL = 12  # payload size (4), flags (4), magic (4)
_V3_DV_FIELDS = ("referenced_data_file", "content_offset", "content_size_in_bytes")


def record_counts(tasks: Iterable[FileScanTask]) -> dict[str, int]:
    """Each data file of ``tasks`` and its stated row count: a deletion vector names no row past it."""
    return {task.file.file_path: task.file.record_count for task in tasks}


@dataclass(frozen=True)
class VectorEntry:
    """What a deletion vector's delete-file entry (format v3) states about its blob: where it lies in the Puffin
    file, its size, and its cardinality (the entry's ``record_count``)."""

    offset: int
    size: int
    positions: int


# pyiceberg 0.12 has no accessors for a v3 DataFile's fields past the v2 ones: they are read by position.
_V3_FIELDS = tuple(field.name for field in DATA_FILE_TYPE[3].fields)
_REFERENCED, _OFFSET, _SIZE = (_V3_FIELDS.index(name) for name in _V3_DV_FIELDS)


def vector_entries(delete_files: Iterable[DataFile]) -> dict[str, dict[str, VectorEntry]]:
    """The deletion vectors' entries among ``delete_files``: by Puffin file, then by the data file each names.
    Entries read without the v3 fields (or not stating them) give none."""
    entries: dict[str, dict[str, VectorEntry]] = {}
    for delete_file in delete_files:
        if delete_file.file_format != FileFormat.PUFFIN or len(delete_file) != len(_V3_FIELDS):
            continue
        referenced, offset, size = delete_file[_REFERENCED], delete_file[_OFFSET], delete_file[_SIZE]
        if isinstance(referenced, str) and isinstance(offset, int) and isinstance(size, int):
            vector = VectorEntry(offset, size, delete_file.record_count)
            entries.setdefault(delete_file.file_path, {})[referenced] = vector
    return entries


def task_vector_entries(tasks: Iterable[FileScanTask]) -> dict[str, dict[str, VectorEntry]]:
    """:func:`vector_entries` of every delete file of ``tasks``."""
    return vector_entries(delete_file for task in tasks for delete_file in task.delete_files)


def check_position_deletes(
    io: FileIO,
    delete_file: DataFile,
    rows: Mapping[str, int],
    entries: Mapping[str, Mapping[str, VectorEntry]] | None = None,
) -> bytes | None:
    """Refuse a position delete file or deletion vector past the limits before it is read whole (a Parquet or
    ORC file's footer is read; a Puffin file at most ``MAX_DELETION_VECTOR_BYTES`` far). ``rows``: the stated
    row count of each data file the scan reads; ``entries``: the scan's deletion vector entries
    (:func:`task_vector_entries`; by default ``delete_file``'s own). A Puffin file's checked bytes are returned,
    holding only the blobs of data files in ``rows``: decode those, never a second read (a writer may have
    replaced the object meanwhile)."""
    if delete_file.file_format == FileFormat.PUFFIN:
        known = vector_entries([delete_file]) if entries is None else entries
        return _check_deletion_vectors(io, delete_file.file_path, rows, known.get(delete_file.file_path, {}))
    if delete_file.file_format == FileFormat.ORC:
        _check_orc_deletes(io, delete_file.file_path)
    elif delete_file.file_format == FileFormat.PARQUET:
        _check_parquet_deletes(io, delete_file.file_path)
    return None


def _check_orc_deletes(io: FileIO, path: str) -> None:
    """An ORC file's rows and decoded size as its footer states them (``sqe.execution.orc_footer``): pyiceberg
    decodes it whole, each ``file_path`` string once a row (not dictionary-encoded)."""
    with io.new_input(path).open() as stream:
        tail = orc.ORCFile(stream).reader.serialized_file_tail()
    try:
        footer = orc_footer.stated(tail)
    except ValueError:
        raise _refusal("is not an ORC file whose footer states its rows and their sizes") from None
    _check_size(footer.rows, footer.decoded_bytes, "decoded")


def _check_size(rows: int, stated_bytes: int, how: str) -> None:
    if rows > MAX_POSITION_DELETE_ROWS:
        raise _refusal(f"holds more than {MAX_POSITION_DELETE_ROWS} rows (MAX_POSITION_DELETE_ROWS)")
    if stated_bytes > MAX_POSITION_DELETE_BYTES:
        raise _refusal(f"holds more than {MAX_POSITION_DELETE_BYTES} bytes {how} (MAX_POSITION_DELETE_BYTES)")


def _check_parquet_deletes(io: FileIO, path: str) -> None:
    with io.new_input(path).open() as stream:
        metadata = pq.read_metadata(stream)
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    # A reader reads what the row groups state; the file-level count is only the writer's sum of them.
    rows = max(metadata.num_rows, sum(group.num_rows for group in groups))
    _check_size(rows, sum(group.total_byte_size for group in groups), "uncompressed")


def check_task_deletes(io: FileIO, tasks: Sequence[FileScanTask]) -> FileIO:
    """:func:`check_position_deletes` for each delete file of ``tasks`` once, before pyiceberg's ``ArrowScan``
    (compaction) reads them all whole; the FileIO that scan is to read through: ``io``, but a Puffin file is
    read from the bytes checked (one read, and never a file a writer replaced after its check)."""
    checked: dict[str, bytes | None] = {}
    rows, entries = record_counts(tasks), task_vector_entries(tasks)
    for task in tasks:
        for delete_file in task.delete_files:
            if delete_file.file_path not in checked:
                checked[delete_file.file_path] = check_position_deletes(io, delete_file, rows, entries)
    puffins = {path: data for path, data in checked.items() if data is not None}
    return _CheckedPuffinIO(io, puffins) if puffins else io


class _CheckedPuffinIO(FileIO):
    """``io``, reading each Puffin file of ``puffins`` from the bytes its check read."""

    def __init__(self, io: FileIO, puffins: dict[str, bytes]) -> None:
        super().__init__(io.properties)
        self._io, self._puffins = io, puffins

    def new_input(self, location: str) -> InputFile:
        data = self._puffins.get(location)
        return self._io.new_input(location) if data is None else _CheckedFile(location, data)

    def new_output(self, location: str) -> OutputFile:
        return self._io.new_output(location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        self._io.delete(location)


class _CheckedFile(InputFile):
    def __init__(self, location: str, data: bytes) -> None:
        super().__init__(location)
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return BytesIO(self._data)


def _check_deletion_vectors(
    io: FileIO, path: str, rows: Mapping[str, int], entries: Mapping[str, VectorEntry]
) -> bytes:
    with io.new_input(path).open(seekable=False) as stream:
        data = stream.read(MAX_DELETION_VECTOR_BYTES + 1)
    if len(data) > MAX_DELETION_VECTOR_BYTES:
        limit = MAX_DELETION_VECTOR_BYTES
        raise _refusal(f"holds more than {limit} bytes (MAX_DELETION_VECTOR_BYTES)", "deletion vector file")
    total = 0
    kept: list[tuple[PuffinBlobMetadata, bytes]] = []
    for blob, raw, referenced, vector in _vectors(data, rows):
        _check_against_entry(blob, entries.get(referenced))
        positions = 0
        for key, bitmap in _bitmaps(vector):
            # pyiceberg lists an empty bitmap for each key below this one: the key itself is a position here
            _check_last_position((key << 32) | (bitmap.max() if bitmap else 0), rows.get(referenced))
            positions += len(bitmap)
        entry = entries.get(referenced)
        if entry is not None and positions != entry.positions:
            raise _refusal(f"names {positions} positions, its delete-file entry {entry.positions}", "deletion vector")
        total += positions
        kept.append((blob, raw))
    if total > MAX_POSITION_DELETE_ROWS:
        limit = MAX_POSITION_DELETE_ROWS
        raise _refusal(f"holds more than {limit} positions (MAX_POSITION_DELETE_ROWS)", "deletion vector file")
    return _puffin_of(data, kept)


def _check_against_entry(blob: PuffinBlobMetadata, entry: VectorEntry | None) -> None:
    """A blob lies where its delete-file entry in the manifest says, and is the size it says."""
    if entry is not None and (blob.offset, blob.length) != (entry.offset, entry.size):
        raise _refusal(
            "is not the blob its delete-file entry states (content_offset, content_size_in_bytes)", "deletion vector"
        )


def _puffin_of(data: bytes, kept: list[tuple[PuffinBlobMetadata, bytes]]) -> bytes:
    """The Puffin file ``data`` when it holds only the blobs ``kept``; else a Puffin file of those blobs only
    (each at its new offset), so that no reader expands a blob the check did not."""
    footer = Footer.model_validate_json(_footer_payload(data))
    if len(footer.blobs) == len(kept):
        return data
    out, blobs = bytearray(_PUFFIN_MAGIC), []
    for blob, raw in kept:
        blobs.append(blob.model_copy(update={"offset": len(out)}))
        out += raw
    payload = Footer(blobs=blobs, properties=footer.properties).model_dump_json().encode()
    return bytes(out + _PUFFIN_MAGIC + payload + len(payload).to_bytes(4, "little") + bytes(4) + _PUFFIN_MAGIC)


def _footer_payload(data: bytes) -> bytes:
    """The footer's JSON of the Puffin file ``data``, whose framing :func:`_vectors` checked."""
    size = int.from_bytes(data[-_FOOTER_TAIL:-8], "little")
    return data[len(data) - _FOOTER_TAIL - size : len(data) - _FOOTER_TAIL]


def _check_last_position(last: int, stated_rows: int | None) -> None:
    """A deletion vector names no row its data file does not hold (the data file's ``record_count``, when the
    scan reads it), and none past ``MAX_DELETED_POSITION`` in any case."""
    if stated_rows is not None and last >= stated_rows:
        raise _refusal(f"names a position past its data file's {stated_rows} rows", "deletion vector")
    if last > MAX_DELETED_POSITION:
        raise _refusal(f"names a position past {MAX_DELETED_POSITION} (MAX_DELETED_POSITION)", "deletion vector")


def _vectors(data: bytes, rows: Mapping[str, int]) -> Iterator[tuple[PuffinBlobMetadata, bytes, str, memoryview]]:
    """Each blob of the Puffin file ``data`` naming a data file of ``rows`` (the others, of data files the scan
    does not read, are skipped unread): its metadata, its stored bytes, the data file it names and its serialized
    64-bit bitmap. Blobs may not overlap, and together inflate to at most ``MAX_DELETION_VECTOR_BYTES``: each
    is read once."""
    if data[:4] != _PUFFIN_MAGIC or data[-4:] != _PUFFIN_MAGIC or len(data) < 4 + _FOOTER_TAIL:
        raise _malformed()
    if data[-8]:
        raise _malformed()  # a compressed footer or a reserved flag: pyiceberg reads neither
    size = int.from_bytes(data[-_FOOTER_TAIL:-8], "little")
    if size > MAX_PUFFIN_FOOTER_BYTES:
        limit = MAX_PUFFIN_FOOTER_BYTES
        raise _refusal(f"has a footer of more than {limit} bytes (MAX_PUFFIN_FOOTER_BYTES)", "deletion vector file")
    start = len(data) - _FOOTER_TAIL - size
    if start < 8 or data[start - 4 : start] != _PUFFIN_MAGIC:
        raise _malformed()
    stored = inflated = 0
    try:
        # pyiceberg's own model: the blobs checked are the blobs it reads (a field by its Python name too)
        for blob in Footer.model_validate_json(data[start : len(data) - _FOOTER_TAIL]).blobs:
            referenced = blob.properties["referenced-data-file"]
            if referenced not in rows:
                continue  # a data file planning pruned: never read, never handed on
            raw = _blob(data, blob)
            stored += len(raw)
            payload = _inflated(raw, blob.compression_codec)
            inflated += len(payload)
            if stored > start or inflated > MAX_DELETION_VECTOR_BYTES:
                raise ValueError("overlapping blobs")
            yield blob, raw, referenced, _vector(payload)
    except (ValueError, KeyError, RecursionError, zstandard.ZstdError):
        raise _malformed() from None


def _blob(data: bytes, blob: PuffinBlobMetadata) -> bytes:
    offset, length = blob.offset, blob.length
    if offset < 0 or length < 12 or offset + length > len(data):
        raise ValueError("outside the file")
    return data[offset : offset + length]


def _inflated(raw: bytes, codec: object) -> bytes:
    if codec is None:
        return raw
    if codec != "zstd":
        raise ValueError("unknown codec")
    stated = zstandard.frame_content_size(raw)  # pyiceberg inflates the blob whole, to this size
    if not 0 <= stated <= MAX_DELETION_VECTOR_BYTES:
        raise ValueError("no stated size, or too large")
    return bytes(zstandard.ZstdDecompressor().decompress(raw))


def _vector(payload: bytes) -> memoryview:
    """The serialized bitmap in a ``deletion-vector-v1`` blob: length (4, big-endian), magic, bitmap, CRC."""
    framed = int.from_bytes(payload[:4], "big")
    if payload[4:8] != _VECTOR_MAGIC or framed + 8 > len(payload):
        raise ValueError("not a deletion vector")
    return memoryview(payload)[8 : 4 + framed]


def _bitmaps(vector: memoryview) -> Iterator[tuple[int, BitMap]]:
    """The keys and 32-bit bitmaps of a serialized 64-bit roaring bitmap, each bitmap deserialized as stored
    (run containers stay runs: its length and maximum cost nothing)."""
    count, pos, last_key = int.from_bytes(vector[:8], "little"), 8, -1
    for _ in range(count):
        key = int.from_bytes(vector[pos : pos + 4], "little")
        if pos + 4 > len(vector) or key <= last_key:
            raise _malformed()
        try:
            # a view, not a copy of the rest: the stubs say bytes, the C reader takes any buffer
            bitmap = BitMap.deserialize(vector[pos + 4 :])  # type: ignore[arg-type]
        except (ValueError, IndexError):  # IndexError: pyroaring's for no bytes left at all
            raise _malformed() from None
        pos, last_key = pos + 4 + len(bitmap.serialize()), key
        yield key, bitmap
    if pos != len(vector):
        raise _malformed()


def _malformed() -> DeleteFileLimitError:
    return _refusal("is not a Puffin file of deletion vectors", "deletion vector file")


def _refusal(what: str, kind: str = "position delete file") -> DeleteFileLimitError:
    return DeleteFileLimitError(f"cannot apply the scan's deletes: a {kind} of the table {what}")
