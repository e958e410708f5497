"""sha-256-global and sha-256-query-local over Arrow arrays (REST spec encodings; the salt is prepended).

| input  | bytes hashed            | output                                                  |
| string | UTF-8                   | 64-char lowercase hex                                   |
| int    | 4 bytes little-endian   | first 4 digest bytes as a little-endian signed int32    |
| long   | 8 bytes little-endian   | first 8 digest bytes as a little-endian signed int64    |
| binary | the raw bytes           | the raw 32-byte digest                                  |

Arrays of at least ``DUCKDB_MIN_ROWS`` values are hashed by DuckDB's vectorised ``sha256`` (about twice the per-core
throughput of a Python loop) on a private, locked-down, single-threaded in-memory connection per thread. The salt is
prepended inside DuckDB (a bound BLOB constant), and every value is fed as a BLOB (integers as fixed-width binary
views of their buffer) so the bytes hashed are exactly the Arrow bytes. Smaller arrays, where DuckDB's fixed per-
query cost dominates, use one CPython hash call per value in a list comprehension; everything around it (slicing,
hex encoding, cutting digests into integers) works on whole buffers. CPython's built-in SHA-256 is used when
present: for inputs this small it is about twice as fast as OpenSSL through hashlib, whose per-call setup dominates.
Low-cardinality columns are hashed once per distinct value.
"""

from __future__ import annotations

import binascii
import hashlib
import importlib
import os
import sys
import threading
from collections.abc import Callable
from itertools import pairwise
from typing import Protocol, cast

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from sqe.duckdb_connection import close_at_exit, connect_locked_down
from sqe.restrictions.arrow_buffers import validity_bitmap


class _Hash(Protocol):
    def digest(self) -> bytes: ...

    def hexdigest(self) -> str: ...


_KNOWN_INPUT, _KNOWN_DIGEST = b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
_DEDUPE_MIN_ROWS = 8192
_DEDUPE_SAMPLE = 4096
DUCKDB_MIN_ROWS = 16384  # measured: below this, DuckDB's ~1.5-4 ms per-query cost outweighs its speed


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
    if length >= DUCKDB_MIN_ROWS:
        return _duckdb_hash_integers(array, salt)
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
    if length >= DUCKDB_MIN_ROWS:
        return _duckdb_hash_variable(array, salt, hex_output=hex_output)
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


class _ThreadConnection(threading.local):
    """Each thread's cursor of the hashing database (a connection is not shared across threads), rebuilt after
    a fork."""

    pid: int = -1
    connection: duckdb.DuckDBPyConnection | None = None


_CONNECTIONS = _ThreadConnection()
_DATABASE_LOCK = threading.Lock()
_DATABASE: tuple[int, duckdb.DuckDBPyConnection] | None = None  # (pid, connection) of the hashing database


def _one_thread(connection: duckdb.DuckDBPyConnection) -> None:
    connection.execute("SET threads = 1")  # each query on its caller's thread alone; rows come back in order


def _database() -> duckdb.DuckDBPyConnection:
    """One locked-down hashing database per process. Opening a database costs ~30 ms and a set of threads, and
    scan threads are new for every scan: a database per thread made a scan's first hash that much slower."""
    global _DATABASE
    with _DATABASE_LOCK:
        if _DATABASE is None or _DATABASE[0] != os.getpid():
            _DATABASE = (os.getpid(), connect_locked_down(_one_thread))
            close_at_exit(_DATABASE[1])
        return _DATABASE[1]


def _duckdb() -> duckdb.DuckDBPyConnection:
    """This thread's private cursor: in memory, one thread, no file/network access, no extension loading,
    no Python variable lookups, and its configuration locked so queries cannot loosen any of that."""
    if _CONNECTIONS.connection is None or _CONNECTIONS.pid != os.getpid():
        _CONNECTIONS.connection, _CONNECTIONS.pid = _database().cursor(), os.getpid()
        if threading.current_thread() is threading.main_thread():
            # Alive at exit, unlike the cursors of scan threads (gone with their threads): closed at exit so the
            # database can close (see close_at_exit). Registered after the database's: closed before it.
            close_at_exit(_CONNECTIONS.connection)
    return _CONNECTIONS.connection


def _duckdb_hex(blobs: pa.Array, salt: bytes, hex_digits: int = 64) -> pa.Array:
    """The first ``hex_digits`` lowercase hex digits of SHA-256 of ``salt || value`` for each BLOB, as a string
    array in DuckDB's output type; row order is kept (one thread, insertion order preserved). The salt is a bound
    constant (never SQL text) and the concatenation runs inside DuckDB, saving an Arrow copy of every value. Hex
    is DuckDB's only output; decoding it here (one take over digit pairs) is cheaper than unhex."""
    value: duckdb.Expression = duckdb.ColumnExpression("v")
    if salt:
        value = duckdb.FunctionExpression("||", duckdb.ConstantExpression(salt), value)
    digest = duckdb.FunctionExpression("sha256", value)
    if hex_digits != 64:  # left(): measured ~60 ns/value cheaper than array_slice, and short results stay inline
        digest = duckdb.FunctionExpression("left", digest, duckdb.ConstantExpression(hex_digits))
    column = _duckdb().from_arrow(pa.table({"v": blobs})).select(digest).to_arrow_table().column(0)
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _value_offsets(strings: pa.Array) -> pa.Array:
    """The offsets of a string/binary array (int32) or its large variant (int64), as an array from its offset."""
    large = pa.types.is_large_string(strings.type) or pa.types.is_large_binary(strings.type)
    offset_type = pa.int64() if large else pa.int32()
    return pa.Array.from_buffers(offset_type, len(strings) + 1, [None, strings.buffers()[1]], offset=strings.offset)


def _hex_pair_table() -> pa.Array:
    """Byte value of every two-character hex string (either case), indexed by the pair read as a little-endian
    uint16. Other pairs map to 0; DuckDB's sha256 writes nothing but hex digits."""
    table = bytearray(1 << 16)
    digits = [(value, ord(char)) for value, char in enumerate("0123456789abcdef")]
    digits += [(value, ord(char)) for value, char in enumerate("ABCDEF", start=10)]
    for high, high_char in digits:
        for low, low_char in digits:
            table[high_char | low_char << 8] = high << 4 | low
    return pa.array(table, pa.uint8())


_HEX_PAIRS = _hex_pair_table()


def _decoded_hex_bytes(hex_strings: pa.Array) -> pa.Buffer:
    """The bytes spelled by all values of a hex string array, back to back (nulls are empty). One Arrow take of
    each digit pair through a 64 KiB table: measured twice as fast as binascii.a2b_hex over the same bytes."""
    offsets = _value_offsets(hex_strings)
    first, last = offsets[0].as_py(), offsets[len(hex_strings)].as_py()
    data = hex_strings.buffers()[2]
    if data is None or first == last:
        return pa.py_buffer(b"")
    if first % 2 or sys.byteorder != "little":  # not DuckDB's layout, but decoded right anyway
        return pa.py_buffer(binascii.a2b_hex(memoryview(data)[first:last]))
    pairs = pa.Array.from_buffers(pa.uint16(), (last - first) // 2, [None, data], offset=first // 2)
    decoded = pc.take(_HEX_PAIRS, pairs)
    return decoded.buffers()[1].slice(decoded.offset, len(decoded))


def _duckdb_hash_integers(array: pa.Array, salt: bytes) -> pa.Array:
    """Every slot, null or not, hashed as its little-endian bytes; the validity bitmap is put back afterwards."""
    width = array.type.byte_width
    length = len(array)
    values = pa.Array.from_buffers(pa.binary(width), length, [None, array.buffers()[1]], offset=array.offset)
    prefixes = _decoded_hex_bytes(_duckdb_hex(values, salt, 2 * width))  # no nulls in: exactly ``width`` bytes each
    return pa.Array.from_buffers(array.type, length, [validity_bitmap(array), prefixes])


def _duckdb_hash_variable(array: pa.Array, salt: bytes, *, hex_output: bool) -> pa.Array:
    """Lowercase hex (strings) or raw digests (binary) of the bytes of each value; the caller casts the type."""
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    hex_digests = _duckdb_hex(array.view(pa.large_binary() if large else pa.binary()), salt)  # zero-copy views
    if hex_output:
        return hex_digests
    digests = _decoded_hex_bytes(hex_digests)  # 32 bytes per non-null value, nulls empty
    hex_offsets = _value_offsets(hex_digests)
    one = pa.scalar(1, hex_offsets.type)  # typed, so int32 offsets are not promoted to int64
    offsets = pc.shift_right(pc.subtract(hex_offsets, hex_offsets[0]), one)  # two hex digits per byte
    binary = pa.large_binary() if pa.types.is_large_string(hex_digests.type) else pa.binary()
    return pa.Array.from_buffers(
        binary, len(hex_digests), [validity_bitmap(hex_digests), offsets.buffers()[1], digests]
    )
