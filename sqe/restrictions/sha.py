"""sha-256-global and sha-256-query-local over Arrow arrays (REST spec encodings; the salt is prepended).

| input  | bytes hashed            | output                                                  |
| string | UTF-8                   | 64-char lowercase hex                                   |
| int    | 4 bytes little-endian   | first 4 digest bytes as a little-endian signed int32    |
| long   | 8 bytes little-endian   | first 8 digest bytes as a little-endian signed int64    |
| binary | the raw bytes           | the raw 32-byte digest                                  |

The per-value work is one hash call in a single list comprehension; everything around it (slicing the input
buffer, hex encoding, cutting digests into integers) is done on whole buffers. CPython's built-in SHA-256 is
used when present: for inputs this small it is about twice as fast as OpenSSL through hashlib, whose per-call
setup dominates. Low-cardinality columns are hashed once per distinct value.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from collections.abc import Callable
from itertools import pairwise
from typing import Protocol, cast

import pyarrow as pa
import pyarrow.compute as pc

from sqe.restrictions.arrow_buffers import validity_bitmap


class _Hash(Protocol):
    def digest(self) -> bytes: ...

    def hexdigest(self) -> str: ...


_KNOWN_INPUT, _KNOWN_DIGEST = b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
_DEDUPE_MIN_ROWS = 8192
_DEDUPE_SAMPLE = 4096


def _fastest_sha256() -> Callable[[bytes], _Hash]:
    """CPython's built-in implementation (``_sha2`` from 3.12, ``_sha256`` before), checked; else hashlib."""
    for module_name in ("_sha2", "_sha256"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        constructor = getattr(module, "sha256", None)
        if constructor is not None and constructor(_KNOWN_INPUT).hexdigest() == _KNOWN_DIGEST:
            return cast(Callable[[bytes], _Hash], constructor)
    return cast(Callable[[bytes], _Hash], hashlib.sha256)


_SHA256 = _fastest_sha256()


def sha256_array(array: pa.Array, salt: bytes) -> pa.Array:
    """Hash every value of ``array`` (``salt`` prepended; empty for sha-256-global). Nulls stay null."""
    if isinstance(array, pa.DictionaryArray):
        hashed = sha256_array(array.dictionary, salt)
        return pa.DictionaryArray.from_arrays(array.indices, hashed, ordered=array.type.ordered)
    if _is_repetitive(array):
        encoded = pc.dictionary_encode(array)
        return pc.take(_hash_plain(encoded.dictionary, salt), encoded.indices)
    return _hash_plain(array, salt)


def _is_repetitive(array: pa.Array) -> bool:
    """Whether a spread sample is under half distinct, so hashing each distinct value once pays off."""
    if len(array) < _DEDUPE_MIN_ROWS:
        return False
    step = len(array) // _DEDUPE_SAMPLE
    sample = array.take(pa.array(range(0, step * _DEDUPE_SAMPLE, step), type=pa.int64()))
    return bool(pc.count_distinct(sample, mode="all").as_py() * 2 < _DEDUPE_SAMPLE)


def _hash_plain(array: pa.Array, salt: bytes) -> pa.Array:
    kind = array.type
    if pa.types.is_int32(kind) or pa.types.is_int64(kind):
        return _hash_integers(array, salt)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _hash_variable(array, salt).cast(kind)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return _hash_variable(array, salt, hex_output=False).cast(kind)
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        wide = pa.large_string() if pa.types.is_string_view(kind) else pa.large_binary()
        return _hash_plain(array.cast(wide), salt).cast(kind)
    raise TypeError(f"sha-256 does not apply to Arrow {kind}")


def _hash_integers(array: pa.Array, salt: bytes) -> pa.Array:
    if sys.byteorder != "little":
        raise TypeError("sha-256 of integers needs a little-endian host")  # Arrow buffers are native-endian
    width = array.type.byte_width
    length = len(array)
    raw = bytes(memoryview(array.buffers()[1])[array.offset * width : (array.offset + length) * width])
    sha = _SHA256
    if salt:
        digests = [sha(salt + raw[i : i + width]).digest() for i in range(0, len(raw), width)]
    else:
        digests = [sha(raw[i : i + width]).digest() for i in range(0, len(raw), width)]
    whole = pa.Array.from_buffers(pa.binary(32), length, [None, pa.py_buffer(b"".join(digests))])
    prefixes = pc.binary_slice(whole, 0, width)  # fixed_size_binary(width), packed back to back
    return pa.Array.from_buffers(array.type, length, [validity_bitmap(array), prefixes.buffers()[1]])


def _hash_variable(array: pa.Array, salt: bytes, *, hex_output: bool = True) -> pa.Array:
    """Digests of string/binary values as fixed_size_binary(64) lowercase hex, or (32) raw bytes."""
    length = len(array)
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    words = memoryview(array.buffers()[1])
    offsets = words.cast("q") if large else words.cast("i")
    bounds = offsets[array.offset : array.offset + length + 1].tolist()
    data = array.buffers()[2]
    raw = bytes(memoryview(data)[: bounds[-1]]) if data is not None and length else b""
    sha = _SHA256
    if salt:
        digests = [sha(salt + raw[start:end]).digest() for start, end in pairwise(bounds)]
    else:
        digests = [sha(raw[start:end]).digest() for start, end in pairwise(bounds)]
    joined = b"".join(digests)
    if hex_output:
        hex_digits = pa.py_buffer(joined.hex().encode())
        return pa.Array.from_buffers(pa.binary(64), length, [validity_bitmap(array), hex_digits])
    return pa.Array.from_buffers(pa.binary(32), length, [validity_bitmap(array), pa.py_buffer(joined)])
