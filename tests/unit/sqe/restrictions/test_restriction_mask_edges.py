"""The fast SHA-256 and truncation paths at their edges, against plain references on every value.

SHA-256 against hashlib per value (both the per-value and the DataFusion path, whose digests are cut into
integer prefixes and hex on whole buffers); truncation against Arrow's floor_temporal on every value
(``truncate_reference``), at the cached calendar's first and last day, just outside it, and at the limits of
each physical type, with arbitrary values left in null slots and windows at odd offsets.
"""

from __future__ import annotations

import hashlib
import random
import struct
from typing import Any

import pyarrow as pa
import pytest

from sqe.errors import RestrictionApplyError
from sqe.restrictions import _native, sha
from sqe.restrictions.sha import _DEDUPE_MIN_ROWS, VECTOR_MIN_ROWS, sha256_array
from sqe.restrictions.temporal import (
    CALENDAR_DAYS,
    CALENDAR_FIRST_DAY,
    _layout,
    _through_calendar_in_c,
    truncate_reference,
    truncate_temporal,
)

SALTS = [b"", b"0123456789abcdef\x00'\"\\"]
HASHED_TYPES = [
    pa.int32(),
    pa.int64(),
    pa.string(),
    pa.large_string(),
    pa.binary(),
    pa.large_binary(),
    pa.string_view(),
    pa.binary_view(),
]
TEMPORAL_TYPES = [
    pa.date32(),
    pa.timestamp("s"),
    pa.timestamp("ms", tz="UTC"),
    pa.timestamp("us", tz="Asia/Kolkata"),
    pa.timestamp("ns"),
    pa.timestamp("ns", tz="-03:00"),
]


def expected_digests(array: pa.Array, salt: bytes) -> list[Any]:
    kind = array.type
    out: list[Any] = []
    for value in array.to_pylist():
        if value is None:
            out.append(None)
        elif pa.types.is_integer(kind):
            fmt = "<i" if kind.bit_width == 32 else "<q"
            digest = hashlib.sha256(salt + struct.pack(fmt, value)).digest()
            out.append(struct.unpack(fmt, digest[: kind.byte_width])[0])
        elif isinstance(value, str):
            out.append(hashlib.sha256(salt + value.encode()).hexdigest())
        else:
            out.append(hashlib.sha256(salt + value).digest())
    return out


def random_values(kind: pa.DataType, count: int, *, distinct: bool, rng: random.Random) -> pa.Array:
    def one() -> object:
        if rng.random() < 0.1:
            return None
        if pa.types.is_integer(kind):
            limit = 1 << (kind.bit_width - 1)
            return rng.randint(-limit, limit - 1) if distinct else rng.choice([-limit, limit - 1, 0, 1])
        raw = rng.randbytes(rng.randint(0, 40)) if distinct else bytes([rng.randint(0, 3)])
        textual = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
        return raw.hex() if textual else raw

    return pa.array([one() for _ in range(count)], kind)


@pytest.mark.parametrize("distinct", [True, False], ids=["distinct", "repetitive"])
@pytest.mark.parametrize("kind", HASHED_TYPES, ids=str)
def test_sha256_windows_of_a_large_array_match_hashlib(kind: pa.DataType, distinct: bool) -> None:
    """Past the vector threshold and the dedupe minimum (so the repetitive arrays take the dedupe path), and every
    small window of the same buffers: whole, at an odd offset, exactly the threshold, length 1 and empty."""
    count = max(VECTOR_MIN_ROWS, _DEDUPE_MIN_ROWS) + 1037
    array = random_values(kind, count, distinct=distinct, rng=random.Random(str(kind)))
    if not (pa.types.is_string_view(kind) or pa.types.is_binary_view(kind)):  # views are cast before the check
        assert sha._is_repetitive(array) is not distinct
    windows = [array, array.slice(37), array.slice(1, VECTOR_MIN_ROWS), array.slice(5, 1), array.slice(9, 0)]
    for salt in SALTS:
        for window in windows:
            hashed = sha256_array(window, salt)
            assert hashed.type == window.type and hashed.null_count == window.null_count
            assert hashed.to_pylist() == expected_digests(window, salt)


@pytest.mark.parametrize("length", [1, 3, VECTOR_MIN_ROWS + 1])
@pytest.mark.parametrize("kind", HASHED_TYPES, ids=str)
def test_sha256_of_all_null_arrays_stays_all_null(kind: pa.DataType, length: int) -> None:
    hashed = sha256_array(pa.nulls(length, kind), SALTS[1])
    assert hashed.type == kind and hashed.null_count == length


def reference_or_error(array: pa.Array, unit: str) -> pa.Array | type[Exception]:
    try:
        return truncate_reference(array, unit)
    except RestrictionApplyError:
        return RestrictionApplyError


def assert_truncation_matches(array: pa.Array, unit: str) -> None:
    """Both the C pass through the calendar (falling back where a day is outside it) and the Arrow paths."""
    expected = reference_or_error(array, unit)
    for native in (True, False):
        if expected is RestrictionApplyError:
            with pytest.raises(RestrictionApplyError):
                truncate_temporal(array, unit, native=native)
            continue
        assert isinstance(expected, pa.Array)
        got = truncate_temporal(array, unit, native=native)
        assert got.type == array.type
        assert got.equals(expected), (native, array, got, expected)


def edge_values(kind: pa.DataType) -> list[int]:
    """The calendar's first and last instants and their neighbours, the epoch's, and the type's limits."""
    _, physical, per_day = _layout(kind)
    low, high = -(1 << (physical.bit_width - 1)), (1 << (physical.bit_width - 1)) - 1
    first, past = CALENDAR_FIRST_DAY * per_day, (CALENDAR_FIRST_DAY + CALENDAR_DAYS) * per_day
    candidates = [first - 1, first, past - 1, past, -1, 0, 1, low, low + 1, low + per_day, high - per_day, high]
    return [value for value in candidates if low <= value <= high]


def with_value_in_null_slot(garbage: int, values: list[int], kind: pa.DataType) -> pa.Array:
    """A null first slot still holding ``garbage`` (as decoded files may leave it), then ``values``."""
    physical = _layout(kind)[1]
    data = pa.array([garbage, *values], physical)
    validity = pa.array([False] + [True] * len(values)).buffers()[1]
    return pa.Array.from_buffers(kind, len(values) + 1, [validity, data.buffers()[1]])


@pytest.mark.parametrize("unit", ["year", "month"])
@pytest.mark.parametrize("kind", TEMPORAL_TYPES, ids=str)
def test_truncation_at_the_calendar_edges_and_type_limits(kind: pa.DataType, unit: str) -> None:
    _, physical, per_day = _layout(kind)
    low = -(1 << (physical.bit_width - 1))
    for edge in edge_values(kind):
        day_before = max(low, edge - per_day)
        for values in ([edge], [edge, 0], [None, edge], [edge, day_before]):
            assert_truncation_matches(pa.array(values, physical).view(kind), unit)
        with_garbage = with_value_in_null_slot(edge, [0, 5], kind)
        for window in (with_garbage, with_garbage.slice(1), with_garbage.slice(0, 1)):
            assert_truncation_matches(window, unit)


@pytest.mark.parametrize("unit", ["year", "month"])
@pytest.mark.parametrize("kind", TEMPORAL_TYPES, ids=str)
def test_truncation_of_random_values_around_each_edge(kind: pa.DataType, unit: str) -> None:
    _, physical, per_day = _layout(kind)
    low, high = -(1 << (physical.bit_width - 1)), (1 << (physical.bit_width - 1)) - 1
    rng = random.Random(f"{kind}{unit}")
    edges = edge_values(kind)
    for _ in range(150):
        centre, spread = rng.choice(edges), rng.choice([1, per_day, 400 * per_day, 100_000 * per_day])
        values = [
            None if rng.random() < 0.1 else max(low, min(high, centre + rng.randint(-spread, spread)))
            for _ in range(rng.randint(1, 50))
        ]
        array = pa.array(values, physical).view(kind)
        assert_truncation_matches(array, unit)
        assert_truncation_matches(array.slice(1), unit)


@pytest.mark.parametrize("kind", TEMPORAL_TYPES, ids=str)
def test_truncation_of_empty_and_all_null_arrays(kind: pa.DataType) -> None:
    for unit in ("year", "month"):
        assert len(truncate_temporal(pa.array([], _layout(kind)[1]).view(kind), unit)) == 0
        truncated = truncate_temporal(pa.nulls(4, kind), unit)
        assert truncated.type == kind and truncated.null_count == 4


@pytest.mark.parametrize("length", [50, VECTOR_MIN_ROWS + 50])
@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()], ids=str)
def test_sha256_of_null_slots_that_still_span_bytes(kind: pa.DataType, length: int) -> None:
    """Arrow lets a null slot cover bytes of the data buffer (kernels such as if_else leave them): the digests
    of the valid slots around them, on both paths, are still each value's own."""
    rng = random.Random(length)
    values = [rng.randbytes(rng.randint(0, 20)).hex().encode() for _ in range(length)]
    nulls = [rng.random() < 0.2 for _ in range(length)]
    offsets = [0]
    for value in values:
        offsets.append(offsets[-1] + len(value))
    offset_type = pa.int64() if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind) else pa.int32()
    validity = pa.array([not null for null in nulls]).buffers()[1]
    array = pa.Array.from_buffers(
        kind, length, [validity, pa.array(offsets, offset_type).buffers()[1], pa.py_buffer(b"".join(values))]
    )
    array.validate(full=True)
    salt = SALTS[1]
    for window in (array, array.slice(3)):
        expected = [
            None if null else hashlib.sha256(salt + value)
            for value, null in zip(values[window.offset :], nulls[window.offset :], strict=True)
        ]
        textual = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        assert sha256_array(window, salt).to_pylist() == [
            None if d is None else (d.hexdigest() if textual else d.digest()) for d in expected
        ]


@pytest.mark.parametrize("kind", TEMPORAL_TYPES, ids=str)
def test_the_c_pass_takes_arrays_inside_the_calendar_and_leaves_the_others(kind: pa.DataType) -> None:
    # so that the edge tests above run it, not only the Arrow paths it falls back to
    _, physical, per_day = _layout(kind)
    naive = _layout(kind)[0]
    inside = pa.array([0, -1, None, 5 * per_day], physical).view(kind)
    taken = _through_calendar_in_c(inside, "month", naive, per_day)
    assert taken is not None and taken.equals(truncate_reference(inside, "month"))
    past = (CALENDAR_FIRST_DAY + CALENDAR_DAYS) * per_day
    if past <= (1 << (physical.bit_width - 1)) - 1:  # a null slot holding a day past the calendar: left alone
        assert _through_calendar_in_c(with_value_in_null_slot(past, [0], kind), "month", naive, per_day) is None


def test_the_c_floor_entry_point_refuses_what_it_cannot_read_or_write() -> None:
    assert _native.masks is not None
    floor = _native.masks.floor_through_table
    values, table = pa.array([0, 1], pa.int64()).buffers()[1], pa.array([0] * 4, pa.int64()).buffers()[1]
    with pytest.raises(ValueError, match="units of a day"):
        floor(values, 0, 2, 3600, table, 0, pa.allocate_buffer(16))  # an hour is no unit of a day
    with pytest.raises(ValueError, match="values or output shorter than the array"):
        floor(values, 1, 2, 86400, table, 0, pa.allocate_buffer(16))
    with pytest.raises(ValueError, match="values or output shorter than the array"):
        floor(values, 0, 2, 86400, table, 0, pa.allocate_buffer(8))
    with pytest.raises(TypeError, match="out is not a writable buffer"):
        floor(values, 0, 2, 86400, table, 0, b"\0" * 16)
    assert floor(values, 0, 2, 86400, table, 0, pa.allocate_buffer(16)) is True
    assert floor(values, 0, 2, 86400, table, 5, pa.allocate_buffer(16)) is False  # day 0 is before the table
