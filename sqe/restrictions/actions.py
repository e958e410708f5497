"""The nine column-projection actions: the Iceberg types each applies to, and applying one to Arrow.

Every action returns an array of the input's Arrow type (the spec requires the same type; a
dictionary-encoded column keeps its encoding where the action is per value). Nulls stay null except
under mask-to-fixed-value, which replaces them too.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import pyarrow as pa
from pyiceberg import types as ice

from sqe.errors import InvalidRestrictionError, RestrictionApplyError
from sqe.restrictions.literals import type_name
from sqe.restrictions.sha import sha256_array
from sqe.restrictions.string_masks import mask_alphanum, show_first_4, show_last_4
from sqe.restrictions.temporal import truncate_temporal

MASK_ALPHANUM = "mask-alphanum"
SHOW_FIRST_4 = "show-first-4"
SHOW_LAST_4 = "show-last-4"
MASK_TO_FIXED_VALUE = "mask-to-fixed-value"
REPLACE_WITH_NULL = "replace-with-null"
TRUNCATE_TO_YEAR = "truncate-to-year"
TRUNCATE_TO_MONTH = "truncate-to-month"
SHA_256_GLOBAL = "sha-256-global"
SHA_256_QUERY_LOCAL = "sha-256-query-local"

ACTIONS: tuple[str, ...] = (
    MASK_ALPHANUM,
    SHOW_FIRST_4,
    SHOW_LAST_4,
    MASK_TO_FIXED_VALUE,
    REPLACE_WITH_NULL,
    TRUNCATE_TO_YEAR,
    TRUNCATE_TO_MONTH,
    SHA_256_GLOBAL,
    SHA_256_QUERY_LOCAL,
)
MIN_SALT_BYTES = 16
FIXED_STRING = "XXXXXXXX"

_TEMPORAL = (ice.DateType, ice.TimestampType, ice.TimestamptzType, ice.TimestampNanoType, ice.TimestamptzNanoType)
_FIXED_VALUE_PRIMITIVES = (
    ice.BooleanType,
    ice.IntegerType,
    ice.LongType,
    ice.FloatType,
    ice.DoubleType,
    ice.DecimalType,
    ice.StringType,
    ice.DateType,
    ice.TimeType,
    ice.TimestampType,
    ice.TimestamptzType,
    ice.TimestampNanoType,
    ice.TimestamptzNanoType,
    ice.UUIDType,
    ice.FixedType,
    ice.BinaryType,
)
_APPLIES_TO: dict[str, tuple[type[ice.IcebergType], ...]] = {
    MASK_ALPHANUM: (ice.StringType,),
    SHOW_FIRST_4: (ice.StringType,),
    SHOW_LAST_4: (ice.StringType,),
    TRUNCATE_TO_YEAR: _TEMPORAL,
    TRUNCATE_TO_MONTH: _TEMPORAL,
    SHA_256_GLOBAL: (ice.StringType, ice.IntegerType, ice.LongType, ice.BinaryType),
    SHA_256_QUERY_LOCAL: (ice.StringType, ice.IntegerType, ice.LongType, ice.BinaryType),
}


# --------------------------------------------------------------------------------------- validation


def check_applicable(action: str, field: ice.NestedField) -> None:
    """Fail unless ``action`` may target ``field`` (its type, and for replace-with-null its optionality)."""
    where = f"read-restrictions: {action} on field id {field.field_id} ({type_name(field.field_type)})"
    if action == REPLACE_WITH_NULL:
        if field.required:
            raise InvalidRestrictionError(f"{where}: the field is required and cannot be null")
        return
    if action == MASK_TO_FIXED_VALUE:
        if not _has_fixed_value(field.field_type):
            raise InvalidRestrictionError(f"{where}: the type has no fixed value")
        return
    if not isinstance(field.field_type, _APPLIES_TO[action]):
        raise InvalidRestrictionError(f"{where}: the action does not apply to this type")


def _has_fixed_value(field_type: ice.IcebergType) -> bool:
    """Allowlisted types; a struct only if every field has one (lists and maps become empty regardless)."""
    if isinstance(field_type, ice.StructType):
        return all(_has_fixed_value(child.field_type) for child in field_type.fields)
    return isinstance(field_type, (*_FIXED_VALUE_PRIMITIVES, ice.ListType, ice.MapType))


# ----------------------------------------------------------------------------------------- applying


def apply_action(action: str, array: pa.Array, *, salt: bytes) -> pa.Array:
    """Apply a validated action to one column; ``salt`` is only read by sha-256-query-local."""
    if isinstance(array, pa.DictionaryArray) and action not in (MASK_TO_FIXED_VALUE, REPLACE_WITH_NULL):
        values = apply_action(action, array.dictionary, salt=salt)  # per-value actions: map the dictionary
        return pa.DictionaryArray.from_arrays(array.indices, values, ordered=array.type.ordered)
    try:
        result = _KERNELS[action](array, salt)
    # ValueError: pa.ArrowInvalid, and the C string masks' refusal of a malformed array
    except (TypeError, ValueError, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise RestrictionApplyError(f"{action} cannot be applied to Arrow {array.type}: {exc}") from None
    if result.type != array.type:
        raise RestrictionApplyError(f"{action} produced Arrow {result.type} for a {array.type} column")
    return result


def check_salt(salt: bytes) -> None:
    if not isinstance(salt, bytes) or len(salt) < MIN_SALT_BYTES:
        raise RestrictionApplyError(f"sha-256-query-local needs a random salt of at least {MIN_SALT_BYTES} bytes")


def _query_local(array: pa.Array, salt: bytes) -> pa.Array:
    check_salt(salt)
    return sha256_array(array, salt)


def _truncate(unit: str) -> Callable[[pa.Array, bytes], pa.Array]:
    def kernel(array: pa.Array, _: bytes) -> pa.Array:
        return truncate_temporal(array, unit)

    return kernel


def _fixed_value(array: pa.Array, _: bytes) -> pa.Array:
    return _constant_array(array.type, len(array))


def _constant_array(kind: pa.DataType, length: int) -> pa.Array:
    if isinstance(kind, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(kind, _constant_array(kind.storage_type, length))
    if isinstance(kind, pa.DictionaryType):
        indices = pa.repeat(pa.scalar(0, kind.index_type), length)
        return pa.DictionaryArray.from_arrays(indices, _constant_array(kind.value_type, 1), ordered=kind.ordered)
    if isinstance(kind, pa.StructType):
        children = [_constant_array(kind.field(i).type, length) for i in range(kind.num_fields)]
        return pa.StructArray.from_arrays(children, fields=[kind.field(i) for i in range(kind.num_fields)])
    return pa.repeat(pa.scalar(_fixed_python_value(kind), type=kind), length)


def _fixed_python_value(kind: pa.DataType) -> object:
    if pa.types.is_boolean(kind):
        return False
    if pa.types.is_integer(kind) or pa.types.is_temporal(kind):
        return 0  # the epoch for date/time/timestamp, in every unit and zone
    if pa.types.is_floating(kind):
        return 0.0
    if pa.types.is_decimal(kind):
        return Decimal(0)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return FIXED_STRING
    if pa.types.is_fixed_size_binary(kind):
        return bytes(kind.byte_width)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return b""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        return []
    raise TypeError(f"no fixed value for Arrow {kind}")


def _null(array: pa.Array, _: bytes) -> pa.Array:
    return pa.nulls(len(array), type=array.type)


_KERNELS: dict[str, Callable[[pa.Array, bytes], pa.Array]] = {
    MASK_ALPHANUM: lambda array, _: mask_alphanum(array),
    SHOW_FIRST_4: lambda array, _: show_first_4(array),
    SHOW_LAST_4: lambda array, _: show_last_4(array),
    MASK_TO_FIXED_VALUE: _fixed_value,
    REPLACE_WITH_NULL: _null,
    TRUNCATE_TO_YEAR: _truncate("year"),
    TRUNCATE_TO_MONTH: _truncate("month"),
    SHA_256_GLOBAL: lambda array, _: sha256_array(array, b""),
    SHA_256_QUERY_LOCAL: _query_local,
}
