"""Matching the columns of an Arrow batch to Iceberg field ids (field-id metadata first, then names)."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.schema import Schema

from sqe.errors import RestrictionApplyError
from sqe.restrictions.schema_index import SchemaIndex

FIELD_ID_KEY = b"PARQUET:field_id"


def arrow_field_id(field: pa.Field) -> int | None:
    """The Iceberg field id pyiceberg writes into Arrow field metadata, if present."""
    raw = (field.metadata or {}).get(FIELD_ID_KEY)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise RestrictionApplyError(f"column '{field.name}' has a malformed field-id") from None


class BatchColumns:
    """Top-level columns of one batch by field id; nested struct fields resolved by path."""

    def __init__(self, batch: pa.RecordBatch, schema: Schema) -> None:
        self.batch = batch
        self.index = SchemaIndex(schema)
        top_level_by_name = {field.name: field.field_id for field in schema.fields}
        self.field_ids: list[int] = []
        for field in batch.schema:
            field_id = arrow_field_id(field)
            if field_id is None:
                field_id = top_level_by_name.get(field.name)
            if field_id is None:
                raise RestrictionApplyError(f"column '{field.name}' cannot be matched to a table field")
            self.field_ids.append(field_id)
        self._position = {field_id: position for position, field_id in enumerate(self.field_ids)}
        if len(self._position) != len(self.field_ids):
            raise RestrictionApplyError("the batch holds two columns with the same field id")

    def position(self, field_id: int) -> int | None:
        return self._position.get(field_id)

    def resolve(self, path: tuple[int, ...]) -> pa.Array | None:
        """The values of the field at ``path`` (top-level id first), or None if the batch lacks it.

        A null struct makes its children null: StructArray.flatten merges the parent's validity.
        """
        position = self._position.get(path[0])
        if position is None:
            return None
        array: pa.Array = self.batch.column(position)
        for child_id in path[1:]:
            if not isinstance(array, pa.StructArray):
                return None
            child_position = _child_position(array.type, child_id, self.index)
            if child_position is None:
                return None
            array = array.flatten()[child_position]
        return array


def _child_position(struct_type: pa.StructType, field_id: int, index: SchemaIndex) -> int | None:
    info = index.get(field_id)
    for position in range(struct_type.num_fields):
        child = struct_type.field(position)
        child_id = arrow_field_id(child)
        if child_id == field_id or (child_id is None and info is not None and child.name == info.field.name):
            return position
    return None
