"""Row-filter columns a time-travel snapshot does not have: read as Iceberg reads a field a data file lacks.

The required row filter is bound to field ids of the table's *current* schema. A snapshot older than one of its
columns (added since, or dropped and added again under a new id) has no column of that id, so the query's own
projection does not read it. Iceberg's column projection rules still give every row of that snapshot a value
for the field: the file's own column of that id if it has one, else the identity partition value, else the
field's ``initial-default``, else null (https://iceberg.apache.org/spec/#column-projection). The filter is
evaluated on exactly that value, so the scan reads such a field as one more filter-only column, under a hidden
name no column of the snapshot has: pyiceberg's reader applies those rules per file, as it does for a current
read of a file written before the column was added, and the restriction step drops the column after filtering.
Masks need nothing of the kind: a column the snapshot lacks is not in its result.

Fail closed: a field that would have to be read whole but for which no value is defined (a required field
without ``initial-default``: pyiceberg refuses a file lacking it) is refused at planning, before any file is
opened. A filter field nested in a struct the snapshot has, whose child is newer, is not widened (the struct's
shape is the snapshot's); the filter step refuses it as before.
"""

from __future__ import annotations

from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StructType

from sqe.errors import RestrictionApplyError
from sqe.restrictions import RestrictionPlan

HIDDEN_PREFIX = "__sqe_absent_filter_field_"


def with_absent_filter_fields(projected: Schema, restrictions: RestrictionPlan, current: Schema) -> Schema:
    """``projected`` plus, under hidden names, each top-level field the row filter reads that it lacks."""
    present = {field.field_id for field in projected.fields}
    absent = sorted(restrictions.filter_field_ids - present)
    if not absent:
        return projected
    taken = {field.name.lower() for field in projected.fields}
    extra = [_hidden(_current_field(current, field_id), taken) for field_id in absent]
    return Schema(
        *projected.fields, *extra, schema_id=projected.schema_id, identifier_field_ids=projected.identifier_field_ids
    )


def _current_field(current: Schema, field_id: int) -> NestedField:
    """The current schema's top-level field; the filter was validated against that schema, so it is there."""
    for field in current.fields:
        if field.field_id == field_id:
            _require_defined_when_missing(field)
            return field
    raise RestrictionApplyError(f"row filter column field id {field_id} is not in the table schema")


def _require_defined_when_missing(field: NestedField) -> None:
    """A value Iceberg defines for files without the field: null (optional) or the initial-default. A struct with
    defaults (its own or its children's) is refused rather than guessed; without any it is read as null, and so
    are its children."""
    if field.required and field.initial_default is None:
        raise RestrictionApplyError(
            f"row filter column field id {field.field_id} is required, has no initial-default and is newer than "
            "the snapshot read: its value there is undefined"
        )
    if isinstance(field.field_type, StructType) and (
        field.initial_default is not None or _has_nested_default(field.field_type)
    ):
        raise RestrictionApplyError(
            f"row filter column field id {field.field_id} is a struct with default values and is newer than the "
            "snapshot read: its value there cannot be evaluated exactly"
        )


def _has_nested_default(struct: StructType) -> bool:
    for child in struct.fields:
        if child.initial_default is not None:
            return True
        if isinstance(child.field_type, StructType) and _has_nested_default(child.field_type):
            return True
    return False


def _hidden(field: NestedField, taken: set[str]) -> NestedField:
    """The field under a name no column of the scan has (names are compared as DuckDB and pyiceberg may)."""
    name = f"{HIDDEN_PREFIX}{field.field_id}"
    while name.lower() in taken:
        name = f"_{name}"
    taken.add(name.lower())
    return field.model_copy(update={"name": name})
