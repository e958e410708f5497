"""Property tests (hypothesis): the fast mask paths give exactly what the reference paths give.

Truncation's per-day floor table against Arrow's floor_temporal on every value; the string masks' ASCII and
multi-byte routes against the spec's per-code-point rules; DataFusion's salted SHA-256 against hashlib.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqe.errors import RestrictionApplyError
from sqe.restrictions import apply_action, sha
from sqe.restrictions.temporal import (
    CALENDAR_DAYS,
    CALENDAR_FIRST_DAY,
    _all_within,
    _calendar_table,
    _layout,
    _truncate_by_day_table,
    truncate_reference,
    truncate_temporal,
)
from tests.unit.sqe.restrictions.restriction_fixtures import REFERENCE

TEMPORAL_TYPES = [
    pa.date32(),
    pa.timestamp("s"),
    pa.timestamp("ms", tz="UTC"),
    pa.timestamp("us", tz="America/New_York"),
    pa.timestamp("ns"),
    pa.timestamp("ns", tz="+05:30"),
]
UNITS = {"truncate-to-year": "year", "truncate-to-month": "month"}


def with_garbage_in_null_slots(values: list[int], nulls: list[bool], kind: pa.DataType) -> pa.Array:
    """Every slot holds a value (as a Parquet reader may leave it); ``nulls`` marks the slots that are null."""
    physical = pa.int32() if pa.types.is_date32(kind) else pa.int64()
    data = pa.array(values, physical)
    validity = pa.array([not n for n in nulls], pa.bool_())
    bitmap = validity.buffers()[1] if any(nulls) else None
    return pa.Array.from_buffers(kind, len(values), [bitmap, data.buffers()[1]])


def nullable_slice(draw: st.DrawFn, values: list[int], kind: pa.DataType, *, min_rows: int) -> pa.Array:
    """``values`` as ``kind`` with drawn null slots (garbage under them), sliced at drawn bounds."""
    nulls = draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values)))
    array = with_garbage_in_null_slots(values, nulls, kind)
    start = draw(st.integers(0, len(values) - 1))
    return array.slice(start, draw(st.integers(min_rows, len(values) - start)))


def reference_or_error(array: pa.Array, unit: str) -> list[Any] | type[Exception]:
    try:
        return list(truncate_reference(array, unit).view(_layout(array.type)[1]).to_pylist())
    except RestrictionApplyError:
        return RestrictionApplyError


@st.composite
def temporal_arrays(draw: st.DrawFn) -> pa.Array:
    kind = draw(st.sampled_from(TEMPORAL_TYPES))
    bits = 32 if pa.types.is_date32(kind) else 64
    low_limit, high_limit = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    per_day = _layout(kind)[2]
    centre = draw(st.integers(low_limit, high_limit))
    spread = draw(st.sampled_from([per_day, 40 * per_day, 3000 * per_day, 200_000 * per_day, 2**bits]))
    low, high = max(low_limit, centre - spread), min(high_limit, centre + spread)
    values = draw(st.lists(st.integers(low, high), min_size=1, max_size=60))
    return nullable_slice(draw, values, kind, min_rows=0)


@settings(max_examples=300, deadline=None)
@given(array=temporal_arrays(), action=st.sampled_from(sorted(UNITS)))
def test_truncation_matches_floor_temporal_on_every_value(array: pa.Array, action: str) -> None:
    expected = reference_or_error(array, UNITS[action])
    if expected is RestrictionApplyError:
        with pytest.raises(RestrictionApplyError):
            apply_action(action, array, salt=b"")
        return
    result = apply_action(action, array, salt=b"")
    assert result.type == array.type
    assert result.view(_layout(array.type)[1]).to_pylist() == expected


@pytest.mark.parametrize("kind", TEMPORAL_TYPES)
def test_the_day_table_is_taken_for_a_realistic_range_and_matches(kind: pa.DataType) -> None:
    naive, physical, per_day = _layout(kind)
    days = [-30_000 + 7 * i for i in range(8000)]  # 1887 to 2123
    values = [d * per_day + (i * 7919) % per_day for i, d in enumerate(days)]
    array = with_garbage_in_null_slots(values, [i % 9 == 0 for i in range(len(values))], kind)
    for unit in UNITS.values():
        fast = _truncate_by_day_table(array, unit, naive, physical, per_day)
        assert fast is not None
        assert fast.view(physical).to_pylist() == truncate_reference(array, unit).view(physical).to_pylist()
        assert fast.null_count == array.null_count


def test_a_range_too_wide_for_a_table_falls_back_to_the_reference() -> None:
    array = pa.array([-(2**62) - 2**61, 2**62], pa.int64()).view(pa.timestamp("ns"))  # 1750 and 2116: 133k days
    naive, physical, per_day = _layout(array.type)
    assert _truncate_by_day_table(array, "year", naive, physical, per_day) is None
    expected = truncate_reference(array, "year").view(pa.int64()).to_pylist()
    assert apply_action("truncate-to-year", array, salt=b"").view(pa.int64()).to_pylist() == expected


@st.composite
def calendar_span_arrays(draw: st.DrawFn) -> pa.Array:
    """Arrays whose every slot (null ones too) lies in the cached calendar's days, with the values a floor
    division gets wrong most easily: midnights, one unit either side, and the span's first and last units."""
    kind = draw(st.sampled_from(TEMPORAL_TYPES))
    per_day = _layout(kind)[2]
    first, last = CALENDAR_FIRST_DAY * per_day, (CALENDAR_FIRST_DAY + CALENDAR_DAYS) * per_day - 1
    midnight = draw(st.integers(CALENDAR_FIRST_DAY + 1, CALENDAR_FIRST_DAY + CALENDAR_DAYS - 1)) * per_day
    # One unit past the last midnight is the day after the span: clamped, every slot stays inside it.
    edges = st.sampled_from([first, last, midnight, midnight - 1, min(midnight + 1, last), 0, -1])
    values = draw(st.lists(st.one_of(edges, st.integers(first, last)), min_size=1, max_size=60))
    return nullable_slice(draw, values, kind, min_rows=1)


@settings(max_examples=300, deadline=None)
@given(array=calendar_span_arrays(), action=st.sampled_from(sorted(UNITS)))
def test_the_cached_calendar_matches_floor_temporal_on_every_value(array: pa.Array, action: str) -> None:
    naive, physical, per_day = _layout(array.type)
    lookups = _calendar_table.cache_info().hits + _calendar_table.cache_info().misses
    result = _truncate_by_day_table(array, UNITS[action], naive, physical, per_day)
    assert _calendar_table.cache_info().hits + _calendar_table.cache_info().misses == lookups + 1  # the calendar path
    assert result is not None and result.type == array.type
    assert result.view(physical).to_pylist() == truncate_reference(array, UNITS[action]).view(physical).to_pylist()
    assert result.null_count == array.null_count


def test_one_day_past_the_calendar_builds_its_own_table_and_matches() -> None:
    per_day = _layout(pa.timestamp("us"))[2]
    past = (CALENDAR_FIRST_DAY + CALENDAR_DAYS) * per_day  # the first instant the calendar does not cover
    array = pa.array([past - 1, past, past + 5], pa.int64()).view(pa.timestamp("us", tz="UTC"))
    expected = truncate_reference(array, "month").view(pa.int64()).to_pylist()
    lookups = _calendar_table.cache_info().hits + _calendar_table.cache_info().misses
    result = truncate_temporal(array, "month", native=False)  # the Arrow paths look at the days' span first
    assert _calendar_table.cache_info().hits + _calendar_table.cache_info().misses == lookups
    assert result.view(pa.int64()).to_pylist() == expected
    # the C pass tries the calendar, finds a day past it and leaves the array to the same paths
    assert apply_action("truncate-to-month", array, salt=b"").view(pa.int64()).to_pylist() == expected


@pytest.mark.parametrize(
    ("indices", "inside"),
    [([0, 5, 9], True), ([0, 10], False), ([-1, 3], False), ([3, None], False), ([], False)],
)
def test_a_take_skips_its_bounds_check_only_when_every_index_is_inside(indices: list[int | None], inside: bool) -> None:
    assert _all_within(pa.array(indices, pa.int32()), 10) is inside


# ------------------------------------------------------------------------------------- string masks


ASCII_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=12)
ANY_TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)
MOSTLY_ASCII = st.text(alphabet=st.sampled_from("ab9@.-( é٣😀\u0301"), max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(st.none() | st.one_of(ASCII_TEXT, ANY_TEXT, MOSTLY_ASCII), max_size=30),
    action=st.sampled_from(sorted(REFERENCE)),
    kind=st.sampled_from([pa.string(), pa.large_string(), pa.string_view()]),
    cut=st.integers(0, 5),
)
def test_string_masks_match_the_per_code_point_rules(
    texts: list[str | None], action: str, kind: pa.DataType, cut: int
) -> None:
    array = pa.array(texts, kind).slice(min(cut, len(texts)))
    expected = [None if t is None else REFERENCE[action](t) for t in texts[min(cut, len(texts)) :]]
    result = apply_action(action, array, salt=b"")
    assert result.type == kind
    assert result.to_pylist() == expected


# ---------------------------------------------------------------------------------------------- SHA-256


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.none() | st.binary(max_size=40), min_size=1, max_size=40),
    salt=st.sampled_from([b"", bytes(16), b"'; --\x00\\\xff" * 3]),
    kind=st.sampled_from([pa.binary(), pa.large_binary()]),
)
def test_vector_salted_binary_digests_match_hashlib(values: list[bytes | None], salt: bytes, kind: pa.DataType) -> None:
    original = sha.VECTOR_MIN_ROWS
    sha.VECTOR_MIN_ROWS = 1  # every array through DataFusion (restored below; hypothesis forbids function fixtures)
    try:
        result = sha.sha256_array(pa.array(values, kind), salt)
    finally:
        sha.VECTOR_MIN_ROWS = original
    assert result.to_pylist() == [None if v is None else hashlib.sha256(salt + v).digest() for v in values]


@pytest.mark.parametrize(("kind", "fmt"), [(pa.int32(), "<i"), (pa.int64(), "<q")])
def test_vector_salted_integers_with_quote_and_nul_bytes_in_the_salt(kind: pa.DataType, fmt: str) -> None:
    salt = b"'\x00\"\\" * 5
    width = struct.calcsize(fmt)
    extremes = [None, 0, -1, -(2 ** (width * 8 - 1)), 2 ** (width * 8 - 1) - 1]
    values = extremes + list(range(-(sha.VECTOR_MIN_ROWS // 2), sha.VECTOR_MIN_ROWS // 2))  # distinct: no dedupe
    result = sha.sha256_array(pa.array(values, kind), salt).to_pylist()
    expected = [
        None if v is None else struct.unpack(fmt, hashlib.sha256(salt + struct.pack(fmt, v)).digest()[:width])[0]
        for v in values
    ]
    assert result == expected
