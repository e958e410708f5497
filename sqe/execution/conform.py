"""Rows on their way into an Iceberg data file, in the table's Arrow shape.

DuckDB hands back Arrow whose nested fields are all nullable. Iceberg lets a required field sit inside an optional
struct, list or map: a NULL struct is a valid row, and its required child holds no value there. Arrow's cast checks
a non-nullable child over every slot, the NULL parents' too, so it refused such rows. Here a required child is
checked only where its parent holds a value, and its validity is dropped once that check has passed.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from sqe._text import counted, first_line
from sqe.errors import QueryError

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

    from sqe.catalog.base import TableIdent

__all__ = ["conform_for_write"]


def conform_for_write(rows: pa.Table, schema: Schema, ident: TableIdent) -> pa.Table:
    """DuckDB's rows in the Iceberg table's Arrow shape; NULL in a required column or field is refused."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    target = schema_to_pyarrow(schema, include_field_ids=False)
    if rows.num_columns != len(target):
        raise QueryError(f"{ident} has {counted(len(target), 'column')}, the statement produced {rows.num_columns}")
    columns = []
    for column, f in zip(rows.columns, target, strict=True):
        if not f.nullable and column.null_count:
            raise QueryError(f"NULL value in required column {f.name!r} of {ident}")
        try:
            columns.append(_conform_column(column, f))
        except _RequiredFieldNull as missing:
            raise QueryError(f"NULL value in required field {missing.path!r} of {ident}") from None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise QueryError(f"cannot write column {f.name!r} of {ident}: {first_line(exc)}") from None
    return pa.Table.from_arrays(columns, schema=target)


class _RequiredFieldNull(Exception):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def _conform_column(column: pa.ChunkedArray, target: pa.Field) -> pa.ChunkedArray:
    if column.type == target.type:
        return column
    if not _rebuilt(target.type):
        return column.cast(target.type)
    relaxed = column.cast(_relaxed(target.type))
    chunks = [_with_required(chunk, target.type, target.name, None) for chunk in relaxed.chunks]
    return pa.chunked_array(chunks, type=target.type)


def _uuids(texts: pa.Array, uuid_type: pa.UuidType) -> pa.Array:
    """DuckDB hands a UUID back as its text, and Arrow casts no text to Iceberg's 16-byte uuid: parsed here."""
    try:
        values = [None if text is None else uuid.UUID(text).bytes for text in texts.to_pylist()]
    except ValueError as exc:
        raise pa.ArrowInvalid(f"not a UUID: {exc}") from None
    return pa.ExtensionArray.from_storage(uuid_type, pa.array(values, uuid_type.storage_type))


def _children(arrow_type: pa.DataType) -> list[pa.Field]:
    if pa.types.is_struct(arrow_type):
        return list(arrow_type)
    if pa.types.is_map(arrow_type):
        return [arrow_type.key_field, arrow_type.item_field]
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return [arrow_type.value_field]
    return []


def _rebuilt(arrow_type: pa.DataType) -> bool:
    """Whether a cast cannot reach ``arrow_type``: a required field nested in it, or a uuid anywhere."""
    if isinstance(arrow_type, pa.UuidType):
        return True
    return any(not f.nullable or _rebuilt(f.type) for f in _children(arrow_type))


def _relaxed(arrow_type: pa.DataType) -> pa.DataType:
    """``arrow_type`` with every nested field nullable and uuids as text: what a cast of DuckDB's rows can reach."""
    if isinstance(arrow_type, pa.UuidType):
        return pa.string()
    if pa.types.is_struct(arrow_type):
        return pa.struct([_relaxed_field(f) for f in arrow_type])
    if pa.types.is_map(arrow_type):
        key = arrow_type.key_field  # never NULL itself (Arrow's map refuses it), but what it nests may be
        return pa.map_(key.with_type(_relaxed(key.type)), _relaxed_field(arrow_type.item_field))
    if pa.types.is_large_list(arrow_type):
        return pa.large_list(_relaxed_field(arrow_type.value_field))
    if pa.types.is_list(arrow_type):
        return pa.list_(_relaxed_field(arrow_type.value_field))
    return arrow_type


def _relaxed_field(f: pa.Field) -> pa.Field:
    return f.with_type(_relaxed(f.type)).with_nullable(True)


def _with_required(array: pa.Array, target: pa.DataType, path: str, present: pa.Array | None) -> pa.Array:
    """``array`` (of ``_relaxed(target)``) as ``target``; ``present``: its slots whose parents all hold a value
    (None: every slot). Below it, a required field's NULL is refused at a present slot and dropped elsewhere."""
    if pa.types.is_struct(target):
        here = _present_here(array, present)
        children = [_child(array.field(i), f, path, here) for i, f in enumerate(target)]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=_null_mask(array))
    if pa.types.is_map(target) or pa.types.is_list(target) or pa.types.is_large_list(target):
        return _nested_list(array, target, path, present)
    if isinstance(target, pa.UuidType):
        return _uuids(array, target)
    return array


def _present_here(array: pa.Array, present: pa.Array | None) -> pa.Array:
    return array.is_valid() if present is None else pc.and_(present, array.is_valid())


def _null_mask(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def _child(child: pa.Array, f: pa.Field, path: str, present: pa.Array) -> pa.Array:
    """A child at the slots of its parent (``present``: where its ancestors all hold a value), in its target type."""
    name = f"{path}.{f.name}"
    if not f.nullable and child.null_count and pc.any(pc.and_(child.is_null(), present)).as_py():
        raise _RequiredFieldNull(name)
    conformed = _with_required(child, f.type, name, present)
    if f.nullable or not conformed.null_count:
        return conformed
    return _without_nulls(conformed)  # NULL only where an ancestor is: never read


def _without_nulls(array: pa.Array) -> pa.Array:
    """``array`` marked as holding a value at every slot (its NULL slots' values are whatever lies beneath)."""
    if pa.types.is_struct(array.type):
        children = [array.field(i) for i in range(array.type.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(array.type))
    if pa.types.is_map(array.type):
        listed = _as_list(array)
        entries = pc.list_flatten(listed)
        offsets = _offsets(listed).cast(pa.int32())
        return pa.MapArray.from_arrays(offsets, entries.field(0), entries.field(1), type=array.type)
    if isinstance(array, pa.ExtensionArray):
        return pa.ExtensionArray.from_storage(array.type, _without_nulls(array.storage))
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        return type(array).from_arrays(_offsets(array), pc.list_flatten(array), type=array.type)
    return pa.Array.from_buffers(
        array.type, len(array), [None, *array.buffers()[1:]], null_count=0, offset=array.offset
    )


def _offsets(array: pa.Array) -> pa.Array:
    """Offsets of ``array``'s lists over ``list_flatten(array)``: NULL slots as empty lists."""
    lengths = pc.fill_null(pc.list_value_length(array), 0)
    return pc.cumulative_sum(pa.concat_arrays([pa.array([0], lengths.type), lengths]))


def _as_list(array: pa.Array) -> pa.Array:
    """A map as the list of key/value structs it stores (compute functions take lists, not maps)."""
    if not pa.types.is_map(array.type):
        return array
    start, end = array.offsets[0].as_py(), array.offsets[-1].as_py()  # a slice's entries only, offsets from 0
    keys, items = array.keys.slice(start, end - start), array.items.slice(start, end - start)
    entries = pa.StructArray.from_arrays([keys, items], names=["key", "value"])
    return pa.ListArray.from_arrays(pc.subtract(array.offsets, start), entries, mask=_null_mask(array))


def _nested_list(mapped: pa.Array, target: pa.DataType, path: str, present: pa.Array | None) -> pa.Array:
    """A list or map rebuilt from the entries of its non-NULL slots (NULL slots become empty)."""
    array = _as_list(mapped)
    offsets, entries = _offsets(array), pc.list_flatten(array)
    # parents of the flattened entries: of the lists as rebuilt (a NULL slot's range, even a non-empty one, is gone)
    parents = pc.list_parent_indices(pa.LargeListArray.from_arrays(offsets.cast(pa.int64()), entries))
    entry_present = pc.is_valid(parents) if present is None else pc.take(present, parents)
    if pa.types.is_map(target):
        keys = _child(entries.field(0), target.key_field, path, entry_present)
        items = _child(entries.field(1), target.item_field, path, entry_present)
        return pa.MapArray.from_arrays(offsets.cast(pa.int32()), keys, items, type=target, mask=_null_mask(array))
    values = _child(entries, target.value_field, path, entry_present)
    return type(array).from_arrays(offsets, values, type=target, mask=_null_mask(array))
