"""Read-restrictions on time travel after schema evolution: the current restrictions, bound by field id, apply
to every snapshot exactly as they apply to the current one, or the query fails closed."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.types import DoubleType, FloatType, LongType, NestedField, StringType, StructType

from sqe.errors import RestrictionApplyError, SQEError
from sqe.planning.absent_filter_fields import HIDDEN_PREFIX
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


def _late_region(provider: LocalProvider, readd: bool) -> int:
    """``ns.late`` whose one snapshot (returned) predates its ``region`` column, field id 3. With ``readd`` the
    snapshot holds an older, dropped column of the same name (field id 2): not the filter's column, whose values
    must never stand in for it. Without it the old column is renamed ``old_region``."""
    catalog = provider.catalogs["wh"]
    table = catalog.create_table("ns.late", schema=pa.schema([("id", pa.int64()), ("region", pa.string())]))
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "region": ["EU", "US", None]}))
    before: int = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.rename_column("region", "old_region") if not readd else update.delete_column("region")
    with table.update_schema() as update:
        update.add_column("region", StringType())
    table = catalog.load_table("ns.late")
    table.append(pa.Table.from_pylist([{"id": 4, "region": "EU"}, {"id": 5}], schema=table.schema().as_arrow()))
    return before


def _region(op: str, value: Any = None) -> dict[str, Any]:
    node: dict[str, Any] = {"type": op, "term": "region"}
    if op in ("in", "not-in"):
        node["values"] = value
    elif value is not None:
        node["value"] = value
    return node


# (filter on the newer column, whether a row with that column null passes it): the expressions spec's two-valued
# logic, with ``not-*`` and ``not`` exact negations
NULL_REGION_FILTERS = [
    (_region("eq", "EU"), False),
    (_region("not-eq", "EU"), True),
    (_region("lt", "EU"), False),
    ({"type": "not", "child": _region("lt", "EU")}, True),
    (_region("in", ["EU", "US"]), False),
    (_region("not-in", ["EU"]), True),
    (_region("starts-with", "E"), False),
    (_region("not-starts-with", "E"), True),
    (_region("is-null"), True),
    (_region("not-null"), False),
]


@pytest.mark.parametrize("readd", [False, True])
@pytest.mark.parametrize(("row_filter", "null_passes"), NULL_REGION_FILTERS)
def test_time_travel_to_a_snapshot_without_the_filter_column_reads_it_as_null(
    write_provider: LocalProvider,
    session_factory: Any,
    readd: bool,
    row_filter: dict[str, Any],
    null_passes: bool,
) -> None:
    # Was: RestrictionApplyError ("field id 3 is not in the data being read"). Iceberg reads a field a data file
    # lacks as null (no initial-default): the filter sees null in every row of the older snapshot.
    before = _late_region(write_provider, readd)
    write_provider.restrictions["wh.ns.late"] = {"required-row-filter": row_filter}
    session = session_factory(write_provider)
    expected = [1, 2, 3] if null_passes else []
    old = f"ns.late FOR VERSION AS OF {before}"
    assert [r[0] for r in session.sql(f"SELECT id FROM {old} ORDER BY id").fetchall()] == expected
    assert session.sql(f"SELECT count(*) FROM {old}").fetchall() == [(len(expected),)]
    assert session.sql(f"SELECT id FROM {old} WHERE id = 1").fetchall() == ([(1,)] if null_passes else [])
    # the snapshot's own columns (its ``region`` is field id 2), never the hidden filter column
    assert session.sql(f"SELECT * FROM {old}").arrow().schema.names == ["id", "region"]
    with pytest.raises(SQEError):
        session.sql(f"SELECT {HIDDEN_PREFIX}3 FROM {old}").fetchall()


def test_a_filter_on_a_newer_column_combines_with_the_snapshots_columns(
    write_provider: LocalProvider, session_factory: Any
) -> None:
    before = _late_region(write_provider, readd=True)
    either = {"type": "or", "left": _region("eq", "EU"), "right": {"type": "eq", "term": "id", "value": 2}}
    write_provider.restrictions["wh.ns.late"] = {"required-row-filter": either}
    session = session_factory(write_provider)
    # the old ``region`` (field id 2) of row 1 is 'EU': not the filter's column, so only id = 2 passes
    assert session.sql(f"SELECT * FROM ns.late FOR VERSION AS OF {before}").fetchall() == [(2, "US")]
    assert [r[0] for r in session.sql("SELECT id FROM ns.late ORDER BY id").fetchall()] == [2, 4]


def test_time_travel_reads_a_newer_filter_column_as_its_initial_default(
    write_provider: LocalProvider, session_factory: Any
) -> None:
    catalog = write_provider.catalogs["wh"]
    table = catalog.create_table("ns.defaulted", schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([1, 2], pa.int64())}))
    before = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.add_column("region", StringType(), default_value="EU")
    session_rows = {}
    for op in ("eq", "not-eq"):
        write_provider.restrictions["wh.ns.defaulted"] = {"required-row-filter": _region(op, "EU")}
        session = session_factory(write_provider)
        session_rows[op] = session.sql(f"SELECT * FROM ns.defaulted FOR VERSION AS OF {before} ORDER BY id").fetchall()
        # the current snapshot reads the same file with the same default
        assert session.sql("SELECT id FROM ns.defaulted ORDER BY id").fetchall() == session_rows[op]
    assert session_rows == {"eq": [(1,), (2,)], "not-eq": []}


@pytest.mark.parametrize("op", ["eq", "gt-eq", "lt-eq", "not-eq"])
def test_a_filter_on_a_float_initial_default_keeps_the_rows_of_files_older_than_the_column(
    write_provider: LocalProvider, session_factory: Any, op: str
) -> None:
    # The older file's rows hold the default 0.1 as a float (0.1f), exactly as the newer row written with 0.1.
    # Before, the current read dropped them for eq and gt-eq: pyiceberg's reader compared the default as a double
    # (0.1) with the literal rounded to a float (0.1f) and ruled the whole file out; time travel (the column read
    # as a hidden filter column, not pushed) kept them, so the two reads of the same file disagreed.
    catalog = write_provider.catalogs["wh"]
    table = catalog.create_table("ns.floats", schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([1, 2], pa.int64())}))
    before = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.add_column("v", FloatType(), default_value=0.1)
    table = catalog.load_table("ns.floats")
    table.append(pa.Table.from_pylist([{"id": 3, "v": 0.1}], schema=table.schema().as_arrow()))
    write_provider.restrictions["wh.ns.floats"] = {"required-row-filter": {"type": op, "term": "v", "value": 0.1}}
    session = session_factory(write_provider)
    old = session.sql(f"SELECT id FROM ns.floats FOR VERSION AS OF {before} ORDER BY id").fetchall()
    now = session.sql("SELECT id FROM ns.floats ORDER BY id").fetchall()
    kept = op != "not-eq"  # 0.1f compared with the float literal 0.1f
    assert (old, now) == (([(1,), (2,)], [(1,), (2,), (3,)]) if kept else ([], []))


def test_time_travel_before_a_required_filter_column_without_default_fails_closed(
    write_provider: LocalProvider, session_factory: Any
) -> None:
    # No value is defined for the older rows (pyiceberg refuses such a file): refused before any file is read.
    catalog = write_provider.catalogs["wh"]
    table = catalog.create_table("ns.required", schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([1], pa.int64())}))
    before = table.current_snapshot().snapshot_id
    with table.update_schema(allow_incompatible_changes=True) as update:
        update.add_column("region", StringType(), required=True)
    write_provider.restrictions["wh.ns.required"] = {"required-row-filter": _region("not-eq", "EU")}
    session = session_factory(write_provider)
    with pytest.raises(RestrictionApplyError, match="initial-default"):
        session.sql(f"SELECT * FROM ns.required FOR VERSION AS OF {before}").fetchall()


def test_a_filter_on_a_struct_field_newer_than_the_snapshot(
    write_provider: LocalProvider, session_factory: Any
) -> None:
    catalog = write_provider.catalogs["wh"]
    schema = pa.schema([("id", pa.int64()), ("addr", pa.struct([("city", pa.string())]))])
    table = catalog.create_table("ns.nested", schema=schema)
    table.append(pa.table({"id": pa.array([1], pa.int64()), "addr": [{"city": "Oslo"}]}, schema=schema))
    before = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.add_column(("addr", "zip"), StringType())
        update.add_column("home", StructType(NestedField(10, "zip", StringType(), required=False)))
    table = catalog.load_table("ns.nested")
    zip_in_home = table.schema().find_field("home.zip").field_id
    session = session_factory(write_provider)
    # a struct newer than the snapshot: null there, and so are its fields
    write_provider.restrictions["wh.ns.nested"] = {
        "required-row-filter": {"type": "is-null", "child": {"type": "reference", "id": zip_in_home}}
    }
    assert session.sql(f"SELECT id FROM ns.nested FOR VERSION AS OF {before}").fetchall() == [(1,)]
    # a field newer than a struct the snapshot has: not read (the struct is the snapshot's), still refused
    zip_in_addr = table.schema().find_field("addr.zip").field_id
    write_provider.restrictions["wh.ns.nested"] = {
        "required-row-filter": {"type": "is-null", "child": {"type": "reference", "id": zip_in_addr}}
    }
    session = session_factory(write_provider)
    with pytest.raises(RestrictionApplyError):
        session.sql(f"SELECT id FROM ns.nested FOR VERSION AS OF {before}").fetchall()


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
