"""Administration operations shared by the REST endpoints and ``sqe-catalog admin``: one implementation each.

Every function takes already-authorized input, raises ``CatalogError`` subclasses (save-time policy errors
become 400 with their stable code and position in the message) and returns JSON-ready values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqe_catalog.errors import BadRequestError
from sqe_catalog.policies.errors import PolicyError
from sqe_catalog.policies.store import ObjectKind, Selector, TagTarget
from sqe_catalog.tables import WarehouseTables, validate_namespace, validate_table_name

__all__ = ["policy_errors", "removal_target", "selector_from_json", "tag_target", "target_from_json"]

_T = TypeVar("_T")


def policy_errors(action: Callable[[], _T]) -> _T:
    """Run ``action``; a PolicyError becomes a 400 that keeps its code (and position) in the message."""
    try:
        return action()
    except PolicyError as exc:
        raise BadRequestError(str(exc)) from None


def tag_target(
    tables: WarehouseTables, namespace: tuple[str, ...] | None, table: str | None, column: str | None
) -> TagTarget:
    """The object a tag goes on; a table or column must exist (its UUID and the column's field id are kept)."""
    named = removal_target(namespace, table, column)
    if named.kind is ObjectKind.WAREHOUSE:
        return named
    if named.kind is ObjectKind.NAMESPACE:
        tables.load_namespace(named.namespace)  # NoSuchNamespaceError when missing
        return named
    loaded = tables.load_table(named.namespace, named.table)
    uuid = str(loaded.metadata.table_uuid)
    if named.kind is ObjectKind.TABLE:
        return TagTarget(ObjectKind.TABLE, named.namespace, loaded.name, table_uuid=uuid)
    matches = [f for f in loaded.metadata.schema().fields if f.name == named.column]
    if len(matches) != 1:
        raise BadRequestError(f"the table has no top-level column {named.column!r} (only top-level columns are tagged)")
    return TagTarget(ObjectKind.COLUMN, named.namespace, loaded.name, named.column, uuid, matches[0].field_id)


def removal_target(namespace: tuple[str, ...] | None, table: str | None, column: str | None) -> TagTarget:
    """The object a tag is removed from, by its names alone. Tags stay on a dropped table's name and column tags
    on every name a column has had, selecting policies by name: a policy manager must be able to remove such a
    tag although no table or column has the name now (the store removes by names only)."""
    if namespace is None:
        if table is not None or column is not None:
            raise BadRequestError("a table or column tag needs a namespace")
        return TagTarget(ObjectKind.WAREHOUSE)
    namespace = validate_namespace(list(namespace))
    if table is None:
        if column is not None:
            raise BadRequestError("a column tag needs a table")
        return TagTarget(ObjectKind.NAMESPACE, namespace)
    table = validate_table_name(table)
    if column is None:
        return TagTarget(ObjectKind.TABLE, namespace, table)
    return TagTarget(ObjectKind.COLUMN, namespace, table, column)


def target_from_json(tables: WarehouseTables, body: object, *, removal: bool = False) -> TagTarget:
    """``{"namespace": [...]?, "table": T?, "column": C?}`` (nothing: the warehouse); for a ``removal`` by names
    alone (``removal_target``)."""
    if not isinstance(body, dict) or set(body) - {"namespace", "table", "column"}:
        raise BadRequestError("object must be {namespace?, table?, column?}")
    namespace = body.get("namespace")
    table, column = body.get("table"), body.get("column")
    if namespace is not None and not isinstance(namespace, list):
        raise BadRequestError("object.namespace must be a list of strings")
    if (table is not None and not isinstance(table, str)) or (column is not None and not isinstance(column, str)):
        raise BadRequestError("object.table and object.column must be strings")
    names = tuple(namespace) if namespace is not None else None
    return removal_target(names, table, column) if removal else tag_target(tables, names, table, column)


def selector_from_json(body: object) -> Selector:
    """``{"tag": T, "selector": "ALL_VALUES"}`` or ``{"tag": T, "selector": "TAG_VALUE", "value": V}``."""
    if not isinstance(body, dict) or not isinstance(body.get("tag"), str):
        raise BadRequestError("a policy-on-tag selector needs a string 'tag'")
    kind = body.get("selector", "ALL_VALUES")
    if kind == "ALL_VALUES":
        if set(body) - {"tag", "selector"}:
            raise BadRequestError("an ALL_VALUES selector has no value")
        return Selector(str(body["tag"]), None)
    if kind == "TAG_VALUE":
        if set(body) - {"tag", "selector", "value"} or not isinstance(body.get("value"), str):
            raise BadRequestError("a TAG_VALUE selector needs a string 'value'")
        return Selector(str(body["tag"]), str(body["value"]))
    raise BadRequestError("selector must be ALL_VALUES or TAG_VALUE")
