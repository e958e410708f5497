"""Every column action on every applicable Arrow type, checked against the spec and independent code."""

from __future__ import annotations

import datetime as dt
import hashlib
import random
import struct
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from sqe.errors import RestrictionApplyError
from sqe.restrictions import ACTIONS, apply_action
from sqe.restrictions.sha import sha256_array
from tests.unit.sqe.restrictions.restriction_fixtures import REFERENCE

UTC = dt.UTC
SALT = bytes(range(16))
STRING_TYPES = [pa.string(), pa.large_string(), pa.string_view()]


def run(action: str, values: list[Any], arrow_type: pa.DataType, salt: bytes = SALT) -> list[Any]:
    result = apply_action(action, pa.array(values, type=arrow_type), salt=salt)
    assert result.type == arrow_type
    return list(result.to_pylist())


# ------------------------------------------------------------------------------------- string masks


@pytest.mark.parametrize(
    ("action", "text", "expected"),
    [
        ("mask-alphanum", "prashant010696@gmail.com", "xxxxxxxxnnnnnn@xxxxx.xxx"),
        ("show-first-4", "prashant010696@gmail.com", "prasxxxxnnnnnn@xxxxx.xxx"),
        ("show-last-4", "4111-1111-1111-4444", "nnnn-nnnn-nnnn-4444"),
        ("mask-alphanum", "(555) 010-99.12", "(nnn)xnnn-nn.nn"),
        ("mask-alphanum", "a_b!c d#e", "xxxxxxxxx"),
        ("mask-alphanum", "٠١٢٣", "xxxx"),  # Arabic-Indic digits are not ASCII digits
        ("mask-alphanum", "\uff11\uff12", "xx"),  # fullwidth digits either
        ("mask-alphanum", "Ωé😀", "xxx"),
        ("mask-alphanum", "e\u0301", "xx"),  # a combining mark is its own code point
        ("mask-alphanum", "👩‍💻", "xxx"),  # ZWJ sequence: three code points
        ("show-first-4", "é😀٣ab12", "é😀٣axnn"),
        ("show-last-4", "12é😀٣a", "nné😀٣a"),
        ("show-first-4", "e\u0301e\u0301e", "e\u0301e\u0301x"),
        ("show-last-4", "😀😀😀😀😀", "x😀😀😀😀"),
    ],
)
def test_string_masks_match_the_spec_examples(action: str, text: str, expected: str) -> None:
    for arrow_type in STRING_TYPES:
        assert run(action, [text], arrow_type) == [expected]


@pytest.mark.parametrize("action", sorted(REFERENCE))
def test_string_masks_on_short_strings_nulls_and_empties(action: str) -> None:
    values = [None, "", "a", "1é", "ab3", "😀bc4", "abc12", "a\u0301b"]
    expected = [None if value is None else REFERENCE[action](value) for value in values]
    assert run(action, values, pa.large_string()) == expected
    if action != "mask-alphanum":
        assert run(action, ["abcd", "abcde"], pa.string())[0] == "abcd"  # up to 4 code points: unchanged


@pytest.mark.parametrize("action", sorted(REFERENCE))
@pytest.mark.parametrize("arrow_type", STRING_TYPES, ids=str)
def test_string_masks_on_ascii_only_data(action: str, arrow_type: pa.DataType) -> None:
    # ASCII-only arrays take the byte-slicing path; lengths 0 to 6 cover both sides of the 4 kept
    values = [None, "", "a", "ab", "a1c", "ab1d", "(b1d@", "ab12-4", None]
    expected = [None if value is None else REFERENCE[action](value) for value in values]
    assert run(action, values, arrow_type) == expected
    sliced = pa.array(["zz", *values], arrow_type).slice(1)
    assert apply_action(action, sliced, salt=SALT).to_pylist() == expected


@pytest.mark.parametrize("action", sorted(REFERENCE))
@pytest.mark.parametrize("arrow_type", STRING_TYPES, ids=str)
def test_string_masks_agree_with_per_code_point_reference_on_random_text(action: str, arrow_type: pa.DataType) -> None:
    rng = random.Random(4)
    alphabet = "aZ09 @.-(),_!é٣😀\u0301\u4e2d\x00\x7f"
    values: list[str | None] = [
        None if rng.random() < 0.1 else "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9)))
        for _ in range(500)
    ]
    expected = [None if value is None else REFERENCE[action](value) for value in values]
    assert run(action, values, arrow_type) == expected


@pytest.mark.parametrize("action", sorted(REFERENCE))
def test_string_masks_on_sliced_and_dictionary_arrays(action: str) -> None:
    array = pa.array(["skip", "é😀ab12345", None, "xy"], pa.large_string())
    sliced = array.slice(1, 3)
    expected = [REFERENCE[action]("é😀ab12345"), None, "xy" if action != "mask-alphanum" else "xx"]
    assert apply_action(action, sliced, salt=SALT).to_pylist() == expected
    encoded = sliced.dictionary_encode()
    result = apply_action(action, encoded, salt=SALT)
    assert result.type == encoded.type
    assert result.to_pylist() == expected


def test_null_slots_with_stray_bytes_do_not_shift_other_values() -> None:
    # Arrow allows a null slot to cover bytes; they must not leak into or shift neighbouring values.
    data = pa.py_buffer("abé9xyz".encode())
    offsets = pa.array([0, 2, 5, 7], pa.int32()).buffers()[1]
    validity = pa.array([True, False, True]).buffers()[1]
    array = pa.Array.from_buffers(pa.string(), 3, [validity, offsets, data])
    assert apply_action("mask-alphanum", array, salt=SALT).to_pylist() == ["xx", None, "xx"]


# ------------------------------------------------------------------------------------- fixed values


@pytest.mark.parametrize(
    ("arrow_type", "expected"),
    [
        (pa.bool_(), False),
        (pa.int32(), 0),
        (pa.int64(), 0),
        (pa.float32(), 0.0),
        (pa.float64(), 0.0),
        (pa.decimal128(9, 2), Decimal("0.00")),
        (pa.string(), "XXXXXXXX"),
        (pa.large_string(), "XXXXXXXX"),
        (pa.date32(), dt.date(1970, 1, 1)),
        (pa.time64("us"), dt.time(0, 0)),
        (pa.timestamp("us"), dt.datetime(1970, 1, 1)),
        (pa.timestamp("us", tz="UTC"), dt.datetime(1970, 1, 1, tzinfo=UTC)),
        (pa.binary(3), b"\x00\x00\x00"),
        (pa.large_binary(), b""),
        (pa.large_list(pa.large_string()), []),
        (pa.map_(pa.large_string(), pa.int64()), []),
    ],
    ids=str,
)
def test_mask_to_fixed_value_per_type_replaces_nulls_too(arrow_type: pa.DataType, expected: Any) -> None:
    result = apply_action("mask-to-fixed-value", pa.nulls(3, arrow_type), salt=SALT)
    assert result.type == arrow_type
    assert result.null_count == 0
    assert result.to_pylist() == [expected] * 3


def test_mask_to_fixed_value_for_nanosecond_timestamps_and_uuid() -> None:
    for tz in (None, "UTC"):
        result = apply_action("mask-to-fixed-value", pa.array([5, None], pa.timestamp("ns", tz=tz)), salt=SALT)
        assert result.type == pa.timestamp("ns", tz=tz)
        assert result.cast(pa.int64()).to_pylist() == [0, 0]
    uuids = pa.array([b"\x01" * 16, None], pa.uuid())
    result = apply_action("mask-to-fixed-value", uuids, salt=SALT)
    assert result.type == pa.uuid()
    assert result.storage.to_pylist() == [bytes(16), bytes(16)]


def test_mask_to_fixed_value_on_structs_is_recursive() -> None:
    inner = pa.struct([pa.field("zip", pa.int32(), nullable=False), pa.field("when", pa.date32())])
    outer = pa.struct(
        [
            pa.field("city", pa.large_string()),
            pa.field("inner", inner),
            pa.field("tags", pa.large_list(pa.large_string())),
            pa.field("attrs", pa.map_(pa.large_string(), pa.int64())),
        ]
    )
    values = [
        {
            "city": "Paris",
            "inner": {"zip": 7, "when": dt.date(2020, 1, 1)},
            "tags": ["a"],
            "attrs": [("k", 1)],
        }
    ]
    result = apply_action("mask-to-fixed-value", pa.array([*values, None], outer), salt=SALT)
    assert result.type == outer
    fixed = {"city": "XXXXXXXX", "inner": {"zip": 0, "when": dt.date(1970, 1, 1)}, "tags": [], "attrs": []}
    assert result.to_pylist() == [fixed, fixed]


def test_replace_with_null_on_any_type() -> None:
    for array in (
        pa.array([1, 2], pa.int32()),
        pa.array(["a", None], pa.large_string()),
        pa.array([{"a": 1}], pa.struct([pa.field("a", pa.int64())])),
        pa.array([[1]], pa.large_list(pa.int64())),
        pa.array([b"\x00" * 16], pa.uuid()),
    ):
        result = apply_action("replace-with-null", array, salt=SALT)
        assert result.type == array.type
        assert result.null_count == len(array)


# --------------------------------------------------------------------------------------- truncation


def us(value: dt.datetime) -> int:
    return round((value.replace(tzinfo=UTC) - dt.datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1e6)


@pytest.mark.parametrize(
    ("value", "year", "month"),
    [
        (dt.datetime(2024, 7, 15, 13, 45, 1, 5), dt.datetime(2024, 1, 1), dt.datetime(2024, 7, 1)),
        (dt.datetime(2024, 12, 31, 23, 59, 59, 999999), dt.datetime(2024, 1, 1), dt.datetime(2024, 12, 1)),
        (dt.datetime(2025, 1, 1), dt.datetime(2025, 1, 1), dt.datetime(2025, 1, 1)),
        (dt.datetime(2024, 2, 29, 12), dt.datetime(2024, 1, 1), dt.datetime(2024, 2, 1)),
        (dt.datetime(2024, 3, 1), dt.datetime(2024, 1, 1), dt.datetime(2024, 3, 1)),
        (dt.datetime(1969, 12, 31, 23, 59, 59, 999999), dt.datetime(1969, 1, 1), dt.datetime(1969, 12, 1)),
        (dt.datetime(1900, 3, 15), dt.datetime(1900, 1, 1), dt.datetime(1900, 3, 1)),
    ],
)
def test_truncate_timestamps_in_every_unit_and_zone(value: dt.datetime, year: dt.datetime, month: dt.datetime) -> None:
    for unit, scale in (("us", 1), ("ns", 1000)):
        for tz in (None, "UTC", "America/New_York", "+05:30"):
            arrow_type = pa.timestamp(unit, tz=tz)
            array = pa.array([us(value) * scale, None], pa.int64()).view(arrow_type)
            for action, expected in (("truncate-to-year", year), ("truncate-to-month", month)):
                result = apply_action(action, array, salt=SALT)
                assert result.type == arrow_type
                assert result.view(pa.int64()).to_pylist() == [us(expected) * scale, None], (unit, tz, action)


def test_zoned_timestamps_truncate_in_utc_not_local_time() -> None:
    # 2024-12-31T23:30-05:00 is 2025-01-01T04:30Z: the year is 2025 in UTC, 2024 in New York.
    instant = dt.datetime(2024, 12, 31, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    micros = us(instant.astimezone(UTC).replace(tzinfo=None))
    array = pa.array([micros], pa.int64()).view(pa.timestamp("us", tz="America/New_York"))
    result = apply_action("truncate-to-year", array, salt=SALT)
    assert result.view(pa.int64()).to_pylist() == [us(dt.datetime(2025, 1, 1))]
    result = apply_action("truncate-to-month", array, salt=SALT)
    assert result.view(pa.int64()).to_pylist() == [us(dt.datetime(2025, 1, 1))]


@pytest.mark.parametrize(
    ("value", "year", "month"),
    [
        (dt.date(2024, 7, 15), dt.date(2024, 1, 1), dt.date(2024, 7, 1)),
        (dt.date(2024, 12, 31), dt.date(2024, 1, 1), dt.date(2024, 12, 1)),
        (dt.date(1969, 12, 31), dt.date(1969, 1, 1), dt.date(1969, 12, 1)),
        (dt.date(1, 1, 1), dt.date(1, 1, 1), dt.date(1, 1, 1)),
        (dt.date(9999, 12, 31), dt.date(9999, 1, 1), dt.date(9999, 12, 1)),
    ],
)
def test_truncate_dates(value: dt.date, year: dt.date, month: dt.date) -> None:
    assert run("truncate-to-year", [value, None], pa.date32()) == [year, None]
    assert run("truncate-to-month", [value, None], pa.date32()) == [month, None]


def test_truncation_that_leaves_the_nanosecond_range_fails() -> None:
    near_minimum = pa.array([-(2**63) + 10**15], pa.int64()).view(pa.timestamp("ns"))  # 1677-10
    with pytest.raises(RestrictionApplyError, match="outside the range"):
        apply_action("truncate-to-year", near_minimum, salt=SALT)


# ---------------------------------------------------------------------------------------------- SHA-256


def sha(data: bytes, salt: bytes = b"") -> bytes:
    return hashlib.sha256(salt + data).digest()


@pytest.mark.parametrize(("action", "salt"), [("sha-256-global", b""), ("sha-256-query-local", SALT)])
def test_sha256_encodings_match_independent_hashlib_and_struct(action: str, salt: bytes) -> None:
    ints = [0, 1, -1, 2**31 - 1, -(2**31), None]
    expected_ints = [None if v is None else struct.unpack("<i", sha(struct.pack("<i", v), salt)[:4])[0] for v in ints]
    assert run(action, ints, pa.int32()) == expected_ints
    longs = [0, -1, 2**63 - 1, -(2**63), 123456789012345, None]
    expected_longs = [None if v is None else struct.unpack("<q", sha(struct.pack("<q", v), salt)[:8])[0] for v in longs]
    assert run(action, longs, pa.int64()) == expected_longs
    texts = ["", "abc", "é😀", "a\u0301", None]
    expected_texts = [None if t is None else sha(t.encode(), salt).hex() for t in texts]
    for arrow_type in STRING_TYPES:
        assert run(action, texts, arrow_type) == expected_texts
    blobs = [b"", b"\x00\xff", None]
    expected_blobs = [None if b is None else sha(b, salt) for b in blobs]
    for arrow_type in (pa.binary(), pa.large_binary(), pa.binary_view()):
        assert run(action, blobs, arrow_type) == expected_blobs


def test_sha256_of_abc_is_the_published_test_vector() -> None:
    digest = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert run("sha-256-global", ["abc"], pa.string()) == [digest]
    assert run("sha-256-global", [b"abc"], pa.binary()) == [bytes.fromhex(digest)]


def test_query_local_salt_changes_the_output_and_is_required() -> None:
    values = ["alice", "bob"]
    first = run("sha-256-query-local", values, pa.string(), salt=b"a" * 16)
    second = run("sha-256-query-local", values, pa.string(), salt=b"b" * 16)
    assert first != second
    assert run("sha-256-global", values, pa.string(), salt=b"a" * 16) == run(
        "sha-256-global", values, pa.string(), salt=b"b" * 16
    )
    for bad_salt in (b"", b"x" * 15):
        with pytest.raises(RestrictionApplyError, match="at least 16 bytes"):
            apply_action("sha-256-query-local", pa.array(values), salt=bad_salt)


def test_sha256_on_sliced_dictionary_and_repetitive_arrays() -> None:
    ints = pa.array([7, None, 8, 9], pa.int32()).slice(1, 3)
    assert apply_action("sha-256-global", ints, salt=SALT).to_pylist() == [
        None,
        struct.unpack("<i", sha(struct.pack("<i", 8))[:4])[0],
        struct.unpack("<i", sha(struct.pack("<i", 9))[:4])[0],
    ]
    encoded = pa.array(["x", "y", None, "x"]).dictionary_encode()
    result = apply_action("sha-256-query-local", encoded, salt=SALT)
    assert result.type == encoded.type
    assert result.to_pylist() == [sha(b"x", SALT).hex(), sha(b"y", SALT).hex(), None, sha(b"x", SALT).hex()]
    # many repeats take the hash-each-distinct-value-once path; the answer must be the same
    repetitive = pa.array([i % 3 if i % 7 else None for i in range(20_000)], pa.int64())
    expected = [
        None if v is None else struct.unpack("<q", sha(struct.pack("<q", v))[:8])[0] for v in repetitive.to_pylist()
    ]
    assert sha256_array(repetitive, b"").to_pylist() == expected
    strings = pa.array([f"v{i % 5}" for i in range(10_000)], pa.large_string())
    assert sha256_array(strings, SALT).to_pylist() == [sha(v.encode(), SALT).hex() for v in strings.to_pylist()]


# -------------------------------------------------------------------------------------- wrong types


@pytest.mark.parametrize(
    ("action", "array"),
    [
        ("mask-alphanum", pa.array([1], pa.int64())),
        ("show-first-4", pa.array([b"x"], pa.binary())),
        ("truncate-to-year", pa.array([1], pa.int64())),
        ("truncate-to-month", pa.array(["2024-01-01"])),
        ("sha-256-global", pa.array([1.0])),
        ("sha-256-global", pa.array([b"\x00" * 16], pa.uuid())),
        ("sha-256-query-local", pa.array([b"abc"], pa.binary(3))),
    ],
)
def test_an_action_on_the_wrong_arrow_type_fails(action: str, array: pa.Array) -> None:
    with pytest.raises(RestrictionApplyError, match=action):
        apply_action(action, array, salt=SALT)


def test_there_are_exactly_nine_actions() -> None:
    assert len(ACTIONS) == 9
    assert set(ACTIONS) == {
        "mask-alphanum",
        "show-first-4",
        "show-last-4",
        "mask-to-fixed-value",
        "replace-with-null",
        "truncate-to-year",
        "truncate-to-month",
        "sha-256-global",
        "sha-256-query-local",
    }
