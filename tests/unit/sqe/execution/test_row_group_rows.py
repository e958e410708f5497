"""A Parquet row group is read as exactly the rows it states, or refused (``sqe.execution.local``).

pyarrow reads no more rows than a row group's footer states, and no more than its pages hold: a row group whose
``num_rows`` understated its pages' rows (or overstated them) read as fewer rows without error, and the scan's
memory bounds (whole-group reads, batch sizes, the decoded-column cache) trust that count. Real files written by
pyiceberg, their footers rewritten in place (a number in as many bytes).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sqe.catalog.base import TableIdent
from sqe.errors import QueryError
from sqe.execution import local
from sqe.planning.planner import ScanPlan, plan_scan
from tests.helpers.avro import avro_long
from tests.unit.sqe.iceberg_local import NUMBERS_SCHEMA, numbers_batch

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqe.session import Session
    from tests.unit.sqe.iceberg_local import LocalProvider

ROWS = 1000
TABLE = TableIdent("wh", ("ns",), "rows")


def _plan(provider: LocalProvider) -> ScanPlan:
    table = provider.catalogs["wh"].create_table("ns.rows", schema=NUMBERS_SCHEMA)
    table.append(numbers_batch(0, ROWS))
    plan = plan_scan(provider.load_table(TABLE), columns=None)
    assert len(plan.tasks) == 1 and pq.read_metadata(_path(plan)).num_row_groups == 1
    return plan


def _path(plan: ScanPlan) -> str:
    return plan.tasks[0].file.file_path.removeprefix("file://")


def _rows(plan: ScanPlan) -> int:
    return sum(batch.num_rows for batch in local._task_to_record_batches(plan.read, plan.tasks[0], None))


def _padded(value: int, width: int) -> bytes:
    """``value`` as a thrift compact i64 (a zigzag varint), in ``width`` bytes."""
    zigzag, out = value << 1, bytearray()
    for position in range(width):
        out.append(zigzag & 0x7F | (0x80 if position < width - 1 else 0))
        zigzag >>= 7
    assert not zigzag
    return bytes(out)


def restated(data: bytes, rows: int, which: str, value: int) -> bytes:
    """The Parquet file ``data`` with its one row group's ``num_rows`` (``which="group"``), or that and each of
    its column chunks' ``num_values`` (``"group and chunks"``), rewritten from ``rows`` to ``value``: each i64
    field of ``rows`` in the footer is tried, and kept when it changed what it should (the file-level count is
    left alone)."""
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    stated = avro_long(rows)  # the same zigzag varint
    places = [at for at in range(footer, len(data) - 8) if data[at - 1] & 0x0F == 6 and data.startswith(stated, at)]
    changed = data
    for at in places:
        attempt = changed[:at] + _padded(value, len(stated)) + changed[at + len(stated) :]
        metadata = _metadata(attempt)
        group = metadata.row_group(0)
        chunk = any(group.column(i).num_values == value for i in range(group.num_columns))
        if metadata.num_rows == rows and (group.num_rows == value or (chunk and which == "group and chunks")):
            changed = attempt
    metadata = _metadata(changed)
    assert metadata.row_group(0).num_rows == value
    return changed


def _metadata(data: bytes) -> pq.FileMetaData:
    return pq.ParquetFile(pa.BufferReader(data)).metadata


def test_a_row_group_understating_its_pages_rows_is_refused(write_provider: LocalProvider) -> None:
    # Before: the scan read 10 of the file's 1,000 rows, without error.
    plan = _plan(write_provider)
    assert _rows(plan) == ROWS
    path = Path(_path(plan))
    path.write_bytes(restated(path.read_bytes(), ROWS, "group", 10))
    assert pq.ParquetFile(path).read().num_rows == 10  # what pyarrow reads of it
    with pytest.raises(QueryError) as raised:
        _rows(plan)
    assert str(raised.value) == (
        "cannot read a data file of the table: its row group 0 states 10 rows, its column chunk 0 1000 values"
    )


def test_a_row_group_whose_pages_hold_fewer_rows_than_stated_is_refused(write_provider: LocalProvider) -> None:
    # Before: the row group and its column chunks said 1,005 rows, its pages held 1,000: pyarrow read 1,000, no error.
    plan = _plan(write_provider)
    path = Path(_path(plan))
    path.write_bytes(restated(path.read_bytes(), ROWS, "group and chunks", ROWS + 5))
    with pytest.raises(QueryError) as raised:
        _rows(plan)
    assert str(raised.value) == (
        f"cannot read a data file of the table: its row group 0 states {ROWS + 5} rows, its pages held {ROWS}"
    )


def test_optimize_refuses_a_row_group_understating_its_rows(
    write_provider: LocalProvider, session_factory: Callable[..., Session]
) -> None:
    # Found by review: OPTIMIZE reads its bins through pyiceberg's ArrowScan, not the direct read that checks row
    # groups, so a file whose row group stated 10 of its 1,000 rows was rewritten as 10 rows and the replace
    # committed: the table lost 990 rows (count 2000 before, 1010 after), without error.
    table = write_provider.catalogs["wh"].create_table("ns.rows", schema=NUMBERS_SCHEMA)
    table.append(numbers_batch(0, ROWS))
    table.append(numbers_batch(ROWS, ROWS))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    first = sorted(task.file.file_path for task in table.scan().plan_files())[0]
    path = Path(first.removeprefix("file://"))
    path.write_bytes(restated(path.read_bytes(), ROWS, "group", 10))
    session = session_factory(write_provider)
    with pytest.raises(QueryError) as raised:
        session.sql("OPTIMIZE wh.ns.rows")
    assert str(raised.value) == (
        "cannot read a data file of the table: its row group 0 states 10 rows, its column chunk 0 1000 values"
    )
    current = write_provider.catalogs["wh"].load_table("ns.rows").current_snapshot()
    assert current is not None and current.snapshot_id == snapshot.snapshot_id  # nothing committed
