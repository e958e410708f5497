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
from sqe.execution.delete_limits import MAX_PUFFIN_FOOTER_BYTES, check_position_deletes, check_task_deletes
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
