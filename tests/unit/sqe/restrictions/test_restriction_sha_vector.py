"""The vectorised SHA-256 path (DataFusion; arrays of at least VECTOR_MIN_ROWS values) against independent
hashlib/struct."""

from __future__ import annotations

import hashlib
import random
import struct
import subprocess
import sys
import textwrap
import threading

import pyarrow as pa
import pytest

from sqe.errors import RestrictionApplyError
from sqe.restrictions import sha
from sqe.restrictions.sha import sha256_array

SALT = bytes(range(16, 36))  # 20 bytes: longer than the 16-byte minimum
RAW_SALT = b"\xff\xfe\x80\xc3" + bytes(range(200, 216))  # not UTF-8, as random query-local salts mostly are
SALTS = [b"", SALT, RAW_SALT]


@pytest.fixture(autouse=True)
def small_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sha, "VECTOR_MIN_ROWS", 4)


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
    count = sha.VECTOR_MIN_ROWS + 3
    ints = [None if rng.random() < 0.05 else rng.randint(-(2**31), 2**31 - 1) for _ in range(count)]
    assert sha256_array(pa.array(ints, pa.int32()), SALT).to_pylist() == expected_ints(ints, "<i", SALT)
    texts = [None if rng.random() < 0.05 else rng.randbytes(rng.randint(0, 30)).hex() for _ in range(count)]
    assert sha256_array(pa.array(texts), b"").to_pylist() == [
        None if t is None else digest(t.encode(), b"").hex() for t in texts
    ]


def test_only_binary_views_are_hashed() -> None:
    """DataFusion's concat would turn an integer into its decimal text and hash that: refused before it runs."""
    for values in (pa.array([1, 2, 3], pa.int32()), pa.array(["a"] * 5, pa.string())):
        with pytest.raises(TypeError, match="binary views"):
            sha._digests(values, SALT)


def test_a_datafusion_failure_is_a_typed_error_naming_no_plan() -> None:
    with pytest.raises(RestrictionApplyError) as caught:
        sha._vector_digests(pa.array([1, 2, 3], pa.int32()), b"")  # DataFusion has no sha256 of Int32
    # The exception's type only, never its message (which may quote the plan, salt included).
    assert str(caught.value) == "sha-256: DataFusion failed to hash the column (Exception)"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@pytest.mark.parametrize(
    "digests",
    [
        pa.array([bytes(32), None, bytes(32)], pa.binary()),  # a null
        pa.array([bytes(32), bytes(32)], pa.binary()),  # a row short
        pa.array([bytes(32), bytes(31), bytes(32)], pa.binary()),  # a short digest
        pa.array([bytes(32)] * 3, pa.large_binary()),  # another type
    ],
)
def test_digests_not_exactly_32_bytes_a_row_are_refused(digests: pa.Array) -> None:
    with pytest.raises(RestrictionApplyError, match="DataFusion returned"):
        sha._packed_digests(digests, 3)


def test_each_call_releases_its_input() -> None:
    """A session keeps every table from_arrow registers: one shared session would keep every hashed column."""
    sha._vector_digests(pa.array([b"warm-up"] * 8, pa.binary()), SALT)
    before = pa.total_allocated_bytes()
    for _ in range(5):
        column = pa.array([b"x" * 1000] * 2000, pa.binary())  # 2 MB from Arrow's pool each time
        digests = sha._vector_digests(column, SALT)
        assert len(digests) == 32 * 2000
        del column, digests
    assert pa.total_allocated_bytes() - before < 1_000_000


def test_rows_keep_their_order_in_arrays_of_several_datafusion_batches() -> None:
    """More than one partition or a batch size under the array's length makes DataFusion reorder rows."""
    values = [f"row-{i}" for i in range(3 * 8192 + 7)]  # distinct: no dedupe, every row its own digest
    hashed = sha256_array(pa.array(values), RAW_SALT).to_pylist()
    assert hashed == [digest(v.encode(), RAW_SALT).hex() for v in values]


def test_the_salt_never_reaches_a_log_record() -> None:
    """DataFusion logs its plans at debug level through Python logging (when its loggers are set to debug), so a
    literal salt would be in them. Run in a fresh interpreter: DataFusion caches the logging levels it sees first."""
    program = textwrap.dedent(
        """
        import logging, sys
        import pyarrow as pa
        logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(name)s %(message)s")
        from sqe.restrictions import sha
        for name in sha._DATAFUSION_LOGGERS:  # as an application debugging DataFusion would
            logging.getLogger(name).setLevel(logging.DEBUG)
        sha.VECTOR_MIN_ROWS = 4
        hashed = sha.sha256_array(pa.array([b"a", b"b", None, b"c"] * 3, pa.binary()), b"SECRET-SALT-0123456789")
        print("DIGEST", hashed[0].as_py().hex())
        """
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    salt = b"SECRET-SALT-0123456789"
    assert f"DIGEST {digest(b'a', salt).hex()}" in result.stdout
    assert "datafusion" in result.stdout  # the plans were logged: the check below is not vacuous
    for spelling in (salt.decode(), salt.hex(), ",".join(str(byte) for byte in salt)):
        assert spelling not in result.stdout + result.stderr


def test_datafusion_plans_stay_out_of_debug_logs_unless_asked_for() -> None:
    """``sqe --debug`` sets the root logger to DEBUG: DataFusion's ~270 planning records per hash call stay out,
    and an application that sets one of its loggers itself still gets that logger's records."""
    program = textwrap.dedent(
        """
        import logging, sys
        import pyarrow as pa
        logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="RECORD %(name)s %(levelname)s")
        if sys.argv[1] == "asked":
            logging.getLogger("datafusion_optimizer").setLevel(logging.DEBUG)
        from sqe.restrictions import sha
        sha.VECTOR_MIN_ROWS = 4
        sha.sha256_array(pa.array([b"a", b"b", None, b"c"] * 3, pa.binary()), b"0123456789abcdef")
        """
    )
    logged = {}
    for case in ("default", "asked"):
        result = subprocess.run(
            [sys.executable, "-c", program, case], capture_output=True, text=True, timeout=60, check=True
        )
        logged[case] = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("RECORD ")]
    assert not [name for name, level in logged["default"] if level in ("DEBUG", "INFO")]
    assert {name.split(".")[0] for name, _ in logged["asked"]} == {"datafusion_optimizer"}  # the check can fail
