"""sha-256-global and sha-256-query-local over Arrow arrays (REST spec encodings; the salt is prepended).

| input  | bytes hashed            | output                                                  |
| string | UTF-8                   | 64-char lowercase hex                                   |
| int    | 4 bytes little-endian   | first 4 digest bytes as a little-endian signed int32    |
| long   | 8 bytes little-endian   | first 8 digest bytes as a little-endian signed int64    |
| binary | the raw bytes           | the raw 32-byte digest                                  |

Every type is first reduced to the same job: the raw digests of ``salt || value`` for every slot of a binary view
of the array (integers as fixed-width views of their buffer, so the bytes hashed are exactly the Arrow bytes),
32 bytes each, back to back; the output is then cut from those digests on whole buffers (hex for strings, the
leading bytes for integers) with the input's validity bitmap put back. A null slot is hashed like any other
(as whatever bytes it spans, usually none) and its result discarded.

Arrays of at least ``VECTOR_MIN_ROWS`` values are hashed by DataFusion's vectorised ``sha256`` (Rust, using the
CPU's SHA instructions where present). The masks then run at 4-7M values/s on one core here
(``bench/restrictions_actions.py``), where DuckDB's ``sha256`` made them 1.7-2.0M/s and a Python loop gives about
1.4M/s. It runs on a fresh session per call, through its DataFrame API only (no SQL text, no file access), with
one partition and one batch so rows keep their order. The salt goes in as a column, never as a literal of the
plan (DataFusion logs its plans at debug level), and never appears in an error.

Smaller arrays, where DataFusion's ~1.2 ms per-call cost dominates, use one CPython hash call per value in a list
comprehension; CPython's built-in SHA-256 is used when present: for inputs this small it is about twice as fast
as OpenSSL through hashlib, whose per-call setup dominates. Low-cardinality columns are hashed once per distinct
value.
"""

from __future__ import annotations

import binascii
import hashlib
import importlib
import logging
import sys
from collections.abc import Callable
from itertools import pairwise
from typing import TYPE_CHECKING, Protocol, cast

import pyarrow as pa
import pyarrow.compute as pc

from sqe.errors import RestrictionApplyError
from sqe.restrictions.arrow_buffers import validity_bitmap

if TYPE_CHECKING:
    from types import ModuleType


class _Hash(Protocol):
    def digest(self) -> bytes: ...

    def hexdigest(self) -> str: ...


_KNOWN_INPUT, _KNOWN_DIGEST = b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
_DEDUPE_MIN_ROWS = 8192
_DEDUPE_SAMPLE = 4096
DIGEST_BYTES = 32
VECTOR_MIN_ROWS = 2048  # measured: below this, DataFusion's ~1.2 ms per-call cost outweighs its speed


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
    if pa.types.is_string_view(array.type) or pa.types.is_binary_view(array.type):
        wide = pa.large_string() if pa.types.is_string_view(array.type) else pa.large_binary()
        return sha256_array(array.cast(wide), salt).cast(array.type)  # view arrays have no take kernel
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
    raise TypeError(f"sha-256 does not apply to Arrow {kind}")


def _hash_integers(array: pa.Array, salt: bytes) -> pa.Array:
    if sys.byteorder != "little":
        raise TypeError("sha-256 of integers needs a little-endian host")  # Arrow buffers are native-endian
    width = array.type.byte_width
    length = len(array)
    values = pa.Array.from_buffers(pa.binary(width), length, [None, array.buffers()[1]], offset=array.offset)
    whole = pa.Array.from_buffers(pa.binary(DIGEST_BYTES), length, [None, _digests(values, salt)])
    prefixes = pc.binary_slice(whole, 0, width)  # fixed_size_binary(width), packed back to back
    return pa.Array.from_buffers(array.type, length, [validity_bitmap(array), prefixes.buffers()[1]])


def _hash_variable(array: pa.Array, salt: bytes, *, hex_output: bool = True) -> pa.Array:
    """Digests of string/binary values as fixed_size_binary(64) lowercase hex, or (32) raw bytes."""
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    digests = _digests(array.view(pa.large_binary() if large else pa.binary()), salt)  # zero-copy view
    validity = validity_bitmap(array)
    if hex_output:
        hex_digits = pa.py_buffer(binascii.hexlify(digests))  # bytes out: no str round trip
        return pa.Array.from_buffers(pa.binary(2 * DIGEST_BYTES), len(array), [validity, hex_digits])
    return pa.Array.from_buffers(pa.binary(DIGEST_BYTES), len(array), [validity, digests])


def _digests(values: pa.Array, salt: bytes) -> pa.Buffer:
    """SHA-256 of ``salt || value`` for every slot of a binary or fixed-size binary array, null or not, as raw
    32-byte digests back to back."""
    kind = values.type
    if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)):
        raise TypeError(f"sha-256 hashes binary views, not Arrow {kind}")  # DataFusion's concat would cast to text
    if len(values) >= VECTOR_MIN_ROWS:
        return _vector_digests(values, salt)
    return pa.py_buffer(b"".join(_loop_digests(values, salt)))


def _loop_digests(values: pa.Array, salt: bytes) -> list[bytes]:
    data = values.buffers()[-1]
    if pa.types.is_fixed_size_binary(values.type):
        width = values.type.byte_width
        start = values.offset * width
        bounds = list(range(start, start + (len(values) + 1) * width, width))
    else:
        words = memoryview(values.buffers()[1])
        offsets = words.cast("q") if pa.types.is_large_binary(values.type) else words.cast("i")
        bounds = offsets[values.offset : values.offset + len(values) + 1].tolist()
    raw = bytes(memoryview(data)[: bounds[-1]]) if data is not None and len(values) else b""
    sha = _SHA256
    if salt:
        return [sha(salt + raw[start:end]).digest() for start, end in pairwise(bounds)]
    return [sha(raw[start:end]).digest() for start, end in pairwise(bounds)]


_datafusion_module: ModuleType | None = None
# The Python loggers DataFusion's Rust crates log through (named after the crate): at debug level they write
# ~270 records of query planning per hash call, which would drown ``sqe --debug``.
_DATAFUSION_LOGGERS = (
    "datafusion",
    "datafusion_catalog",
    "datafusion_common",
    "datafusion_datasource",
    "datafusion_execution",
    "datafusion_expr",
    "datafusion_functions",
    "datafusion_optimizer",
    "datafusion_physical_expr",
    "datafusion_physical_optimizer",
    "datafusion_physical_plan",
    "datafusion_sql",
    "sqlparser",
)


def _datafusion() -> ModuleType:
    """DataFusion, imported on the first large hash (~150 ms): most queries mask nothing with SHA-256. Its
    loggers are set to WARNING unless the application configured them (before its first use: it caches levels)."""
    global _datafusion_module
    if _datafusion_module is None:
        for name in _DATAFUSION_LOGGERS:
            logger = logging.getLogger(name)
            if logger.level == logging.NOTSET:
                logger.setLevel(logging.WARNING)
        _datafusion_module = importlib.import_module("datafusion")
    return _datafusion_module


def _vector_digests(values: pa.Array, salt: bytes) -> pa.Buffer:
    datafusion = _datafusion()
    functions = datafusion.functions
    # Validity dropped so that every slot yields a digest: the output is then exactly 32 bytes a row.
    every_slot = pa.Array.from_buffers(values.type, len(values), [None, *values.buffers()[1:]], offset=values.offset)
    columns = {"v": every_slot}
    value = datafusion.col("v")
    if pa.types.is_fixed_size_binary(values.type):
        value = value.cast(pa.binary())
    if salt:
        # The salt is data (a one-entry dictionary column), never a literal: DataFusion logs its plans at debug
        # level. Measured ~10 ns a row dearer than a literal.
        columns["s"] = _repeated(salt, len(values))
        value = functions.concat(datafusion.col("s"), value)
    # One partition and one batch: rows come back in their order (more partitions reorder them).
    config = datafusion.SessionConfig().with_target_partitions(1).with_batch_size(max(len(values), 8192))
    # A fresh session per call: from_arrow registers its table in the session for good.
    session = datafusion.SessionContext(config)
    try:
        frame = session.from_arrow(pa.table(columns))
        column = frame.select(functions.sha256(value).alias("h")).to_arrow_table().column(0)
    except Exception as exc:  # its message may quote the plan, salt included
        raise RestrictionApplyError(f"sha-256: DataFusion failed to hash the column ({type(exc).__name__})") from None
    return _packed_digests(column.combine_chunks(), len(values))


def _repeated(value: bytes, length: int) -> pa.DictionaryArray:
    """``value`` ``length`` times, as a dictionary of one entry (one byte of index a row)."""
    indices = pa.Array.from_buffers(pa.int8(), length, [None, pa.py_buffer(bytes(length))])
    return pa.DictionaryArray.from_arrays(indices, pa.array([value], pa.binary()))


def _packed_digests(digests: pa.Array, length: int) -> pa.Buffer:
    """The data of a binary array of ``length`` digests, checked: no nulls and 32 bytes a value in total."""
    if digests.type != pa.binary() or len(digests) != length or digests.null_count:
        raise RestrictionApplyError(f"sha-256: DataFusion returned {len(digests)} {digests.type} values")
    offsets = memoryview(digests.buffers()[1]).cast("i")
    first, last = offsets[digests.offset], offsets[digests.offset + length]
    if last - first != DIGEST_BYTES * length:
        raise RestrictionApplyError("sha-256: DataFusion returned digests that are not 32 bytes each")
    data = digests.buffers()[2]
    return pa.py_buffer(b"") if data is None else data.slice(first, last - first)
