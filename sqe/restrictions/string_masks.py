"""mask-alphanum, show-first-4 and show-last-4, per Unicode code point, over whole Arrow buffers.

The mask rules: ASCII digits become ``n``; ``( ) , . - @`` stay; every other code point becomes ``x``. So
the masked text is ASCII with one byte per input code point. One Arrow ``take`` of the UTF-8 data bytes
through a 256-entry table does it all: the table maps every ASCII byte and every UTF-8 lead byte
(0xC0-0xFF) to its mask byte. ASCII-only data (checked with one max over the bytes) keeps its offsets and
validity buffers as they are. Otherwise the continuation bytes (0x80-0xBF, which never start a code point
in valid UTF-8) map to a marker that one ``filter`` drops, and the offsets are rebuilt from the per-row
code point counts.

show-first-4/-last-4 mask the whole value once and join the kept code points of the original with the
rest of the masked text. The masked text has one byte per code point, so its part is a byte slice; so is
the kept part when the data is ASCII-only, else Arrow's code-point slicing (or, for the last 4, dropping
all but them) gives it.

Those are the Arrow kernels. Where the package was built with a C compiler, ``_masks.c`` does each mask in one
pass over the buffers instead (measured 2-7x faster; ``bench/restrictions_actions.py``), to the same rules: the
tests run both on the same arrays. They differ only on what no valid column holds: a null slot's stray bytes
(masked by C, dropped by Arrow) and invalid UTF-8, which both refuse where a kept code point carries more bytes
than its lead announces, and Arrow's code-point slicing refuses anywhere in the array.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from sqe.restrictions._native import NATIVE as NATIVE  # the tests and bench ask here
from sqe.restrictions._native import masks as _masks
from sqe.restrictions.arrow_buffers import validity_bitmap

_KEPT = b"(),.-@"
_MASK_TABLE = bytes(ord("n") if 0x30 <= byte <= 0x39 else byte if byte in _KEPT else ord("x") for byte in range(256))
_MASK_LOOKUP = pa.array(list(_MASK_TABLE), pa.uint8())  # the same table, as an Arrow take source
_CONTINUATION_MARK = pa.scalar(0x80, pa.uint8())  # never a mask byte: every mask output is ASCII
_MULTIBYTE_LOOKUP = pa.array([0x80 if 0x80 <= byte < 0xC0 else _MASK_TABLE[byte] for byte in range(256)], pa.uint8())
_ASCII_MAX = 0x7F
_TO_END = 2**31 - 1
_SHOWN = 4


def mask_alphanum(array: pa.Array, *, native: bool = NATIVE) -> pa.Array:
    return _per_string_type(array, _in_c(0, 0) if native else _mask_utf8)


def show_first_4(array: pa.Array, *, native: bool = NATIVE) -> pa.Array:
    return _per_string_type(array, _in_c(_SHOWN, 0) if native else _show_first)


def show_last_4(array: pa.Array, *, native: bool = NATIVE) -> pa.Array:
    return _per_string_type(array, _in_c(0, _SHOWN) if native else _show_last)


def _in_c(keep_first: int, keep_last: int) -> Callable[[pa.Array], pa.Array]:
    """The C kernel keeping the first ``keep_first`` and last ``keep_last`` code points of each value."""

    def kernel(array: pa.Array) -> pa.Array:
        length = len(array)
        if length == 0:
            return array
        width = 8 if pa.types.is_large_string(array.type) else 4
        validity, offsets, data = array.buffers()
        start, end = _span(array)
        out = pa.allocate_buffer(max(end - start, 0))
        out_offsets = pa.allocate_buffer((length + 1) * width)
        written = _masks.mask_strings(
            b"" if data is None else data,
            offsets,
            width,
            array.offset,
            length,
            validity if array.null_count else None,
            array.offset,
            keep_first,
            keep_last,
            out,
            out_offsets,
        )
        buffers = [validity_bitmap(array), out_offsets, out.slice(0, written)]
        return pa.Array.from_buffers(array.type, length, buffers)

    return kernel


def _per_string_type(array: pa.Array, kernel: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """Run ``kernel`` on string or large_string data; other string encodings convert there and back."""
    if isinstance(array, pa.DictionaryArray):  # masking is per value, so mask the dictionary only
        masked = _per_string_type(array.dictionary, kernel)
        return pa.DictionaryArray.from_arrays(array.indices, masked, ordered=array.type.ordered)
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return kernel(array)
    if pa.types.is_string_view(array.type):
        return kernel(array.cast(pa.large_string())).cast(array.type)
    raise TypeError(f"not a string column: {array.type}")


def _show_first(array: pa.Array) -> pa.Array:
    masked, ascii_only = _mask_and_ascii(array)
    if ascii_only:
        shown = pc.binary_slice(_bytes_view(array), 0, _SHOWN)
    else:
        shown = _bytes_view(pc.utf8_slice_codeunits(array, 0, _SHOWN))
    hidden = pc.binary_slice(_bytes_view(masked), _SHOWN, _TO_END)  # the masked text has a byte per code point
    return _concat(shown, hidden).view(array.type)


def _show_last(array: pa.Array) -> pa.Array:
    masked, ascii_only = _mask_and_ascii(array)
    hidden = pc.binary_slice(_bytes_view(masked), 0, -_SHOWN)
    if ascii_only:
        shown = pc.binary_slice(_bytes_view(array), -_SHOWN, _TO_END)
    else:  # dropping all but the last 4 code points: measured twice as fast as slicing from -4
        shown = _bytes_view(pc.utf8_replace_slice(array, 0, -_SHOWN, ""))
    return _concat(hidden, shown).view(array.type)


def _mask_and_ascii(array: pa.Array) -> tuple[pa.Array, bool]:
    """mask-alphanum of ``array`` and whether its data was ASCII-only (checked once for both uses)."""
    if len(array) == 0:
        return array, True
    start, end = _span(array)
    ascii_only = _all_ascii(_data_bytes(array, start, end))
    return (_mask_ascii(array, start, end) if ascii_only else _mask_multibyte(array)), ascii_only


def _concat(left: pa.Array, right: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(left, right, pa.scalar(b"", type=left.type))


def _bytes_view(array: pa.Array) -> pa.Array:
    return array.view(pa.large_binary() if pa.types.is_large_string(array.type) else pa.binary())


def _all_ascii(data: pa.Array) -> bool:
    return len(data) == 0 or pc.max(data).as_py() <= _ASCII_MAX


def _offsets(array: pa.Array) -> pa.Array:
    offset_type = pa.int64() if pa.types.is_large_string(array.type) else pa.int32()
    return pa.Array.from_buffers(offset_type, len(array) + 1, [None, array.buffers()[1]], offset=array.offset)


def _span(array: pa.Array) -> tuple[int, int]:
    """The byte range of the data buffer that the values cover."""
    offsets = _offsets(array)
    return offsets[0].as_py(), offsets[len(array)].as_py()


def _data_bytes(array: pa.Array, start: int, end: int) -> pa.Array:
    """The data buffer's bytes ``start:end`` as a zero-copy uint8 array."""
    data = array.buffers()[2]
    if data is None or end == start:
        return pa.array([], pa.uint8())
    return pa.Array.from_buffers(pa.uint8(), end - start, [None, data], offset=start)


def _mask_utf8(array: pa.Array) -> pa.Array:
    """mask-alphanum on a string or large_string array; nulls stay null."""
    return _mask_and_ascii(array)[0]


def _mask_ascii(array: pa.Array, start: int, end: int) -> pa.Array:
    """mask-alphanum when the bytes ``start:end`` (the values' span) are all ASCII: the offsets stay."""
    masked = pc.take(_MASK_LOOKUP, _data_bytes(array, start, end))
    offsets = _offsets(array)
    rebased = offsets if start == 0 else pc.subtract(offsets, pa.scalar(start, offsets.type))
    buffers = [validity_bitmap(array), _buffer_from(rebased), _buffer_from(masked)]
    return pa.Array.from_buffers(array.type, len(array), buffers)


def _mask_multibyte(array: pa.Array) -> pa.Array:
    """mask-alphanum when some code points take several bytes: every byte goes through the lookup (continuation
    bytes to a marker no mask byte uses), the markers are filtered out, and the offsets are rebuilt from code
    point counts. Measured faster than ``bytes.translate`` with deletion, which needs a copy into Python bytes."""
    length = len(array)
    start, end = _span(array)
    marked = pc.take(_MULTIBYTE_LOOKUP, _data_bytes(array, start, end))
    masked = pc.filter(marked, pc.not_equal(marked, _CONTINUATION_MARK))
    # count every slot's code points, null slots (which may hold stray bytes, masked above) included
    every_slot = pa.Array.from_buffers(array.type, length, [None, *array.buffers()[1:3]], offset=array.offset)
    offset_type = pa.int64() if pa.types.is_large_string(array.type) else pa.int32()
    code_points = pc.utf8_length(every_slot)
    new_offsets = pa.concat_arrays([pa.array([0], offset_type), pc.cumulative_sum(code_points)])
    buffers = [validity_bitmap(array), _buffer_from(new_offsets), _buffer_from(masked)]
    return pa.Array.from_buffers(array.type, length, buffers)


def _buffer_from(values: pa.Array) -> pa.Buffer:
    """The data buffer of a fixed-width array, starting at its first element."""
    width = values.type.bit_width // 8
    buffer = values.buffers()[1]
    if values.offset == 0:
        return buffer
    return buffer.slice(values.offset * width, len(values) * width)
