"""Where each field id sits in an Iceberg schema: path from the top-level column, map-key/repeated flags."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pyiceberg.schema import Schema
from pyiceberg.types import ListType, MapType, NestedField, StructType

from sqe.restrictions.literals import type_name


@dataclass(frozen=True)
class FieldInfo:
    field: NestedField
    path: tuple[int, ...]  # field ids from the top-level column down to this field, inclusive
    name: str  # dotted full name, as pyiceberg spells it ("address.city", "tags.element", "m.key")
    in_map_key: bool  # a map key, or inside one
    repeated: bool  # inside a list element or a map key/value: no single value per row

    @property
    def field_id(self) -> int:
        return self.field.field_id

    @property
    def type_name(self) -> str:
        return type_name(self.field.field_type)

    @property
    def top_level(self) -> bool:
        return len(self.path) == 1

    @property
    def ancestors(self) -> tuple[int, ...]:
        return self.path[:-1]


class SchemaIndex:
    """Field id -> FieldInfo for one schema, including every nested field."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._by_id: dict[int, FieldInfo] = {}
        for field in schema.fields:
            for info in _walk(field, (), "", in_map_key=False, repeated=False):
                self._by_id[info.field_id] = info

    def get(self, field_id: int) -> FieldInfo | None:
        return self._by_id.get(field_id)

    def by_name(self, name: str) -> FieldInfo | None:
        """Case-sensitive lookup of a dotted column name, as the deprecated name references use."""
        try:
            field = self.schema.find_field(name, case_sensitive=True)
        except ValueError:
            return None
        return self._by_id.get(field.field_id)


def _walk(
    field: NestedField, parent_path: tuple[int, ...], parent_name: str, *, in_map_key: bool, repeated: bool
) -> Iterator[FieldInfo]:
    path = (*parent_path, field.field_id)
    name = f"{parent_name}.{field.name}" if parent_name else field.name
    yield FieldInfo(field, path, name, in_map_key, repeated)
    field_type = field.field_type
    if isinstance(field_type, StructType):
        for child in field_type.fields:
            yield from _walk(child, path, name, in_map_key=in_map_key, repeated=repeated)
    elif isinstance(field_type, ListType):
        yield from _walk(field_type.element_field, path, name, in_map_key=in_map_key, repeated=True)
    elif isinstance(field_type, MapType):
        yield from _walk(field_type.key_field, path, name, in_map_key=True, repeated=True)
        yield from _walk(field_type.value_field, path, name, in_map_key=in_map_key, repeated=True)
