"""pyiceberg's Arrow projection, made to keep a NULL list or map of structs NULL.

Every data file pyiceberg writes, and every file it reads for SQE, goes through its ``ArrowProjectionVisitor``.
For a list or map whose elements are structs it rebuilds the array from its offsets alone (pyiceberg 0.12), and
offsets carry no validity: a NULL list or map of structs came out as an empty one, written so into the file and
read so from any file. Importing this module wraps the two methods so the rebuilt array takes the validity of
the array it was built from (its entries are unchanged: a NULL slot's range, empty or not, is never read).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import ArrowProjectionVisitor

__all__ = ["with_validity_of"]

_WRAPPED = "_sqe_keeps_nulls"


def with_validity_of(rebuilt: pa.Array | None, source: pa.Array | None) -> pa.Array | None:
    """``rebuilt`` (a list or map array) NULL wherever ``source``, the array it was rebuilt from, is."""
    if rebuilt is None or source is None or not source.null_count or rebuilt.null_count == source.null_count:
        return rebuilt
    offsets = rebuilt.offsets  # the slots' own range of the entries, from offsets[0]: no validity
    start = offsets[0].as_py()
    length = offsets[-1].as_py() - start
    from_zero = pc.subtract(offsets, pa.scalar(start, offsets.type))
    mask = source.is_null()
    if isinstance(rebuilt, pa.MapArray):
        keys, items = rebuilt.keys.slice(start, length), rebuilt.items.slice(start, length)
        return pa.MapArray.from_arrays(from_zero, keys, items, type=rebuilt.type, mask=mask)
    values = rebuilt.values.slice(start, length)
    return type(rebuilt).from_arrays(from_zero, values, type=rebuilt.type, mask=mask)


def _keeping_nulls(method: Any) -> Any:
    def wrapped(self: ArrowProjectionVisitor, iceberg_type: Any, array: Any, *results: Any) -> Any:
        return with_validity_of(method(self, iceberg_type, array, *results), array)

    setattr(wrapped, _WRAPPED, True)
    return wrapped


def _install() -> None:
    for name in ("list", "map"):
        method = getattr(ArrowProjectionVisitor, name)
        if not getattr(method, _WRAPPED, False):  # once, however often this module is reloaded
            setattr(ArrowProjectionVisitor, name, _keeping_nulls(method))


_install()
