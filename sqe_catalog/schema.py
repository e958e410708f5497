"""The catalog database's one SQLAlchemy ``MetaData``: every store declares its tables on it.

One schema root means one ``create_all`` creates a consistent database, and a store that needs another store's
table (restrictions checking that a principal exists) references that table object instead of re-declaring it.
The column helpers keep the widths of the names every store records (warehouse, encoded namespace, object name)
in one place, so a name that fits one table fits all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Column, Engine, MetaData, String, Table, Text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import SchemaItem

__all__ = [
    "METADATA",
    "VIEW_POINTERS",
    "create_tables",
    "object_key",
    "trusted_state_columns",
    "warehouse_key",
    "warehouse_table",
]

METADATA = MetaData()

WAREHOUSE_LENGTH = 255
NAMESPACE_LENGTH = 1024  # the namespace levels joined by the wire separator
NAME_LENGTH = 255


def warehouse_key() -> Column[str]:
    """A fresh primary-key ``warehouse`` column: every catalog row belongs to one warehouse."""
    return Column("warehouse", String(WAREHOUSE_LENGTH), primary_key=True)


def warehouse_table(name: str, *columns: SchemaItem) -> Table:
    """A table on ``METADATA`` whose key starts with the ``warehouse`` it belongs to, then ``columns``."""
    return Table(name, METADATA, warehouse_key(), *columns)


def object_key(name_column: str = "table_name", *, primary_key: bool = True) -> tuple[Column[str], ...]:
    """Fresh ``warehouse``, ``namespace`` and ``name_column`` columns naming one table or view, never NULL.

    ``primary_key=False`` where the row is keyed otherwise (an id, a table UUID) and only records the name."""
    return (
        warehouse_key() if primary_key else Column("warehouse", String(WAREHOUSE_LENGTH), nullable=False),
        Column("namespace", String(NAMESPACE_LENGTH), primary_key=primary_key, nullable=False),
        Column(name_column, String(NAME_LENGTH), primary_key=primary_key, nullable=False),
    )


# Each view's pointer: the metadata file its current version is in. Declared here, not in ``views``, because the
# tables' location check reads it too (a table must not overlap a view's location) and ``views`` imports ``tables``.
VIEW_POINTERS = Table(
    "sqe_catalog_views",
    METADATA,
    *object_key("view_name"),
    Column("metadata_location", String(2048), nullable=False),
)


def trusted_state_columns() -> tuple[Column[str], ...]:
    """Fresh columns for a table's trusted integrity state beside its metadata location (all nullable: a
    ``None`` key id pins the absence of ``encryption.key-id``; plaintext tables have no digest)."""
    return (
        Column("key_id", Text, nullable=True),
        Column("digest", String(128), nullable=True),
        Column("digest_version", String(64), nullable=True),
    )


def create_tables(engine: Engine, tables: Sequence[Table] | None = None) -> None:
    """Create ``tables`` (default: every table on ``METADATA``) where missing; safe from several processes at once.

    Another process may create a table between the existence check and the ``CREATE``: the second pass checks
    again and finds it."""
    try:
        METADATA.create_all(engine, tables=tables, checkfirst=True)
    except DBAPIError:
        METADATA.create_all(engine, tables=tables, checkfirst=True)
