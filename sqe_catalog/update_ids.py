"""The ids a commit's updates give schemas, partition specs and sort orders, and the table UUID it keeps.

The table spec makes schema, spec and sort-order ids unique in a table's metadata, and readers find a data file's
spec and a snapshot's schema by id. pyiceberg's update code (written for clients, not a catalog) appends what an
``add-schema`` / ``add-spec`` / ``add-sort-order`` carries as it is, so a client sending one whose id is taken, or
one the table already has, left two entries with one id. Here, as Iceberg's reference catalog does, an added one
equal to one the table has reuses that id (the update is dropped), one whose id is taken gets the next free id, and
a following ``set-current-schema`` / ``set-default-spec`` / ``set-default-sort-order`` naming the added one (or -1,
"the last added") names the id it ended up with. An ``assign-uuid`` may not change an existing table's UUID:
clients refuse metadata whose UUID changed, and the catalog matches column tags by it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AddSchemaUpdate,
    AddSortOrderUpdate,
    AssignUUIDUpdate,
    SetCurrentSchemaUpdate,
    SetDefaultSortOrderUpdate,
    SetDefaultSpecUpdate,
    TableUpdate,
)

from sqe_catalog.errors import BadRequestError

__all__ = ["assigned_ids"]

_LAST_ADDED = -1


@dataclass
class _Ids:
    """One kind of id (schemas, specs or sort orders): what the table holds and what this commit added."""

    known: dict[int, Any]  # id -> the schema / spec / sort order
    same: Callable[[Any, Any], bool]
    added: dict[int, int] = field(default_factory=dict)  # the client's id -> the id it ended up with
    last_added: int | None = None

    def add(self, item: Any, client_id: int) -> int | None:
        """The id ``item`` ends up with; None when the table already has it (the update is dropped)."""
        for existing_id, existing in self.known.items():
            if self.same(existing, item):
                self.added[client_id], self.last_added = existing_id, existing_id
                return None
        new_id = client_id if client_id not in self.known and client_id >= 0 else max(self.known, default=-1) + 1
        self.known[new_id] = item
        self.added[client_id], self.last_added = new_id, new_id
        return new_id

    def target(self, requested: int) -> int:
        """The id a set-current/default update names: "last added" and an added one resolved."""
        if requested == _LAST_ADDED and self.last_added is not None:
            return self.last_added
        return self.added.get(requested, requested)


def _same_schema(a: Any, b: Any) -> bool:
    return bool(a.fields == b.fields and set(a.identifier_field_ids) == set(b.identifier_field_ids))


def _same_fields(a: Any, b: Any) -> bool:
    return bool(a.fields == b.fields)


def assigned_ids(base: TableMetadata | None, updates: Sequence[TableUpdate]) -> tuple[TableUpdate, ...]:
    """``updates`` with unique schema, spec and sort-order ids (``base``: the table's metadata, None on create)."""
    _check_uuid(base, updates)
    schemas = _Ids({s.schema_id: s for s in base.schemas} if base else {}, _same_schema)
    specs = _Ids({s.spec_id: s for s in base.partition_specs} if base else {}, _same_fields)
    orders = _Ids({s.order_id: s for s in base.sort_orders} if base else {}, _same_fields)
    return tuple(_assigned(updates, schemas, specs, orders))


def _check_uuid(base: TableMetadata | None, updates: Iterable[TableUpdate]) -> None:
    if base is None:
        return
    for update in updates:
        if isinstance(update, AssignUUIDUpdate) and update.uuid != base.table_uuid:
            raise BadRequestError("invalid table update: assign-uuid cannot change an existing table's table-uuid")


def _assigned(updates: Iterable[TableUpdate], schemas: _Ids, specs: _Ids, orders: _Ids) -> Iterable[TableUpdate]:
    for update in updates:
        if isinstance(update, AddSchemaUpdate):
            yield from _added(update, "schema_", "schema_id", schemas)
        elif isinstance(update, AddPartitionSpecUpdate):
            yield from _added(update, "spec", "spec_id", specs)
        elif isinstance(update, AddSortOrderUpdate):
            yield from _added(update, "sort_order", "order_id", orders)
        elif isinstance(update, SetCurrentSchemaUpdate):
            yield update.model_copy(update={"schema_id": schemas.target(update.schema_id)})
        elif isinstance(update, SetDefaultSpecUpdate):
            yield update.model_copy(update={"spec_id": specs.target(update.spec_id)})
        elif isinstance(update, SetDefaultSortOrderUpdate):
            yield update.model_copy(update={"sort_order_id": orders.target(update.sort_order_id)})
        else:
            yield update


def _added(update: TableUpdate, attribute: str, id_attribute: str, ids: _Ids) -> Iterable[TableUpdate]:
    """The add update with the id its item ends up with; nothing when the table already has the item."""
    item = getattr(update, attribute)
    new_id = ids.add(item, getattr(item, id_attribute))
    if new_id is not None:
        yield update.model_copy(update={attribute: item.model_copy(update={id_attribute: new_id})})
