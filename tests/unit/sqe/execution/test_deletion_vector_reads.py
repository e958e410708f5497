"""A scan or rewrite decodes a deletion vector from the bytes its check read (``sqe.execution.local``,
``sqe.execution.delete_limits``).

The Puffin file is checked, then decoded: read again from the store, a writer could have replaced the object in
between with one the check never saw. Local files; the replacement is what a concurrent writer would do."""

from __future__ import annotations

import json
import struct
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO, _read_all_delete_files
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import FileScanTask
from pyiceberg.typedef import Record
from pyroaring import BitMap

from sqe.errors import DeleteFileLimitError
from sqe.execution.delete_limits import (
    MAX_PUFFIN_FOOTER_BYTES,
    check_position_deletes,
    check_task_deletes,
    task_vector_entries,
)
from sqe.execution.local import _DeleteCache
from tests.unit.sqe.iceberg_local import deletion_vector_puffin, vector_puffin

if TYPE_CHECKING:
    from pathlib import Path

ROWS = 100


class _ReplacedOnSecondRead(PyArrowFileIO):
    """Local files, where a writer replaces ``path`` with ``replacement`` before it is asked for again."""

    def __init__(self, path: Path, replacement: bytes) -> None:
        super().__init__()
        self._path, self._replacement, self.asked = path, replacement, 0

    def new_input(self, location: str) -> PyArrowFile:
        if location == str(self._path):
            self.asked += 1
            if self.asked == 2:
                self._path.write_bytes(self._replacement)
        return super().new_input(location)


def _data_file(path: str, content: DataFileContent, file_format: FileFormat, rows: int, size: int) -> DataFile:
    return DataFile.from_args(
        content=content,
        file_path=path,
        file_format=file_format,
        partition=Record(),
        record_count=rows,
        file_size_in_bytes=size,
    )


def _replaced_vector(tmp_path: Path) -> tuple[FileScanTask, _ReplacedOnSecondRead]:
    """A task whose data file's deletion vector deletes positions 0 and 5, and local files where a writer
    replaces that Puffin file, once it was read, with one deleting rows past the data file's end."""
    data = str(tmp_path / "data.parquet")
    checked, _, _ = deletion_vector_puffin(data, {0: BitMap([0, 5])})
    replaced, _, _ = deletion_vector_puffin(data, {0: BitMap(range(ROWS + 50))})
    puffin = tmp_path / "dv.puffin"
    puffin.write_bytes(checked)
    vector = _data_file(str(puffin), DataFileContent.POSITION_DELETES, FileFormat.PUFFIN, 2, len(checked))
    task = FileScanTask(_data_file(data, DataFileContent.DATA, FileFormat.PARQUET, ROWS, 1), delete_files={vector})
    return task, _ReplacedOnSecondRead(puffin, replaced)


def test_a_deletion_vector_replaced_after_its_check_is_never_read(tmp_path: Path) -> None:
    # Found by review: the check read the Puffin file, then pyiceberg read it again from the store, so a file
    # replaced in between (here naming rows past its data file) was expanded unchecked.
    task, io = _replaced_vector(tmp_path)
    plan = SimpleNamespace(tasks=(task,), read=SimpleNamespace(io=io))
    positions = _DeleteCache(plan).for_file(task)  # type: ignore[arg-type]
    assert positions is not None
    assert [p for chunk in positions for p in chunk.to_pylist()] == [0, 5]


def test_a_rewrite_reads_each_deletion_vector_once_from_the_bytes_its_check_read(tmp_path: Path) -> None:
    # Before: compaction and a worker's rewrite checked each Puffin file, then pyiceberg's ArrowScan read it
    # again from the store: a second read, and a file replaced in between was expanded unchecked.
    task, io = _replaced_vector(tmp_path)
    deletes = _read_all_delete_files(check_task_deletes(io, [task]), [task])  # how ArrowScan reads them
    assert [p for chunk in deletes[task.file.file_path] for p in chunk.to_pylist()] == [0, 5]
    assert io.asked == 1


@pytest.mark.parametrize(
    "vector",
    [
        struct.pack("<QI", 1, 0),  # one key, then no bitmap at all
        struct.pack("<QI", 2, 0) + BitMap([3]).serialize() + struct.pack("<I", 1),  # the second bitmap missing
    ],
    ids=["no-bitmap", "second-bitmap-missing"],
)
def test_a_vector_whose_bitmap_is_missing_is_a_typed_refusal(tmp_path: Path, vector: bytes) -> None:
    # Found by fuzzing: pyroaring raises IndexError (not ValueError) for an empty buffer, and the check let it
    # through: the scan failed untyped.
    data = str(tmp_path / "data.parquet")
    puffin, _, _ = vector_puffin(data, vector, 1)
    path = tmp_path / "dv.puffin"
    path.write_bytes(puffin)
    vector_file = _data_file(str(path), DataFileContent.POSITION_DELETES, FileFormat.PUFFIN, 1, len(puffin))
    with pytest.raises(DeleteFileLimitError) as raised:
        check_position_deletes(PyArrowFileIO(), vector_file, {data: ROWS})
    assert str(raised.value).endswith("a deletion vector file of the table is not a Puffin file of deletion vectors")


def test_a_puffin_footer_past_its_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    # Found while fuzzing: the footer's JSON was parsed whole (pyiceberg's model) before any check, and it takes
    # about ten times its size as objects (measured: 37 MB of blob entries took 388 MB and 1.2 s): a 256 MiB
    # file (MAX_DELETION_VECTOR_BYTES) of one footer would take gigabytes, per file a scan reads.
    data = str(tmp_path / "data.parquet")
    puffin, _, _ = deletion_vector_puffin(data, {0: BitMap([1])})
    size = int.from_bytes(puffin[-12:-8], "little")
    footer = json.loads(puffin[-12 - size : -12])
    footer["properties"] = {"padding": "x" * MAX_PUFFIN_FOOTER_BYTES}
    encoded = json.dumps(footer).encode()
    path = tmp_path / "dv.puffin"
    path.write_bytes(puffin[: -12 - size] + encoded + struct.pack("<I", len(encoded)) + puffin[-8:])
    vector_file = _data_file(str(path), DataFileContent.POSITION_DELETES, FileFormat.PUFFIN, 1, 0)
    with pytest.raises(DeleteFileLimitError) as raised:
        check_position_deletes(PyArrowFileIO(), vector_file, {data: ROWS})
    assert str(raised.value) == (
        "cannot apply the scan's deletes: a deletion vector file of the table has a footer of more than "
        f"{MAX_PUFFIN_FOOTER_BYTES} bytes (MAX_PUFFIN_FOOTER_BYTES)"
    )


# ---------------------------------------------------------------------------------------------------------
# A blob is held to its delete-file entry in the manifest (format v3: content_offset, content_size_in_bytes,
# record_count the vector's cardinality), and a blob of a data file the scan does not read is never expanded.

SCANNED, PRUNED = "s3://b/t/data/scanned.parquet", "s3://b/t/data/pruned.parquet"


def _two_vectors(pruned_positions: int) -> tuple[bytes, list[tuple[int, int]]]:
    """A Puffin file of two deletion vectors: positions 0 and 5 of ``SCANNED``, and the first
    ``pruned_positions`` of ``PRUNED``; and each blob's (offset, length)."""
    out, metas, places = bytearray(b"PFA1"), [], []
    for referenced, bitmap in ((SCANNED, BitMap([0, 5])), (PRUNED, BitMap(range(pruned_positions)))):
        single, offset, length = deletion_vector_puffin(referenced, {0: bitmap})
        size = int.from_bytes(single[-12:-8], "little")
        [meta] = json.loads(single[-12 - size : -12])["blobs"]
        meta["offset"] = len(out)
        places.append((len(out), length))
        out += single[offset : offset + length]
        metas.append(meta)
    footer = json.dumps({"blobs": metas}).encode()
    return bytes(out + b"PFA1" + footer + struct.pack("<I", len(footer)) + b"\0\0\0\0PFA1"), places


def _vector_entry(path: str, referenced: str, offset: int, length: int, positions: int) -> DataFile:
    """A deletion vector's delete-file entry as a v3 manifest states it."""
    return DataFile.from_args(
        3,
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PUFFIN,
        partition=Record(),
        record_count=positions,
        file_size_in_bytes=1,
        referenced_data_file=referenced,
        content_offset=offset,
        content_size_in_bytes=length,
    )


def _scanned_task(tmp_path: Path, entry_change: dict[str, int] | None = None) -> tuple[FileScanTask, bytes]:
    puffin, [(offset, length), _pruned] = _two_vectors(1 << 20)
    path = tmp_path / "dv.puffin"
    path.write_bytes(puffin)
    stated = {"offset": offset, "length": length, "positions": 2} | (entry_change or {})
    entry = _vector_entry(str(path), SCANNED, stated["offset"], stated["length"], stated["positions"])
    task = FileScanTask(_data_file(SCANNED, DataFileContent.DATA, FileFormat.PARQUET, ROWS, 1), delete_files={entry})
    return task, puffin


def test_a_blob_of_a_data_file_the_scan_does_not_read_is_never_expanded(tmp_path: Path) -> None:
    # Before: the pruned data file's vector (2^20 positions here; any up to 32 Mi) was deserialized by the check
    # and expanded whole by the scan (an Arrow array of every position), bounded only by the absolute limits.
    from sqe.execution.local import _vectors

    task, _puffin = _scanned_task(tmp_path)
    [entry] = task.delete_files
    checked = check_position_deletes(PyArrowFileIO(), entry, {SCANNED: ROWS}, task_vector_entries([task]))
    assert checked is not None
    decoded = _vectors(checked)
    assert set(decoded) == {SCANNED} and decoded[SCANNED].to_pylist() == [0, 5]
    plan = SimpleNamespace(tasks=(task,), read=SimpleNamespace(io=PyArrowFileIO()))
    positions = _DeleteCache(plan).for_file(task)  # type: ignore[arg-type]
    assert positions is not None and [p for chunk in positions for p in chunk.to_pylist()] == [0, 5]
    deletes = _read_all_delete_files(check_task_deletes(PyArrowFileIO(), [task]), [task])  # ArrowScan's read
    assert set(deletes) == {SCANNED}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"offset": 1}, "is not the blob its delete-file entry states (content_offset, content_size_in_bytes)"),
        ({"length": 1}, "is not the blob its delete-file entry states (content_offset, content_size_in_bytes)"),
        ({"positions": 3}, "names 2 positions, its delete-file entry 3"),
    ],
    ids=["elsewhere", "another-size", "another-cardinality"],
)
def test_a_blob_disagreeing_with_its_manifest_entry_is_refused(
    tmp_path: Path, change: dict[str, int], why: str
) -> None:
    # Before: a blob was read wherever the Puffin footer put it, whatever size and cardinality the manifest stated.
    task, _puffin = _scanned_task(tmp_path)
    [entry] = task.delete_files
    stated = {"offset": entry[18] + change.get("offset", 0), "length": entry[19] + change.get("length", 0)}
    changed = _vector_entry(entry.file_path, SCANNED, stated["offset"], stated["length"], change.get("positions", 2))
    with pytest.raises(DeleteFileLimitError) as raised:
        check_position_deletes(PyArrowFileIO(), changed, {SCANNED: ROWS})
    assert str(raised.value) == f"cannot apply the scan's deletes: a deletion vector of the table {why}"


def test_planning_reads_a_deletion_vectors_offset_and_size_from_its_manifest(tmp_path: Path) -> None:
    # Before: planning read entries as format v2's, without a deletion vector's content offset and size.
    from sqe.planning.planner import _plan_locally
    from tests.unit.sqe.iceberg_local import (
        NUMBERS_SCHEMA,
        add_deletion_vector,
        local_catalog,
        numbers_batch,
    )

    catalog = local_catalog(tmp_path, "wh")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=NUMBERS_SCHEMA)
    table.append(numbers_batch(0, ROWS))
    target = add_deletion_vector(table, {0: BitMap([1, 2])})
    [task] = _plan_locally(catalog.load_table("ns.t").scan())
    [entry] = task.delete_files
    [(path, vectors)] = task_vector_entries([task]).items()
    assert path == entry.file_path and set(vectors) == {target} and vectors[target].positions == 2
    assert vectors[target].offset == 4 and vectors[target].size > 12
