"""The ids a commit's updates give schemas, partition specs and sort orders, and the table UUID it keeps.

The table spec makes schema, spec and sort-order ids unique in a table's metadata, and readers find a data file's
spec and a snapshot's schema by id. pyiceberg's update code (written for clients, not a catalog) appends what an
``add-schema`` / ``add-spec`` / ``add-sort-order`` carries as it is, so a client sending one whose id is taken, or
one the table already has, left two entries with one id. Here, as Iceberg's reference catalog does, an added one
equal to one the table has reuses that id (the update is dropped), one whose id is taken gets the next free id, and
a following ``set-current-schema`` / ``set-default-spec`` / ``set-default-sort-order`` naming the added one (or -1,
"the last added") names the id it ended up with. An ``assign-uuid`` may not change an existing table's UUID:
clients refuse metadata whose UUID changed, and the catalog matches column tags by it.

A partition field id names the partition tuple's field in every manifest written with its spec, so one id must mean
one source column and transform across all of a table's specs. A spec is new when no spec the table has has the
same source columns, transforms and names (field ids aside). In format v2 and later, a new spec's field with the
same source column and transform as a field of an earlier spec takes that field's id, and any other field a fresh
one above ``last-partition-id``: the ids the client sent are not kept. In v1, ids were not tracked but given by
position (1000, 1001, ...): a v1 spec with other ids is refused, as Iceberg's reference catalog does.

A commit that also adds a snapshot wrote its manifests (spec id, partition field ids) and named its schema before
the catalog saw it: there a sent partition field id that clashes with nothing (unused, or naming the same source
column and transform already) is kept, and an id the catalog would still change is refused instead of changed,
since the snapshot would then point at another schema or spec than the one it was written with. pyiceberg, which
recycles a field's id only in v2 and under the same name, and Java send ids that are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.partitioning import PARTITION_FIELD_ID_START, PartitionField, PartitionSpec
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AddSortOrderUpdate,
    AssignUUIDUpdate,
    SetCurrentSchemaUpdate,
    SetDefaultSortOrderUpdate,
    SetDefaultSpecUpdate,
    TableUpdate,
    UpgradeFormatVersionUpdate,
)

from sqe_catalog.errors import BadRequestError

__all__ = ["assigned_ids"]

_LAST_ADDED = -1
_MAX_FIELD_ID = 2**31 - 1  # Iceberg ids are 32-bit signed ints: Java's readers fail on a larger one


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


def _same_spec(a: Any, b: Any) -> bool:
    # Field ids aside: the catalog gives an added spec's fields their ids.
    return bool(a.compatible_with(b))


_FieldKey = tuple[int, str]  # a partition field's source column id and transform


@dataclass
class _PartitionFieldIds:
    """The partition field ids a table's specs use, the last one assigned, and the table's format version."""

    by_key: dict[_FieldKey, int]
    last: int
    format_version: int
    keep_sent: bool = False  # the commit adds a snapshot: its manifests were written with the sent ids
    by_id: dict[int, _FieldKey] = field(default_factory=dict)
    moved: list[str] = field(default_factory=list)  # the sent field ids the catalog changed, as "name: sent -> id"

    @classmethod
    def of(cls, base: TableMetadata | None, keep_sent: bool) -> _PartitionFieldIds:
        if base is None:  # a create starts from empty v1 metadata; its upgrade-format-version comes first
            return cls({}, PARTITION_FIELD_ID_START - 1, 1, keep_sent)
        ids = cls({}, base.last_partition_id or PARTITION_FIELD_ID_START - 1, base.format_version, keep_sent)
        for spec in base.partition_specs:
            ids.record(spec)
        return ids

    def record(self, spec: PartitionSpec) -> None:
        for spec_field in spec.fields:
            key = _key(spec_field)
            self.by_key[key] = max(spec_field.field_id, self.by_key.get(key, spec_field.field_id))
            self.by_id[spec_field.field_id] = key
            self.last = max(self.last, spec_field.field_id)

    def assign(self, spec: PartitionSpec) -> PartitionSpec:
        """``spec`` with the field ids the table's specs give its fields (recorded for the specs after it)."""
        if self.format_version == 1:
            _check_positional_ids(spec)
            assigned = spec
        else:
            assigned = PartitionSpec(*self._reused_or_fresh(spec.fields), spec_id=spec.spec_id)
            for sent, kept in zip(spec.fields, assigned.fields, strict=True):
                if sent.field_id != kept.field_id:
                    self.moved.append(f"partition field {sent.name!r}: {sent.field_id} -> {kept.field_id}")
        self.record(assigned)
        return assigned

    def _reused_or_fresh(self, fields: Iterable[PartitionField]) -> Iterable[PartitionField]:
        taken: set[int] = set()
        for spec_field in fields:
            field_id: int | None = self.by_key.get(_key(spec_field))
            if self.keep_sent and self._may_keep(spec_field, taken):
                field_id = spec_field.field_id
                self.last = max(self.last, field_id)
            if field_id is None or field_id in taken:  # a field repeated within the spec gets an id of its own
                field_id = self._fresh()
            taken.add(field_id)
            yield spec_field.model_copy(update={"field_id": field_id})

    def _may_keep(self, spec_field: PartitionField, taken: set[int]) -> bool:
        """Whether a sent id means only this field: unused, or used by the same source column and transform.
        (A fresh id for a field an earlier spec had, as pyiceberg sends in v3, is valid Iceberg.)"""
        field_id = spec_field.field_id
        unused_or_same = self.by_id.get(field_id, _key(spec_field)) == _key(spec_field)
        return PARTITION_FIELD_ID_START <= field_id <= _MAX_FIELD_ID and field_id not in taken and unused_or_same

    def _fresh(self) -> int:
        if self.last >= _MAX_FIELD_ID:
            raise BadRequestError(
                f"invalid table update: add-spec: no partition field id is left above last-partition-id {self.last}"
            )
        self.last += 1
        return self.last


def _key(spec_field: PartitionField) -> _FieldKey:
    return spec_field.source_id, str(spec_field.transform)


def _check_positional_ids(spec: PartitionSpec) -> None:
    for position, spec_field in enumerate(spec.fields):
        expected = PARTITION_FIELD_ID_START + position
        if spec_field.field_id != expected:
            raise BadRequestError(
                f"invalid table update: add-spec: a format v1 table's partition field ids follow their position "
                f"from {PARTITION_FIELD_ID_START}; field {spec_field.name!r} has field-id {spec_field.field_id}, "
                f"expected {expected}"
            )


def assigned_ids(base: TableMetadata | None, updates: Sequence[TableUpdate]) -> tuple[TableUpdate, ...]:
    """``updates`` with unique schema, spec and sort-order ids (``base``: the table's metadata, None on create)."""
    _check_uuid(base, updates)
    schemas = _Ids({s.schema_id: s for s in base.schemas} if base else {}, _same_schema)
    specs = _Ids({s.spec_id: s for s in base.partition_specs} if base else {}, _same_spec)
    orders = _Ids({s.order_id: s for s in base.sort_orders} if base else {}, _same_fields)
    adds_snapshot = any(isinstance(update, AddSnapshotUpdate) for update in updates)
    field_ids = _PartitionFieldIds.of(base, keep_sent=adds_snapshot)
    assigned = tuple(_assigned(updates, schemas, specs, field_ids, orders))
    if adds_snapshot:
        _refuse_moved_ids(schemas, specs, field_ids)
    return assigned


def _refuse_moved_ids(schemas: _Ids, specs: _Ids, field_ids: _PartitionFieldIds) -> None:
    """A snapshot added in the same commit names its schema, and its manifests their spec and partition field ids,
    as the client sent them: an id the catalog would change is refused rather than left pointing elsewhere."""
    moved = [f"schema {sent} -> {kept}" for sent, kept in schemas.added.items() if sent != kept]
    moved += [f"partition spec {sent} -> {kept}" for sent, kept in specs.added.items() if sent != kept]
    moved += field_ids.moved
    if moved:
        raise BadRequestError(
            "invalid table update: this commit adds a snapshot written with ids the catalog assigns otherwise "
            f"({', '.join(moved)}): add the schema or spec in a commit of its own, or with these ids"
        )


def _check_uuid(base: TableMetadata | None, updates: Iterable[TableUpdate]) -> None:
    if base is None:
        return
    for update in updates:
        if isinstance(update, AssignUUIDUpdate) and update.uuid != base.table_uuid:
            raise BadRequestError("invalid table update: assign-uuid cannot change an existing table's table-uuid")


def _assigned(
    updates: Iterable[TableUpdate], schemas: _Ids, specs: _Ids, field_ids: _PartitionFieldIds, orders: _Ids
) -> Iterable[TableUpdate]:
    for update in updates:
        if isinstance(update, AddSchemaUpdate):
            yield from _added(update, "schema_", "schema_id", schemas)
        elif isinstance(update, AddPartitionSpecUpdate):
            yield from _added_spec(update, specs, field_ids)
        elif isinstance(update, UpgradeFormatVersionUpdate):
            # a downgrade is left for pyiceberg to refuse
            field_ids.format_version = max(field_ids.format_version, update.format_version)
            yield update
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


def _added_spec(update: AddPartitionSpecUpdate, specs: _Ids, field_ids: _PartitionFieldIds) -> Iterable[TableUpdate]:
    """The add-spec update with its spec's id and field ids; nothing when the table already has the spec."""
    spec_id = specs.add(update.spec, update.spec.spec_id)
    if spec_id is not None:
        spec = field_ids.assign(update.spec).model_copy(update={"spec_id": spec_id})
        yield update.model_copy(update={"spec": spec})
