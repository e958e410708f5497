"""Bounds on the position delete files a scan reads whole (pyiceberg reads each into one Arrow table).

A writer of the table decides what a delete file holds: positions repeat and run-length encode, so a file of a
few KiB can hold hundreds of millions of rows, and every reader of the table would decode them all. Before a
Parquet delete file is read, its footer's row count and its row groups' stated uncompressed size are checked;
past ``MAX_POSITION_DELETE_ROWS`` or ``MAX_POSITION_DELETE_BYTES`` the scan fails with
:class:`sqe.errors.DeleteFileLimitError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
from pyiceberg.manifest import FileFormat

from sqe.errors import DeleteFileLimitError

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask

__all__ = ["MAX_POSITION_DELETE_BYTES", "MAX_POSITION_DELETE_ROWS", "check_position_deletes", "check_task_deletes"]

# 32 Mi deleted positions (a quarter GiB as Arrow arrays): far more than one data file's rows at Iceberg's
# 512 MiB target file size, so only a file no writer needs is refused.
MAX_POSITION_DELETE_ROWS = 1 << 25
MAX_POSITION_DELETE_BYTES = 1 << 30  # the row groups' stated uncompressed size: long paths, not many rows


def check_position_deletes(io: FileIO, delete_file: DataFile) -> None:
    """Refuse a Parquet position delete file whose footer states more than the limits (reads the footer only)."""
    if delete_file.file_format != FileFormat.PARQUET:
        return  # ORC and Puffin deletion vectors are not sized here
    with io.new_input(delete_file.file_path).open() as stream:
        metadata = pq.read_metadata(stream)
    if metadata.num_rows > MAX_POSITION_DELETE_ROWS:
        raise _refusal(f"holds more than {MAX_POSITION_DELETE_ROWS} rows (MAX_POSITION_DELETE_ROWS)")
    stated = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    if stated > MAX_POSITION_DELETE_BYTES:
        raise _refusal(f"holds more than {MAX_POSITION_DELETE_BYTES} bytes uncompressed (MAX_POSITION_DELETE_BYTES)")


def check_task_deletes(io: FileIO, tasks: Iterable[FileScanTask]) -> None:
    """:func:`check_position_deletes` for each delete file of ``tasks`` once, before pyiceberg's ``ArrowScan``
    (compaction) reads them all whole."""
    seen: set[str] = set()
    for task in tasks:
        for delete_file in task.delete_files:
            if delete_file.file_path not in seen:
                seen.add(delete_file.file_path)
                check_position_deletes(io, delete_file)


def _refusal(what: str) -> DeleteFileLimitError:
    return DeleteFileLimitError(f"cannot apply the scan's deletes: a position delete file of the table {what}")
