"""What a DoPut's parameter rows cost once bound: the bytes ``[server] max_parameter_bytes`` counts for them.

The server turns parameter rows into Python values to bind them (one object per value), so their size is what
they decode to, not the Arrow buffers they arrive in. Some encodings hold any number of values in a few bytes: a
null-typed column has no buffer at all, a dictionary repeats one large value by a one-byte index, a run-end-encoded
column repeats a value per run. Counting their buffers, 224 bytes on the wire held fifty million rows. Each value
here counts at least :data:`MIN_VALUE_BYTES`, and a repeated value every time it is repeated.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from sqe.errors import QueryError

MIN_VALUE_BYTES = 8  # each value counts as an int64 at least, whatever its type holds it in


def batch_bytes(batch: pa.RecordBatch) -> int:
    """The decoded bytes of ``batch``'s values (at least :data:`MIN_VALUE_BYTES` a value)."""
    return sum(_array_bytes(column, field.name) for column, field in zip(batch.columns, batch.schema, strict=True))


def _array_bytes(array: pa.Array, name: str) -> int:
    kind = array.type
    own = MIN_VALUE_BYTES * len(array)
    if isinstance(kind, pa.ExtensionType):
        return _array_bytes(array.storage, name)
    if pa.types.is_dictionary(kind):
        sizes = _value_sizes(array.dictionary, name)
        return own + _sum(pc.take(sizes, array.indices))
    if pa.types.is_run_end_encoded(kind):  # every value of its runs, each counted as the largest one
        return own + len(array) * _max(_value_sizes(array.values, name))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return own + _array_bytes(array.flatten(), name)  # the values its offsets reach, once each
    if pa.types.is_map(kind):  # offsets only grow: its whole child holds every entry once
        return own + _array_bytes(array.values, name)
    if pa.types.is_struct(kind):
        return own + sum(_array_bytes(child, name) for child in array.flatten())
    if pa.types.is_union(kind) and kind.mode == "sparse":  # each child as long as the column, read once a row
        return own + sum(_array_bytes(array.field(i), name) for i in range(kind.num_fields))
    if _is_nested(kind):  # list views and dense unions may reach one child value any number of times
        raise QueryError(
            f"parameter column {name[:60]!r} of type {str(kind)[:80]} is not supported: send lists, structs or "
            "plain values"
        )
    return max(int(array.nbytes), own)


def _value_sizes(values: pa.Array, name: str) -> pa.Array:
    """Each value's decoded bytes, for the values a dictionary or run-end encoding repeats."""
    kind = values.type
    if pa.types.is_null(kind) or pa.types.is_boolean(kind) or _is_fixed_width(kind):
        width = max(getattr(kind, "byte_width", 0) if not pa.types.is_null(kind) else 0, MIN_VALUE_BYTES)
        return pa.array([width] * len(values), pa.int64())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        return _at_least(pc.binary_length(values))
    if pa.types.is_large_binary(kind) or pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        return _at_least(pc.binary_length(values))
    raise QueryError(
        f"parameter column {name[:60]!r} encodes values of type {str(kind)[:80]}: only plain values may be "
        "dictionary- or run-end-encoded"
    )


def _at_least(lengths: pa.Array) -> pa.Array:
    return pc.max_element_wise(pc.fill_null(pc.cast(lengths, pa.int64()), 0), MIN_VALUE_BYTES)


def _is_fixed_width(kind: pa.DataType) -> bool:
    try:
        return int(kind.bit_width) > 0
    except ValueError:  # variable width
        return False


def _is_nested(kind: pa.DataType) -> bool:
    return bool(pa.types.is_nested(kind) or pa.types.is_union(kind))


def _sum(values: pa.Array) -> int:
    total = pc.sum(values).as_py()
    return int(total or 0)


def _max(values: pa.Array) -> int:
    largest = pc.max(values).as_py() if len(values) else 0
    return int(largest or 0)
