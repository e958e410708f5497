"""Read-restrictions on time travel after schema evolution: the current restrictions, bound by field id, apply
to every snapshot exactly as they apply to the current one, or the query fails closed."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.types import DoubleType, LongType, StringType

from sqe.errors import RestrictionError
from tests.unit.sqe.iceberg_local import LocalProvider


@pytest.mark.parametrize(
    ("narrow", "wide", "values", "row_filter"),
    [
        # 0.1f is 0.10000000149 as a double: not <= 0.1, so the row is hidden today; narrowing the literal to
        # float at the older snapshot (0.1f <= 0.1f) showed it.
        (pa.float32(), DoubleType(), [0.1, 0.0], {"type": "lt-eq", "term": "x", "value": 0.1}),
        # a long literal outside int's range: the older snapshot's int values compare as longs
        (pa.int32(), LongType(), [5, -5], {"type": "lt", "term": "x", "value": -3_000_000_000}),
    ],
)
def test_time_travel_before_a_type_promotion_filters_in_the_promoted_type(
    write_provider: LocalProvider,
    session_factory: Any,
    narrow: pa.DataType,
    wide: Any,
    values: list[Any],
    row_filter: dict[str, Any],
) -> None:
    catalog = write_provider.catalogs["wh"]
    table = catalog.create_table("ns.prom", schema=pa.schema([("id", pa.int64()), ("x", narrow)]))
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "x": pa.array(values, narrow)}))
    before = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.update_column("x", wide)
    write_provider.restrictions["wh.ns.prom"] = {"required-row-filter": row_filter}
    session = session_factory(write_provider)
    current = session.sql("SELECT id FROM ns.prom ORDER BY id").fetchall()
    old = session.sql(f"SELECT id FROM ns.prom FOR VERSION AS OF {before} ORDER BY id").fetchall()
    assert old == current


@pytest.mark.parametrize("readd", [False, True])
def test_time_travel_to_a_snapshot_without_the_filter_column_fails_closed(
    write_provider: LocalProvider, session_factory: Any, readd: bool
) -> None:
    # The filter's column (field id 3) is newer than the snapshot; with ``readd`` the snapshot holds an older,
    # dropped column of the same name (field id 2), which is not the filter's column.
    catalog = write_provider.catalogs["wh"]
    table = catalog.create_table("ns.late", schema=pa.schema([("id", pa.int64()), ("region", pa.string())]))
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "region": ["EU", "US"]}))
    before = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.rename_column("region", "old_region") if not readd else update.delete_column("region")
    with table.update_schema() as update:
        update.add_column("region", StringType())
    write_provider.restrictions["wh.ns.late"] = {"required-row-filter": {"type": "eq", "term": "region", "value": "EU"}}
    session = session_factory(write_provider)
    for sql in (
        f"SELECT * FROM ns.late FOR VERSION AS OF {before}",
        f"SELECT count(*) FROM ns.late FOR VERSION AS OF {before}",
        f"SELECT id FROM ns.late FOR VERSION AS OF {before} WHERE id = 1",
    ):
        with pytest.raises(RestrictionError):
            session.sql(sql).fetchall()


def test_time_travel_before_a_type_promotion_masks_in_the_promoted_type(
    write_provider: LocalProvider, session_factory: Any
) -> None:
    # sha-256 of a long hashes its 8 bytes; the older snapshot's int values were hashed as 4 bytes instead, a
    # different pseudonym for the same value than the one the catalog's mask gives today.
    catalog = write_provider.catalogs["wh"]
    table = catalog.create_table("ns.hashed", schema=pa.schema([("id", pa.int64()), ("x", pa.int32())]))
    table.append(pa.table({"id": pa.array([1], pa.int64()), "x": pa.array([7], pa.int32())}))
    before = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.update_column("x", LongType())
    write_provider.restrictions["wh.ns.hashed"] = {
        "required-column-projections": [{"field-id": 2, "action": "sha-256-global"}]
    }
    session = session_factory(write_provider)
    current = session.sql("SELECT x FROM ns.hashed").arrow()
    old = session.sql(f"SELECT x FROM ns.hashed FOR VERSION AS OF {before}").arrow()
    assert old.schema.field("x").type == pa.int64()
    assert old.column("x").to_pylist() == current.column("x").to_pylist()


@pytest.mark.parametrize(
    ("row_filter", "shown"),
    [
        # 0.1f is 0.10000000149 as a double: above 0.1 (Iceberg compares the promoted value with the double);
        # bound to the older files' float type the literal became 0.1f, and 0.1f > 0.1f dropped the row
        ({"type": "gt", "term": "x", "value": 0.1}, [1, 3]),
        # ... and 0.1f = 0.1f showed a row the filter hides (0.10000000149 is not 0.1)
        ({"type": "eq", "term": "x", "value": 0.1}, []),
        ({"type": "lt-eq", "term": "x", "value": 0.1}, [2]),
    ],
)
def test_a_row_filter_on_a_float_promoted_to_double_compares_doubles(
    write_provider: LocalProvider, session_factory: Any, row_filter: dict[str, Any], shown: list[int]
) -> None:
    catalog = write_provider.catalogs["wh"]
    table = catalog.create_table("ns.floats", schema=pa.schema([("id", pa.int64()), ("x", pa.float32())]))
    # one file whose bounds (0.0 and 0.1f, compared as doubles) keep it for every filter: the rows decide
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "x": pa.array([0.1, 0.0], pa.float32())}))
    before = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.update_column("x", DoubleType())
    table = catalog.load_table("ns.floats")
    table.append(pa.table({"id": pa.array([3], pa.int64()), "x": pa.array([0.5], pa.float64())}))
    write_provider.restrictions["wh.ns.floats"] = {"required-row-filter": row_filter}
    session = session_factory(write_provider)
    current = [r[0] for r in session.sql("SELECT id FROM ns.floats ORDER BY id").fetchall()]
    old = [r[0] for r in session.sql(f"SELECT id FROM ns.floats FOR VERSION AS OF {before} ORDER BY id").fetchall()]
    assert current == shown
    assert old == [i for i in shown if i != 3]
