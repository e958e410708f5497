"""The executor's direct Parquet scan gives exactly pyiceberg's batches, and falls back wherever it could not."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.parser import parse
from pyiceberg.table import FileScanTask
from pyiceberg.types import IntegerType, LongType, StringType

from sqe.catalog.base import TableIdent
from sqe.execution import LocalExecutor, ScanMetrics, local
from sqe.planning.planner import ReadSpec, ScanPlan, TaskCache, plan_scan
from tests.unit.sqe.iceberg_local import NUMBER_FILES, LocalProvider

NUMBERS = TableIdent("wh", ("ns",), "numbers")
EVOLVED = TableIdent("wh", ("ns",), "evolved")


def pyiceberg_rows(plan: ScanPlan) -> pa.Table:
    read = plan.read
    batches = [
        batch
        for task in plan.tasks
        for batch in local._pyiceberg_task_batches(
            read.io,
            task,
            read.bound_row_filter,
            read.projected_schema,
            read.table_schema,
            set(read.projected_field_ids),
            None,
            read.case_sensitive,
            read.name_mapping,
            read.specs.get(task.file.spec_id),
            read.format_version,
        )
    ]
    return sorted_table(batches)


def sqe_rows(plan: ScanPlan) -> pa.Table:
    batches = [b for task in plan.tasks for b in local._task_to_record_batches(plan.read, task, None)]
    return sorted_table(batches)


def sorted_table(batches: list[pa.RecordBatch]) -> pa.Table:
    table = pa.Table.from_batches(batches)
    return table.sort_by([(table.column_names[0], "ascending")])


def physical_schema(read: ReadSpec, task: FileScanTask) -> pa.Schema:
    with read.io.new_input(task.file.file_path).open() as stream:
        return ds.ParquetFileFormat().make_fragment(stream).physical_schema


def is_direct(plan: ScanPlan) -> list[bool]:
    return [local.direct_projection(plan.read, physical_schema(plan.read, t)) is not None for t in plan.tasks]


@pytest.mark.parametrize("columns", [None, ["name"], ["grp", "id"]])
@pytest.mark.parametrize("pushdown", [AlwaysTrue(), parse("id >= 1500 AND name <> 'n1600'"), parse("grp = 3")])
def test_plain_files_are_scanned_directly_with_pyiceberg_results(
    provider: LocalProvider, columns: list[str] | None, pushdown: BooleanExpression
) -> None:
    plan = plan_scan(provider.load_table(NUMBERS), columns=columns, pushdown=pushdown)
    assert plan.tasks and all(is_direct(plan))
    direct, expected = sqe_rows(plan), pyiceberg_rows(plan)
    assert direct.num_rows == expected.num_rows > 0
    assert direct.equals(expected, check_metadata=True)


def test_a_pushed_filter_is_compiled_to_compute_calls_beside_its_expression(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(NUMBERS), columns=["name"], pushdown=parse("id >= 1500 AND name <> 'n1600'"))
    task = plan.tasks[0]
    projection = local.direct_projection(plan.read, physical_schema(plan.read, task))
    assert projection is not None and projection.arrow_filter is not None and projection.row_mask is not None
    assert projection.filter_columns == ("id",)
    unfiltered = plan_scan(provider.load_table(NUMBERS), columns=["name"])
    plain = local.direct_projection(unfiltered.read, physical_schema(unfiltered.read, unfiltered.tasks[0]))
    assert plain is not None and plain.arrow_filter is None and plain.row_mask is None


@pytest.fixture()
def evolved(write_provider: LocalProvider) -> LocalProvider:
    """ns.evolved: one file written as (id long, v int, s string), then v renamed to w and a column added."""
    table = write_provider.catalogs["wh"].create_table(
        "ns.evolved", schema=pa.schema([("id", pa.int64()), ("v", pa.int32()), ("s", pa.string())])
    )
    table.append(pa.table({"id": [1, 2, 3], "v": pa.array([10, 20, 30], pa.int32()), "s": ["a", "b", "c"]}))
    with table.update_schema() as update:
        update.rename_column("v", "w")
        update.add_column("extra", StringType())
    return write_provider


def test_a_renamed_column_is_still_read_directly(evolved: LocalProvider) -> None:
    plan = plan_scan(evolved.load_table(EVOLVED), columns=["id", "w"], pushdown=parse("w >= 20"))
    assert is_direct(plan) == [True]
    direct = sqe_rows(plan)
    assert direct.equals(pyiceberg_rows(plan), check_metadata=True)
    assert direct.to_pydict() == {"id": [2, 3], "w": [20, 30]}


def test_a_column_missing_from_the_file_goes_through_pyiceberg(evolved: LocalProvider) -> None:
    plan = plan_scan(evolved.load_table(EVOLVED), columns=["id", "extra"])
    assert is_direct(plan) == [False]
    assert sqe_rows(plan).to_pydict() == {"id": [1, 2, 3], "extra": [None, None, None]}


def test_a_promoted_type_goes_through_pyiceberg(evolved: LocalProvider) -> None:
    evolved.load_table(EVOLVED).table.update_schema().update_column("w", LongType()).commit()
    plan = plan_scan(evolved.load_table(EVOLVED), columns=["id", "w"])
    assert is_direct(plan) == [False]
    rows = sqe_rows(plan)
    assert rows.schema.field("w").type == pa.int64() and rows.column("w").to_pylist() == [10, 20, 30]


def test_batches_are_sized_by_bytes_not_by_pyiceberg_default(write_provider: LocalProvider) -> None:
    table = write_provider.catalogs["wh"].create_table("ns.wide", schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": pa.array(range(300_000), pa.int64())}))  # one row group
    plan = plan_scan(write_provider.load_table(TableIdent("wh", ("ns",), "wide")), columns=None)
    metrics = ScanMetrics()
    rows = sum(b.num_rows for b in LocalExecutor().record_batches(plan, metrics=metrics))
    assert rows == 300_000 and metrics.batches_produced == 1  # pyiceberg's reader yields 3 (131072 rows each)
    small = ScanMetrics()
    list(LocalExecutor(target_batch_bytes=8 * 100_000).record_batches(plan, metrics=small))
    assert small.batches_produced == 3  # 100k-row batches


def test_batch_rows_follow_the_target_and_the_bounds(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(NUMBERS), columns=None)
    with plan.read.io.new_input(plan.tasks[0].file.file_path).open() as f:
        fragment = ds.ParquetFileFormat().make_fragment(f)
        assert local.batch_rows(fragment, ("id",), 8 * 50_000) == 50_000  # int64: 8 bytes a row
        assert local.batch_rows(fragment, ("id", "grp"), 12 * 20_000) == 20_000
        assert local.batch_rows(fragment, ("id",), 1) == local._MIN_BATCH_ROWS
        assert local.batch_rows(fragment, ("id",), 1 << 40) == local._MAX_BATCH_ROWS
        assert local.batch_rows(fragment, ("name",), 1 << 20) < (1 << 20) // 4  # strings count bytes and offsets


def test_executor_rejects_a_nonpositive_batch_target() -> None:
    with pytest.raises(ValueError, match="target_batch_bytes"):
        LocalExecutor(target_batch_bytes=0)


# ------------------------------------------------------------------------------------------- task cache


def test_task_cache_reuses_tasks_of_the_same_metadata_and_filter(provider: LocalProvider) -> None:
    cache = TaskCache()
    first = plan_scan(provider.load_table(NUMBERS), columns=None, cache=cache)
    again = plan_scan(provider.load_table(NUMBERS), columns=["id"], cache=cache)  # a fresh load, other columns
    assert again.tasks is first.tasks and cache.hits == 1
    filtered = plan_scan(provider.load_table(NUMBERS), columns=None, pushdown=parse("id < 10"), cache=cache)
    assert cache.hits == 1 and filtered.files_planned == 1


def test_task_cache_misses_once_the_table_changed(evolved: LocalProvider) -> None:
    cache = TaskCache()
    before = plan_scan(evolved.load_table(EVOLVED), columns=None, cache=cache)
    evolved.load_table(EVOLVED).table.append(
        pa.table({"id": [4], "w": pa.array([40], pa.int32()), "s": ["d"], "extra": ["x"]})
    )
    after = plan_scan(evolved.load_table(EVOLVED), columns=None, cache=cache)
    assert cache.hits == 0 and (before.files_planned, after.files_planned) == (1, 2)


def test_task_cache_is_bounded_by_entries_and_tasks(provider: LocalProvider) -> None:
    cache = TaskCache(max_entries=2, max_tasks=NUMBER_FILES + 1)
    loaded = provider.load_table(NUMBERS)
    plan_scan(loaded, columns=None, cache=cache)  # NUMBER_FILES tasks
    plan_scan(loaded, columns=None, pushdown=parse("id < 10"), cache=cache)  # 1 task: the first still fits
    plan_scan(loaded, columns=None, cache=cache)
    assert cache.hits == 1
    plan_scan(loaded, columns=None, pushdown=parse("id > 3990"), cache=cache)  # over max_entries: LRU goes
    plan_scan(loaded, columns=None, pushdown=parse("id < 10"), cache=cache)
    assert cache.hits == 1


def test_a_scan_computes_each_file_schemas_projection_once_keyed_by_field_ids(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(NUMBERS), columns=["id"])
    schema = physical_schema(plan.read, plan.tasks[0])
    memo = local.ProjectionMemo()
    first = local._projection_for(plan.read, schema, memo)
    assert first is not None and local._projection_for(plan.read, schema, memo) is first and len(memo) == 1
    # Same names and types, other Parquet field ids: equal as pa.Schemas, but not the same file layout.
    renumbered = pa.schema([f.with_metadata({b"PARQUET:field_id": b"99"}) for f in schema])
    assert renumbered == schema
    assert local._projection_for(plan.read, renumbered, memo) is None and len(memo) == 2


def test_the_projection_memo_is_bounded_and_still_answers_past_its_bound(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(NUMBERS), columns=["id"])
    schema = physical_schema(plan.read, plan.tasks[0])
    memo = local.ProjectionMemo()
    for extra in range(local.ProjectionMemo.MAX_SCHEMAS + 3):  # same columns, other schema metadata each time
        variant = schema.with_metadata({**(schema.metadata or {}), b"variant": str(extra).encode()})
        found = local._projection_for(plan.read, variant, memo)
        assert found is not None and found.file_columns == ("id",)
    assert len(memo) == local.ProjectionMemo.MAX_SCHEMAS


def memo_rows(plan: ScanPlan) -> pa.Table:
    """The scan's batches with one projection memo shared by all its files, as the executor reads them."""
    memo = local.ProjectionMemo()
    batches = [b for task in plan.tasks for b in local._task_to_record_batches(plan.read, task, None, projections=memo)]
    return sorted_table(batches)


def test_swapped_column_names_are_read_by_field_id(write_provider: LocalProvider) -> None:
    """Two same-typed columns whose names were swapped: the file's 'a' is the table's 'b'. A match by name, or
    a reader returning columns in file order, would hand back the other column's values."""
    table = write_provider.catalogs["wh"].create_table(
        "ns.swapped", schema=pa.schema([("id", pa.int64()), ("a", pa.int32()), ("b", pa.int32())])
    )
    ids, a, b = [1, 2, 3], pa.array([10, 20, 30], pa.int32()), pa.array([-1, -2, -3], pa.int32())
    table.append(pa.table({"id": ids, "a": a, "b": b}))
    with table.update_schema() as update:
        update.rename_column("a", "tmp")
    with table.update_schema() as update:
        update.rename_column("b", "a")
    with table.update_schema() as update:
        update.rename_column("tmp", "b")
    plan = plan_scan(write_provider.load_table(TableIdent("wh", ("ns",), "swapped")), columns=["id", "a", "b"])
    assert is_direct(plan) == [True]
    rows = memo_rows(plan)
    assert rows.equals(pyiceberg_rows(plan), check_metadata=True)
    assert rows.to_pydict() == {"id": ids, "a": [-1, -2, -3], "b": [10, 20, 30]}


def test_files_with_other_field_ids_for_one_name_each_get_their_own_projection(write_provider: LocalProvider) -> None:
    """A column dropped and added again under its old name and type has a new field id: files written before
    hold the old id (read as nulls), files after the new one. Their physical schemas differ only in the Parquet
    field id, so a memo that ignored field metadata would read the old values as the new column."""
    table = write_provider.catalogs["wh"].create_table(
        "ns.readded", schema=pa.schema([("id", pa.int64()), ("v", pa.int32())])
    )
    table.append(pa.table({"id": [1, 2], "v": pa.array([10, 20], pa.int32())}))
    with table.update_schema() as update:
        update.delete_column("v")
    with table.update_schema() as update:
        update.add_column("v", IntegerType())
    table.append(pa.table({"id": [3, 4], "v": pa.array([30, 40], pa.int32())}))
    plan = plan_scan(write_provider.load_table(TableIdent("wh", ("ns",), "readded")), columns=["id", "v"])
    assert len(plan.tasks) == 2
    rows = memo_rows(plan)
    assert rows.equals(pyiceberg_rows(plan), check_metadata=True)
    assert rows.to_pydict() == {"id": [1, 2, 3, 4], "v": [None, None, 30, 40]}


def test_a_reordered_table_schema_reads_the_projection_order(write_provider: LocalProvider) -> None:
    table = write_provider.catalogs["wh"].create_table(
        "ns.reordered", schema=pa.schema([("id", pa.int64()), ("x", pa.int64()), ("y", pa.int64())])
    )
    table.append(pa.table({"id": [1, 2], "x": [10, 20], "y": [100, 200]}))
    with table.update_schema() as update:
        update.move_first("y")
    plan = plan_scan(write_provider.load_table(TableIdent("wh", ("ns",), "reordered")), columns=None)
    assert is_direct(plan) == [True]
    rows = memo_rows(plan)
    assert rows.column_names == ["y", "id", "x"]
    assert rows.equals(pyiceberg_rows(plan), check_metadata=True)
    assert rows.to_pydict() == {"y": [100, 200], "id": [1, 2], "x": [10, 20]}
