"""A scan decodes a deletion vector from the bytes its check read (``sqe.execution.local``).

The Puffin file is checked, then decoded: read again from the store, a writer could have replaced the object in
between with one the check never saw. Local files; the replacement is what a concurrent writer would do."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import FileScanTask
from pyiceberg.typedef import Record
from pyroaring import BitMap

from sqe.execution.local import _DeleteCache
from tests.unit.sqe.iceberg_local import deletion_vector_puffin

if TYPE_CHECKING:
    from pathlib import Path

ROWS = 100


class _ReplacedOnSecondRead(PyArrowFileIO):
    """Local files, where a writer replaces ``path`` with ``replacement`` before it is asked for again."""

    def __init__(self, path: Path, replacement: bytes) -> None:
        super().__init__()
        self._path, self._replacement, self._asked = path, replacement, 0

    def new_input(self, location: str) -> PyArrowFile:
        if location == str(self._path):
            self._asked += 1
            if self._asked == 2:
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


def test_a_deletion_vector_replaced_after_its_check_is_never_read(tmp_path: Path) -> None:
    # Found by review: the check read the Puffin file, then pyiceberg read it again from the store, so a file
    # replaced in between (here naming rows past its data file) was expanded unchecked.
    data = str(tmp_path / "data.parquet")
    checked, _, _ = deletion_vector_puffin(data, {0: BitMap([0, 5])})
    replaced, _, _ = deletion_vector_puffin(data, {0: BitMap(range(ROWS + 50))})
    puffin = tmp_path / "dv.puffin"
    puffin.write_bytes(checked)
    vector = _data_file(str(puffin), DataFileContent.POSITION_DELETES, FileFormat.PUFFIN, 2, len(checked))
    task = FileScanTask(_data_file(data, DataFileContent.DATA, FileFormat.PARQUET, ROWS, 1), delete_files={vector})
    plan = SimpleNamespace(tasks=(task,), read=SimpleNamespace(io=_ReplacedOnSecondRead(puffin, replaced)))
    positions = _DeleteCache(plan).for_file(task)  # type: ignore[arg-type]
    assert positions is not None
    assert [p for chunk in positions for p in chunk.to_pylist()] == [0, 5]
