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
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.expressions.parser import parse
from pyiceberg.types import LongType

from sqe.catalog.base import TableIdent
from sqe.errors import QueryError
from sqe.execution import LocalExecutor, local
from sqe.planning.planner import ScanPlan, plan_scan
from tests.helpers.avro import avro_long
from tests.unit.sqe.iceberg_local import NUMBERS_SCHEMA, add_positional_deletes, numbers_batch

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyiceberg.table import Table

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


def restated_counts(data: bytes, rows: int, groups: dict[int, int], file_rows: int | None = None) -> bytes:
    """The Parquet file ``data``, each row group of ``rows`` rows, with row group ``g``'s ``num_rows`` and its
    column chunks' ``num_values`` rewritten to ``groups[g]``, and the file-level count to ``file_rows`` (None:
    left alone): each i64 field of ``rows`` in the footer is tried with each target, and kept when it changed
    exactly one of those counts to its target. The pages are untouched: they hold ``rows`` rows a group."""
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    stated = avro_long(rows)
    places = [at for at in range(footer, len(data) - 8) if data[at - 1] & 0x0F == 6 and data.startswith(stated, at)]
    before = _metadata(data)
    targets: list[int | None] = [file_rows]
    for group in range(before.num_row_groups):
        targets.extend([groups.get(group)] * (1 + before.num_columns))
    changed = data
    for at in places:
        for value in {target for target in targets if target is not None}:
            attempt = changed[:at] + _padded(value, len(stated)) + changed[at + len(stated) :]
            moved = [i for i, (a, b) in enumerate(zip(_counts(changed), _counts(attempt), strict=True)) if a != b]
            if len(moved) == 1 and targets[moved[0]] == value:
                changed = attempt
                break
    assert all(t is None or t == c for t, c in zip(targets, _counts(changed), strict=True)), _counts(changed)
    return changed


def _counts(data: bytes) -> list[int]:
    """The file's row count, then each row group's and its column chunks' counts."""
    metadata = _metadata(data)
    counts = [metadata.num_rows]
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        counts.extend([group.num_rows, *(group.column(i).num_values for i in range(group.num_columns))])
    return counts


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


def test_a_footer_whose_row_groups_add_up_to_other_rows_than_it_states_is_refused(
    write_provider: LocalProvider,
) -> None:
    # The row group and its column chunks say 1,005 rows, its pages hold 1,000, the footer's own count 1,000:
    # refused by the footer before a page is read (before: by counting the rows the pages yielded).
    plan = _plan(write_provider)
    path = Path(_path(plan))
    path.write_bytes(restated(path.read_bytes(), ROWS, "group and chunks", ROWS + 5))
    with pytest.raises(QueryError) as raised:
        _rows(plan)
    assert str(raised.value) == (
        f"cannot read a data file of the table: its footer states {ROWS} rows, its row groups {ROWS + 5}"
    )


def test_a_footer_stating_other_rows_than_the_manifest_entry_is_refused(write_provider: LocalProvider) -> None:
    # Before: the footer (file, row group and column chunks) said 10 rows where the manifest entry and the pages
    # held 1,000: every count of the footer agreed, so the scan read 10 rows without error.
    plan = _plan(write_provider)
    path = Path(_path(plan))
    path.write_bytes(restated_counts(path.read_bytes(), ROWS, {0: 10}, file_rows=10))
    assert pq.ParquetFile(path).read().num_rows == 10 and plan.tasks[0].file.record_count == ROWS
    with pytest.raises(QueryError) as raised:
        _rows(plan)
    assert str(raised.value) == (
        f"cannot read a data file of the table: its manifest entry states {ROWS} rows, its footer 10"
    )


# ---------------------------------------------------------------------------------------------------------
# A file of two row groups of 1,000 rows each, its footer rewritten to say 1,005 and 995 (and its column chunks
# likewise): every count of the footer and the manifest entry agree (2,000), but the first group's pages hold 5
# rows fewer than it states. pyarrow reads 1,000 of the first group and 995 of the second, without error.

SHORT_FIRST = f"cannot read a data file of the table: its row group 0 states {ROWS + 5} rows, its pages held {ROWS}"


def _two_groups(provider: LocalProvider, *, deletes: bool = False) -> Table:
    properties = {"write.parquet.row-group-limit": str(ROWS)}
    table = provider.catalogs["wh"].create_table("ns.rows", schema=NUMBERS_SCHEMA, properties=properties)
    table.append(numbers_batch(0, 2 * ROWS))
    if deletes:
        add_positional_deletes(table, (1, 1500))
    path = Path(next(iter(table.scan().plan_files())).file.file_path.removeprefix("file://"))
    assert pq.read_metadata(path).num_row_groups == 2
    path.write_bytes(restated_counts(path.read_bytes(), ROWS, {0: ROWS + 5, 1: ROWS - 5}))
    return table


def _executor_rows(plan: ScanPlan) -> pa.Table:
    return pa.Table.from_batches(list(LocalExecutor().record_batches(plan)))


@pytest.mark.parametrize(
    "path",
    [
        "direct",  # no filter, a local file: pyarrow's Parquet reader (counted before too)
        "direct-filtered",  # a row filter: the dataset scanner
        "evolved",  # a column added since the file was written: pyiceberg's projection
        "promoted",  # a column promoted since: pyiceberg's projection
        "promoted-filtered",  # a filter on the promoted column: read in the table's types, then filtered
        "position-deletes",  # a position delete file: pyiceberg's reader, deletes by position
    ],
)
def test_a_row_group_whose_pages_hold_fewer_rows_than_stated_is_refused_on_every_read_path(
    write_provider: LocalProvider, path: str
) -> None:
    # Before, every path but "direct" read 1,995 of the file's 2,000 rows without error.
    table = _two_groups(write_provider, deletes=path == "position-deletes")
    if path == "evolved":
        with table.update_schema() as update:
            update.add_column("extra", LongType())
    if path.startswith("promoted"):
        with table.update_schema() as update:
            update.update_column("grp", LongType())
    pushdown = {"direct-filtered": "id >= 0", "promoted-filtered": "grp >= 0"}.get(path)
    loaded = write_provider.load_table(TABLE)
    bound = parse(pushdown) if pushdown else AlwaysTrue()
    plan = plan_scan(loaded, columns=None, pushdown=bound)
    assert bool(plan.read.promoted_filter_ids) == (path == "promoted-filtered")
    with pytest.raises(QueryError) as raised:
        _executor_rows(plan)
    assert str(raised.value) == SHORT_FIRST


def test_the_counted_reads_yield_every_row_of_a_sound_file_with_its_deletes_applied(
    write_provider: LocalProvider,
) -> None:
    # The same table, its file left as written: what the reader of files with deletes yields.
    properties = {"write.parquet.row-group-limit": str(ROWS)}
    table = write_provider.catalogs["wh"].create_table("ns.rows", schema=NUMBERS_SCHEMA, properties=properties)
    table.append(numbers_batch(0, 2 * ROWS))
    add_positional_deletes(table, (1, 1500))
    loaded = write_provider.load_table(TABLE)
    for pushdown, expected in [(None, 2 * ROWS - 2), ("id >= 1000", ROWS - 1)]:
        bound = parse(pushdown) if pushdown else AlwaysTrue()
        rows = _executor_rows(plan_scan(loaded, columns=None, pushdown=bound))
        ids = sorted(rows.column("id").to_pylist())
        low = 1000 if pushdown else 0
        assert ids == [i for i in range(low, 2 * ROWS) if i not in (1, 1500)] and len(ids) == expected


def test_optimize_refuses_a_row_group_whose_pages_hold_fewer_rows_than_stated(
    write_provider: LocalProvider, session_factory: Callable[..., Session]
) -> None:
    # Before: OPTIMIZE read the bin through pyiceberg's ArrowScan, 1,995 of the file's 2,000 rows, and committed
    # them as the table's new files: 5 rows lost, without error.
    table = _two_groups(write_provider)
    table.append(numbers_batch(2 * ROWS, ROWS))  # a second file, so there is something to compact
    snapshot = table.current_snapshot()
    assert snapshot is not None
    session = session_factory(write_provider)
    with pytest.raises(QueryError) as raised:
        session.sql("OPTIMIZE wh.ns.rows")
    assert str(raised.value) == SHORT_FIRST
    current = write_provider.catalogs["wh"].load_table("ns.rows").current_snapshot()
    assert current is not None and current.snapshot_id == snapshot.snapshot_id  # nothing committed


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


@pytest.mark.parametrize("deletes", [False, True], ids=["no-deletes", "position-deletes"])
def test_a_file_holding_none_of_the_read_columns_keeps_every_rows_count_through_the_counted_reader(
    write_provider: LocalProvider, deletes: bool
) -> None:
    # A file written before the only column read (and filtered) was added: the reader scans no column of it, so
    # its batches are row counts only, which must survive (a batch built from no arrays holds no rows; found by
    # tests/e2e/test_time_travel_absent_filter_column.py while writing the counted reader).
    properties = {"write.parquet.row-group-limit": str(ROWS)}
    table = write_provider.catalogs["wh"].create_table("ns.rows", schema=NUMBERS_SCHEMA, properties=properties)
    table.append(numbers_batch(0, 2 * ROWS))
    if deletes:
        add_positional_deletes(table, (1, 1500))
    with table.update_schema() as update:
        update.add_column("extra", LongType())
    plan = plan_scan(write_provider.load_table(TABLE), columns=["extra"], pushdown=parse("extra is null"))
    rows = _executor_rows(plan)
    assert rows.num_rows == 2 * ROWS - 2 * deletes and rows.column("extra").null_count == rows.num_rows
