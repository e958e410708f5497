"""Catalog DDL and discovery in SQL: what SHOW / DESCRIBE print and how CREATE / ALTER become catalog calls.

Everything here answers from the catalog as the session's user (the provider's lists are what the catalog lets
this user see) and from the table metadata the catalog handed out; DuckDB only parses SQL types.
Schema changes go through pyiceberg's ``update_schema`` on the loaded table, whose catalog is SQE's own REST
client, so the change is one catalog commit with the usual requirements (a concurrent change is a 409).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
from pyiceberg import types as ice
from pyiceberg.catalog import Catalog

from sqe._text import first_line
from sqe.catalog.errors import PYICEBERG_CATALOG_ERRORS, translate_error
from sqe.duckdb_connection import connect_locked_down, quote_ident
from sqe.errors import QueryError, RestrictedTableError, SQEError
from sqe.planning.planner import restrictions_of

if TYPE_CHECKING:
    from sqe.catalog.base import LoadedTable, TableIdent
    from sqe.planning.statements import AlterAction
    from sqe.restrictions import RestrictionPlan

_SIMPLE_TYPES: dict[type[ice.IcebergType], str] = {
    ice.BooleanType: "BOOLEAN",
    ice.IntegerType: "INTEGER",
    ice.LongType: "BIGINT",
    ice.FloatType: "REAL",
    ice.DoubleType: "DOUBLE",
    ice.DateType: "DATE",
    ice.TimeType: "TIME",
    ice.TimestampType: "TIMESTAMP",
    ice.TimestamptzType: "TIMESTAMP WITH TIME ZONE",
    ice.StringType: "VARCHAR",
    ice.UUIDType: "UUID",
    ice.BinaryType: "BLOB",
    ice.FixedType: "BLOB",
}


def sql_type(iceberg_type: ice.IcebergType) -> str:
    """The SQL (DuckDB/Trino-style) spelling of an Iceberg type."""
    if isinstance(iceberg_type, ice.DecimalType):
        return f"DECIMAL({iceberg_type.precision}, {iceberg_type.scale})"
    if isinstance(iceberg_type, ice.ListType):
        return f"{sql_type(iceberg_type.element_type)}[]"
    if isinstance(iceberg_type, ice.MapType):
        return f"MAP({sql_type(iceberg_type.key_type)}, {sql_type(iceberg_type.value_type)})"
    if isinstance(iceberg_type, ice.StructType):
        inner = ", ".join(f"{quote_ident(f.name)} {sql_type(f.field_type)}" for f in iceberg_type.fields)
        return f"STRUCT({inner})"
    for kind, name in _SIMPLE_TYPES.items():
        if isinstance(iceberg_type, kind):
            return name
    return str(iceberg_type).upper()


def describe_rows(loaded: LoadedTable, restrictions: RestrictionPlan) -> pa.Table:
    """DESCRIBE / ``\\d``: one row per column with its SQL and Iceberg type, nullability and mask."""
    schema = loaded.table.schema()
    masks = {m.field_id: m.action for m in restrictions.column_masks}
    return pa.table(
        {
            "column_name": [f.name for f in schema.columns],
            "column_type": [sql_type(f.field_type) for f in schema.columns],
            "iceberg_type": [str(f.field_type) for f in schema.columns],
            "required": [f.required for f in schema.columns],
            "masked": [masks.get(f.field_id, "") for f in schema.columns],
        }
    )


def show_create_table(loaded: LoadedTable) -> str:
    """A CREATE TABLE statement for the table's current schema (and partitioning, as a comment-free clause)."""
    metadata = loaded.table.metadata
    schema = metadata.schema()
    columns = ",\n".join(
        f"  {quote_ident(f.name)} {sql_type(f.field_type)}{' NOT NULL' if f.required else ''}" for f in schema.columns
    )
    text = f"CREATE TABLE {'.'.join(quote_ident(p) for p in _name_parts(loaded.ident))} (\n{columns}\n)"
    spec = metadata.spec()
    if spec.fields:
        parts = []
        for field in spec.fields:
            source = schema.find_column_name(field.source_id) or str(field.source_id)
            transform = str(field.transform)
            parts.append(quote_ident(source) if transform == "identity" else f"{transform}({quote_ident(source)})")
        text += f"\nPARTITIONED BY ({', '.join(parts)})"
    return text


def show_schemas(warehouse: str, namespaces: Sequence[tuple[str, ...]]) -> pa.Table:
    schema = pa.schema([("warehouse", pa.string()), ("schema", pa.string())])
    rows = [{"warehouse": warehouse, "schema": ".".join(ns)} for ns in sorted(namespaces)]
    return pa.Table.from_pylist(rows, schema=schema)


def arrow_schema_of_columns(columns_text: str) -> pa.Schema:
    """The Arrow schema of a ``(name type [NOT NULL], ...)`` list, parsed by DuckDB on a throw-away connection."""
    con = connect_locked_down()
    try:
        con.execute(f"CREATE TABLE __sqe_shape {columns_text}")
        shape = con.sql("SELECT * FROM __sqe_shape LIMIT 0").to_arrow_table().schema
        required = {
            str(name)
            for name, nullable in con.execute(
                "SELECT column_name, is_nullable FROM duckdb_columns() WHERE table_name = '__sqe_shape'"
            ).fetchall()
            if not nullable
        }
    except duckdb.Error as exc:
        raise QueryError(f"bad column list: {first_line(exc)}") from None
    finally:
        con.close()
    return pa.schema([f.with_nullable(f.name not in required) for f in shape])


def iceberg_type_of(type_text: str) -> ice.IcebergType:
    """An SQL type (as DuckDB reads it) as the Iceberg type a new column gets."""
    shape = arrow_schema_of_columns(f"(c {type_text})")
    converted = Catalog._convert_schema_if_needed(shape)
    return converted.find_field("c").field_type


def alter_table(loaded: LoadedTable, action: AlterAction) -> None:
    """One schema change, committed through the table's catalog (SQE's REST client). Refused to a user with
    read-restrictions on the table, as DML and OPTIMIZE are: dropping a masked column would end its mask while
    its raw values stay readable in older snapshots."""
    plan = restrictions_of(loaded)
    if plan.is_restricted:
        raise RestrictedTableError(f"ALTER TABLE is refused: {loaded.ident} has read-restrictions for you")
    try:
        with loaded.table.update_schema() as update:
            if action.action == "add":
                assert action.type_text is not None
                update.add_column(action.column, iceberg_type_of(action.type_text))
            elif action.action == "rename":
                assert action.new_name is not None
                update.rename_column(action.column, action.new_name)
            else:
                update.delete_column(action.column)
    except SQEError:
        raise
    except PYICEBERG_CATALOG_ERRORS as exc:
        raise translate_error(exc, f"schema change of {loaded.ident}") from None
    except (ValueError, KeyError) as exc:  # unknown column, duplicate name, incompatible type
        raise QueryError(f"cannot change the schema of {loaded.ident}: {first_line(exc)}") from None


def _name_parts(ident: TableIdent) -> tuple[str, ...]:
    return (ident.warehouse, *ident.namespace, ident.name)
