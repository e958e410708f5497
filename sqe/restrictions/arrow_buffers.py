"""Small helpers for building Arrow arrays from raw buffers."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def validity_bitmap(array: pa.Array) -> pa.Buffer | None:
    """A validity bitmap aligned to offset 0 (for ``Array.from_buffers``), or None when there are no nulls."""
    if array.null_count == 0:
        return None
    if array.offset == 0:
        return array.buffers()[0]
    return pc.is_valid(array).buffers()[1]
