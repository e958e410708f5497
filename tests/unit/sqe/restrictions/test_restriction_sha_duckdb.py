"""The DuckDB SHA-256 path (arrays of at least DUCKDB_MIN_ROWS values) against independent hashlib/struct."""

from __future__ import annotations

import hashlib
import random
import struct
import threading

import pyarrow as pa
import pytest

from sqe.restrictions import sha
from sqe.restrictions.sha import sha256_array

SALT = bytes(range(16, 36))  # 20 bytes: longer than the 16-byte minimum
SALTS = [b"", SALT]


@pytest.fixture(autouse=True)
def small_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sha, "DUCKDB_MIN_ROWS", 4)


def digest(data: bytes, salt: bytes) -> bytes:
    return hashlib.sha256(salt + data).digest()


def expected_ints(values: list[int | None], fmt: str, salt: bytes) -> list[int | None]:
    width = struct.calcsize(fmt)
    return [None if v is None else struct.unpack(fmt, digest(struct.pack(fmt, v), salt)[:width])[0] for v in values]


@pytest.mark.parametrize("salt", SALTS)
@pytest.mark.parametrize(("kind", "fmt"), [(pa.int32(), "<i"), (pa.int64(), "<q")])
def test_integers_including_negatives_extremes_and_nulls(kind: pa.DataType, fmt: str, salt: bytes) -> None:
    bits = 8 * struct.calcsize(fmt)
    values = [0, -1, 1, None, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1, None, 123456, -98765]
    result = sha256_array(pa.array(values, kind), salt)
    assert result.type == kind
    assert result.to_pylist() == expected_ints(values, fmt, salt)


@pytest.mark.parametrize("salt", SALTS)
@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.string_view()])
def test_strings_empty_null_and_non_ascii_as_lowercase_hex(kind: pa.DataType, salt: bytes) -> None:
    values = ["", None, "abc", "é", "٣٤", "😀👍🏽", "e\u0301", "x" * 200, None, ""]
    result = sha256_array(pa.array(values, kind), salt)
    assert result.type == kind
    assert result.to_pylist() == [None if v is None else digest(v.encode(), salt).hex() for v in values]


@pytest.mark.parametrize("salt", SALTS)
@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary(), pa.binary_view()])
def test_binary_as_raw_32_byte_digests(kind: pa.DataType, salt: bytes) -> None:
    values = [b"", None, b"\x00", b"\xff\xfe\x80", bytes(range(256)), None, b"abc"]
    result = sha256_array(pa.array(values, kind), salt)
    assert result.type == kind
    assert result.to_pylist() == [None if v is None else digest(v, salt) for v in values]


@pytest.mark.parametrize("salt", SALTS)
def test_sliced_arrays_hash_only_their_window(salt: bytes) -> None:
    ints = pa.array([None, 5, -6, 7, None, 8, 9], pa.int32()).slice(1, 5)
    assert sha256_array(ints, salt).to_pylist() == expected_ints(ints.to_pylist(), "<i", salt)
    longs = pa.array([1, 2, 3, None, 4, 5, 6], pa.int64()).slice(2, 5)
    assert sha256_array(longs, salt).to_pylist() == expected_ints(longs.to_pylist(), "<q", salt)
    texts = pa.array(["a", "bb", None, "ccc", "", "dddd", "e"]).slice(1, 5)
    assert sha256_array(texts, salt).to_pylist() == [
        None if v is None else digest(v.encode(), salt).hex() for v in texts.to_pylist()
    ]
    blobs = pa.array([b"a", None, b"bb", b"", b"ccc", b"d"], pa.large_binary()).slice(2, 4)
    assert sha256_array(blobs, salt).to_pylist() == [digest(v, salt) for v in blobs.to_pylist()]


def test_salt_changes_every_digest_and_prefixes_the_value() -> None:
    values = pa.array(["a", "b", "c", "d"])
    unsalted = sha256_array(values, b"").to_pylist()
    salted = sha256_array(values, SALT).to_pylist()
    assert all(u != s for u, s in zip(unsalted, salted, strict=True))
    assert salted[0] == hashlib.sha256(SALT + b"a").hexdigest() != hashlib.sha256(b"a" + SALT).hexdigest()


def test_all_null_and_empty_arrays() -> None:
    assert sha256_array(pa.array([None] * 5, pa.int64()), SALT).to_pylist() == [None] * 5
    assert sha256_array(pa.array([None] * 5, pa.string()), SALT).to_pylist() == [None] * 5
    assert sha256_array(pa.array([], pa.binary()), SALT).to_pylist() == []


def test_threads_each_get_correct_results() -> None:
    values = [f"row-{i}" for i in range(50)]
    expected = [digest(v.encode(), SALT).hex() for v in values]
    results: list[list[object]] = []
    workers = [
        threading.Thread(target=lambda: results.append(sha256_array(pa.array(values), SALT).to_pylist()))
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert results == [expected] * 4


def test_the_real_threshold_with_random_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    rng = random.Random(7)
    count = sha.DUCKDB_MIN_ROWS + 3
    ints = [None if rng.random() < 0.05 else rng.randint(-(2**31), 2**31 - 1) for _ in range(count)]
    assert sha256_array(pa.array(ints, pa.int32()), SALT).to_pylist() == expected_ints(ints, "<i", SALT)
    texts = [None if rng.random() < 0.05 else rng.randbytes(rng.randint(0, 30)).hex() for _ in range(count)]
    assert sha256_array(pa.array(texts), b"").to_pylist() == [
        None if t is None else digest(t.encode(), b"").hex() for t in texts
    ]


def test_connection_is_locked_down() -> None:
    connection = sha._duckdb()
    settings = dict(
        connection.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN "
            "('threads', 'enable_external_access', 'lock_configuration', 'python_enable_replacements')"
        ).fetchall()
    )
    assert settings == {
        "threads": "1",
        "enable_external_access": "false",
        "lock_configuration": "true",
        "python_enable_replacements": "false",
    }
    with pytest.raises(Exception, match="locked"):
        connection.execute("SET enable_external_access = true")


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_hex_pair_decoding_matches_binascii_with_nulls_empties_and_slices(kind: pa.DataType) -> None:
    rng = random.Random(11)
    values = [None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 1, 4, 8, 32])).hex() for _ in range(500)]
    array = pa.array(values, kind)
    for window in (array, array.slice(3, 200), array.slice(499, 1), array.slice(10, 0)):
        expected = b"".join(bytes.fromhex(v) for v in window.to_pylist() if v is not None)
        assert sha._decoded_hex_bytes(window).to_pybytes() == expected


def test_every_hex_pair_in_either_case_decodes_to_its_byte() -> None:
    every_byte = bytes(range(256))
    pairs = pa.array([every_byte.hex(), every_byte.hex().upper(), "aB" * 4 + "Cd"])
    assert sha._decoded_hex_bytes(pairs).to_pybytes() == every_byte * 2 + b"\xab" * 4 + b"\xcd"


def test_hex_at_an_odd_byte_offset_still_decodes() -> None:
    shifted = pa.array(["a", "00ff7f", "10"]).slice(1)  # its data starts at byte 1: no uint16 view there
    assert sha._decoded_hex_bytes(shifted).to_pybytes() == b"\x00\xff\x7f\x10"


def test_every_thread_hashes_on_a_cursor_of_one_database() -> None:
    """A scan's threads are new for every scan: each must not open a database of its own (~30 ms each)."""
    blobs = pa.array([b"a", None, b"bc"], pa.binary())
    expected = sha._duckdb_hex(blobs, SALT).to_pylist()
    database = sha._database()
    seen: list[tuple[object, object, list[object]]] = []

    def hash_once() -> None:
        seen.append((sha._database(), sha._duckdb(), sha._duckdb_hex(blobs, SALT).to_pylist()))

    for _ in range(3):
        worker = threading.Thread(target=hash_once)
        worker.start()
        worker.join()
    assert [row[0] for row in seen] == [database] * 3
    assert len({id(row[1]) for row in seen} | {id(sha._duckdb())}) == 4  # a cursor per thread
    assert [row[2] for row in seen] == [expected] * 3
