"""The two implementations of the string masks, the C kernels (``_masks.c``) and the Arrow kernels, against the
per-code-point rules and each other, and the C kernels against malformed arrays."""

from __future__ import annotations

import itertools
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import accumulate, pairwise

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqe.errors import RestrictionApplyError
from sqe.restrictions import apply_action, string_masks
from sqe.restrictions.string_masks import mask_alphanum, show_first_4, show_last_4
from tests.unit.sqe.restrictions.restriction_fixtures import REFERENCE, ref_mask

Mask = Callable[..., pa.Array]
MASKS: dict[str, Mask] = {"mask-alphanum": mask_alphanum, "show-first-4": show_first_4, "show-last-4": show_last_4}
KERNELS = [pytest.param(True, id="c"), pytest.param(False, id="arrow")]
PATHS = ["c-compacting", "c-per-value", "arrow"]


# Long enough for the C kernels' 16-byte steps, with ASCII runs between multi-byte code points.
TEXT = st.one_of(
    st.text(alphabet="abZ09 @.-(),_é٣😀\u0301\x00\x7f", max_size=60),
    st.text(max_size=40),
    st.builds(lambda a, b: a + b, st.text("ab1-@", min_size=15, max_size=40), st.text(max_size=3)),
)


def malformed(offsets: list[int], data: bytes, arrow_type: pa.DataType | None = None) -> pa.Array:
    """A string array over the given buffers, unvalidated (as a buggy reader or a forged batch could make it)."""
    arrow_type = arrow_type or pa.string()
    offset_type = pa.int64() if pa.types.is_large_string(arrow_type) else pa.int32()
    buffers = [None, pa.array(offsets, offset_type).buffers()[1], pa.py_buffer(data)]
    return pa.Array.from_buffers(arrow_type, len(offsets) - 1, buffers)


@contextmanager
def compacting_path(enabled: bool) -> Iterator[None]:
    """mask-alphanum on multi-byte text by the SSSE3 compacting path (where the CPU has it) or the per-value walk."""
    assert string_masks._masks is not None
    string_masks._masks.set_compacting(enabled)
    try:
        yield
    finally:
        string_masks._masks.set_compacting(True)


def test_the_c_kernels_were_built() -> None:
    # setup.py builds them as optional; a machine without a C compiler gets the slower Arrow kernels
    assert string_masks.NATIVE, "sqe/restrictions/_masks.c was not built: install a C compiler, then pip install -e ."
    if platform.machine() in ("x86_64", "AMD64"):  # every x86-64 CPU of the last 15 years has SSSE3 and POPCNT
        assert string_masks._masks is not None and string_masks._masks.set_compacting(True)


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(st.none() | TEXT, max_size=25),
    action=st.sampled_from(sorted(MASKS)),
    arrow_type=st.sampled_from([pa.string(), pa.large_string(), pa.string_view()]),
    cut=st.integers(0, 3),
)
def test_both_kernels_follow_the_per_code_point_rules(
    texts: list[str | None], action: str, arrow_type: pa.DataType, cut: int
) -> None:
    array = pa.array(texts, arrow_type).slice(min(cut, len(texts)))
    expected = [None if text is None else REFERENCE[action](text) for text in texts[min(cut, len(texts)) :]]
    for native, compacting in ((True, True), (True, False), (False, False)):
        with compacting_path(compacting):
            result = MASKS[action](array, native=native)
        assert result.type == arrow_type
        assert result.to_pylist() == expected, f"native={native} compacting={compacting}"


@pytest.mark.parametrize("compacting", [True, False], ids=["compacting", "per-value"])
@pytest.mark.parametrize("span", [63, 64, 65, 127, 128, 129, 1000])
def test_mask_alphanum_on_multibyte_spans_around_the_64_byte_words(compacting: bool, span: int) -> None:
    # the compacting path counts continuation bytes in 64-byte words: spans ending on, before and after one
    text = ""
    for char in "é1a😀-" * 200:
        if len((text + char).encode()) > span:
            break
        text += char
    text += "z" * (span - len(text.encode()))  # exactly `span` bytes
    values = [text[at : at + 3] for at in range(0, len(text), 3)]
    array = pa.array(values, pa.string())
    with compacting_path(compacting):
        assert mask_alphanum(array, native=True).to_pylist() == [ref_mask(v) for v in values]


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.none()
        | st.binary(max_size=150)
        | st.builds(lambda n, t: b"a" + b"\x80" * n + t, st.integers(0, 130), st.binary()),
        max_size=12,
    ),
    action=st.sampled_from(sorted(MASKS)),
)
def test_the_compacting_path_agrees_with_the_walk_on_any_bytes(values: list[bytes | None], action: str) -> None:
    # invalid UTF-8 too (a buffer-built array is never checked): long runs of continuation bytes push a value's
    # kept code points past the compacting path's 64-byte window, where it must walk as the per-value path does
    # (or refuse it alike, where a kept code point carries more continuation bytes than its lead announces)
    array = pa.array(values, pa.binary()).view(pa.string())
    with compacting_path(True):
        compacting = outcome(MASKS[action], array)
    with compacting_path(False):
        walked = outcome(MASKS[action], array)
    assert compacting == walked


def outcome(mask: Mask, array: pa.Array) -> list[bytes | None] | str:
    """The C kernel's output bytes per value, or its refusal's message."""
    try:
        return mask(array, native=True).view(pa.binary()).to_pylist()  # type: ignore[no-any-return]
    except ValueError as exc:
        return str(exc)


@pytest.mark.parametrize("compacting", [True, False], ids=["compacting", "per-value"])
@pytest.mark.parametrize("action", sorted(MASKS))
@pytest.mark.parametrize("run", [63, 64, 65, 130])
def test_a_values_first_code_point_past_a_long_continuation_run_is_found(
    action: str, run: int, compacting: bool
) -> None:
    # the compacting path looked for the first lead in the value's first 64 bytes only: past a run of 64 stray
    # continuation bytes show-first-4 and show-last-4 returned "" instead of the masked value
    array = pa.array([b"\x80" * run + "abc123é".encode(), b"ok"], pa.binary()).view(pa.string())
    with compacting_path(compacting):
        assert MASKS[action](array, native=True).to_pylist() == [REFERENCE[action]("abc123é"), REFERENCE[action]("ok")]


@pytest.mark.parametrize("compacting", [True, False], ids=["compacting", "per-value"])
@pytest.mark.parametrize(
    ("action", "value"),
    [("show-first-4", b"a" + b"\x80" * 100 + b"bcdef12345"), ("show-last-4", b"12345678" + b"\x80" * 100)],
)
def test_a_kept_code_point_pushed_out_of_the_window_is_refused(action: str, value: bytes, compacting: bool) -> None:
    # "a" and 100 continuation bytes would be one (invalid) kept code point: found past the 64-byte window by the
    # walk, then refused, never copied out
    array = pa.array([b"ok", value], pa.binary()).view(pa.string())
    with compacting_path(compacting), pytest.raises(ValueError, match=INVALID_UTF8):
        MASKS[action](array, native=True)


@pytest.mark.parametrize("native", KERNELS)
@pytest.mark.parametrize("action", sorted(MASKS))
def test_a_null_slots_stray_bytes_never_reach_the_output(action: str, native: bool) -> None:
    # Arrow lets a null slot cover bytes; a kept prefix or suffix must never copy them out
    data = b"abcdefSECRET-VALUE-9999ghij"
    offsets = pa.array([0, 6, 23, 27], pa.int32()).buffers()[1]
    validity = pa.array([True, False, True]).buffers()[1]
    array = pa.Array.from_buffers(pa.string(), 3, [validity, offsets, pa.py_buffer(data)])
    result = MASKS[action](array, native=native)
    assert result.to_pylist() == [REFERENCE[action]("abcdef"), None, REFERENCE[action]("ghij")]
    out = result.buffers()[2].to_pybytes()
    assert b"SECR" not in out and b"9999" not in out and b"ALUE" not in out


@pytest.mark.parametrize("action", sorted(MASKS))
def test_continuation_bytes_before_a_values_first_code_point_are_dropped(action: str) -> None:
    # invalid UTF-8 (Arrow never checks it on a buffer-built array): the stray bytes belong to no code point
    array = malformed([0, 9, 11], b"\x80\xbfabcde12\x8f\x80")
    assert MASKS[action](array, native=True).to_pylist() == [REFERENCE[action]("abcde12"), ""]
    if action == "mask-alphanum":  # the Arrow kernel drops them too
        assert MASKS[action](array, native=False).to_pylist() == [REFERENCE[action]("abcde12"), ""]


# Invalid UTF-8 that hangs 64 raw continuation bytes (6 free bits each) on the code point the mask keeps
CARGO = bytes(range(0x80, 0xC0))
INVALID_UTF8 = r"(?i:invalid UTF-?8)"  # the C kernels' message and Arrow's
HIDDEN_BEHIND_A_KEPT_CODE_POINT = {"show-first-4": b"abcd" + CARGO + b"efgh1234", "show-last-4": b"12345678" + CARGO}


@pytest.mark.parametrize(("native", "compacting"), [(True, True), (True, False), (False, False)], ids=PATHS)
@pytest.mark.parametrize("action", sorted(HIDDEN_BEHIND_A_KEPT_CODE_POINT))
def test_continuation_bytes_piled_on_a_kept_code_point_are_refused_not_copied(
    action: str, native: bool, compacting: bool
) -> None:
    # a Parquet string column is not checked for UTF-8 on read, so such a value can reach the masks; a kept code
    # point is its lead byte and at most 3 continuation bytes, never the run after it
    array = malformed(
        [0, 4, 4 + len(HIDDEN_BEHIND_A_KEPT_CODE_POINT[action])],
        b"\xc3\xa9xy" + HIDDEN_BEHIND_A_KEPT_CODE_POINT[action],
    )
    with compacting_path(compacting), pytest.raises(ValueError, match=INVALID_UTF8):
        MASKS[action](array, native=native)


@pytest.mark.parametrize("compacting", [True, False], ids=["compacting", "per-value"])
@pytest.mark.parametrize(
    ("action", "value", "valid"),
    [  # one continuation byte too many: after a 2-byte lead, after ASCII (which announces none), after a full
        # 4-byte code point, and after a 3-byte one in the kept suffix; each beside the same value without it
        ("show-first-4", b"\xc3\xa9\x80abc1", b"\xc3\xa9abc1"),
        ("show-first-4", b"a\x80bcd1", b"abcd1"),
        ("show-first-4", b"\xf0\x9f\x98\x80\x80bc1", b"\xf0\x9f\x98\x80bc1"),
        ("show-last-4", b"1234\xe2\x82\xac\x80", b"1234\xe2\x82\xac"),
        ("show-first-4", b"\xc3a\x80bc1", b"\xc3\xa9abc1"),  # a cut 2-byte lead, then one after ASCII
    ],
)
def test_one_unannounced_continuation_byte_in_a_kept_code_point_is_refused_wherever_it_falls(
    action: str, value: bytes, valid: bytes, compacting: bool
) -> None:
    # the compacting path checks kept code points only in spans where 16-byte steps found such a byte: the value
    # goes after ASCII padding of every length across those steps, then a valid value that must pass alone
    for padding in range(40):
        data = b"z" * padding + value
        with compacting_path(compacting), pytest.raises(ValueError, match=INVALID_UTF8):
            MASKS[action](malformed([0, padding, len(data)], data), native=True)
    data = b"z" * 20 + valid
    with compacting_path(compacting):
        shown = MASKS[action](malformed([0, 20, len(data)], data), native=True).to_pylist()
    assert shown == [
        "z" * 4 + "x" * 16 if action == "show-first-4" else "x" * 16 + "z" * 4,
        REFERENCE[action](valid.decode()),
    ]


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(max_size=12),
    extra=st.integers(0x80, 0xBF),
    at=st.integers(0, 40),
    padding=st.integers(0, 40),
    action=st.sampled_from(["show-first-4", "show-last-4"]),
)
def test_the_compacting_path_refuses_exactly_what_the_walk_refuses_for_one_stray_continuation_byte(
    text: str, extra: int, at: int, padding: int, action: str
) -> None:
    # valid UTF-8 but for one continuation byte put anywhere, after ASCII padding of any length: the compacting
    # path, which checks kept code points only where its 16-byte steps saw such a byte, must refuse or pass
    # exactly as the per-value walk, which checks every value
    raw = text.encode()
    raw = raw[: min(at, len(raw))] + bytes([extra]) + raw[min(at, len(raw)) :]
    data = b"z" * padding + raw
    array = malformed([0, padding, len(data)], data)
    outcomes = []
    for compacting in (True, False):
        with compacting_path(compacting):
            try:
                outcomes.append(MASKS[action](array, native=True).view(pa.binary()).to_pylist())
            except ValueError as refused:
                outcomes.append(str(refused))
    assert outcomes[0] == outcomes[1]


# A byte of each kind the rule tells apart: ASCII, continuation, leads announcing 1, 2 and 3, and 0xF8-0xFF (none).
BYTE_KINDS = [b"a", b"\x80", b"\xc3", b"\xe2", b"\xf0", b"\xf8"]


@pytest.mark.parametrize("action", ["show-first-4", "show-last-4"])
def test_the_compacting_path_refuses_what_the_walk_refuses_for_every_four_byte_pattern(action: str) -> None:
    # every 4-byte sequence of those kinds and a continuation byte after it, alone in its array after ASCII
    # padding that puts it across a 16-byte step at each place: the compacting path checks kept code points only
    # in spans where its steps saw an unannounced continuation byte, so it must refuse exactly what the walk does
    differ = []
    for pattern in itertools.product(BYTE_KINDS, repeat=4):
        value = b"".join(pattern) + b"\x80"
        for padding in (11, 13, 15):
            array = malformed([0, padding, padding + len(value)], b"z" * padding + value)
            outcomes = []
            for compacting in (True, False):
                with compacting_path(compacting):
                    try:
                        outcomes.append(MASKS[action](array, native=True).view(pa.binary()).to_pylist())
                    except ValueError:
                        outcomes.append("refused")
            if outcomes[0] != outcomes[1]:
                differ.append((value, padding, outcomes))
    assert differ == []


@pytest.mark.parametrize("action", ["show-first-4", "show-last-4"])
def test_the_compacting_path_refuses_what_the_rule_refuses_across_two_full_16_byte_steps(action: str) -> None:
    # the test above puts its bytes across a 16-byte step into the scalar tail: here the span is three full steps,
    # so the check reads its look-back (up to 3 bytes) from the step before, as every long column does. The
    # bytes around the value are ASCII or a lead announcing 3 (0xF0), so a look-back read from the wrong step would
    # see a lead there that lets a continuation byte too many through (the other kinds found nothing more).
    differ = []
    with compacting_path(True):
        for pattern, padding, filler in itertools.product(
            itertools.product(BYTE_KINDS, repeat=4), range(13, 16), [b"a", b"\xf0"]
        ):
            values = [filler * padding, b"".join(pattern) + b"\x80", filler * (43 - padding)]  # 48 bytes
            data = b"".join(values)
            array = malformed(list(accumulate(map(len, values), initial=0)), data)
            refused = any(byte_rule(value, action) is None for value in values)
            try:
                MASKS[action](array, native=True)
            except ValueError:
                if not refused:
                    differ.append((data, "refused"))
            else:
                if refused:
                    differ.append((data, "passed"))
    assert differ == []


@pytest.mark.parametrize("action", sorted(HIDDEN_BEHIND_A_KEPT_CODE_POINT))
def test_apply_action_refuses_a_kept_code_point_with_piled_continuation_bytes(action: str) -> None:
    array = malformed([0, len(HIDDEN_BEHIND_A_KEPT_CODE_POINT[action])], HIDDEN_BEHIND_A_KEPT_CODE_POINT[action])
    with pytest.raises(RestrictionApplyError, match=f"{action} cannot be applied to Arrow string: .*{INVALID_UTF8}"):
        apply_action(action, array, salt=b"")


@pytest.mark.parametrize("compacting", [True, False], ids=["compacting", "per-value"])
@pytest.mark.parametrize("action", sorted(MASKS))
def test_piled_continuation_bytes_outside_the_kept_code_points_are_dropped(action: str, compacting: bool) -> None:
    # in the masked middle, or under a null, they belong to no kept code point: masked away as before
    data = b"abcde" + CARGO + b"fgh1234" + b"wxyz" + CARGO
    array = pa.Array.from_buffers(
        pa.string(),
        2,
        [pa.array([True, False]).buffers()[1], pa.array([0, 76, 144], pa.int32()).buffers()[1], pa.py_buffer(data)],
    )
    with compacting_path(compacting):
        result = MASKS[action](array, native=True)
    assert result.to_pylist() == [REFERENCE[action]("abcdefgh1234"), None]
    assert not set(result.buffers()[2].to_pybytes()) & set(CARGO)


KEPT_CODE_POINTS = {"mask-alphanum": (0, 0), "show-first-4": (4, 0), "show-last-4": (0, 4)}
# any bytes, and runs of the pieces invalid UTF-8 is made of (stray and piled continuation bytes, cut sequences)
ANY_BYTES = st.binary(max_size=40) | st.builds(lambda run, rest: b"\x80" * run + rest, st.integers(0, 130), st.binary())
ANY_BYTES |= st.lists(
    st.sampled_from([b"a", b"7", b"@", b"\x80", b"\xbf", b"\xc3\xa9", b"\xe2\x82", b"\xf0\x9f\x98\x80", b"\xff"]),
    max_size=30,
).map(b"".join)


def byte_rule(value: bytes, action: str) -> bytes | None:
    """The C kernels' rule on any bytes: a code point starts at every non-continuation byte (continuation bytes
    before the first belong to none); None (refused) where a kept one has more continuation bytes than its lead
    announces."""
    points: list[bytes] = []
    for byte in value:
        if byte & 0xC0 != 0x80:
            points.append(bytes([byte]))
        elif points:
            points[-1] += bytes([byte])
    keep_first, keep_last = KEPT_CODE_POINTS[action]
    head, rest = points[:keep_first], points[keep_first:]
    tail = rest[max(0, len(rest) - keep_last) :] if keep_last else []
    middle = rest[: len(rest) - len(tail)]
    announced = {**dict.fromkeys(range(0xC0, 0xE0), 1), **dict.fromkeys(range(0xE0, 0xF0), 2)}
    announced |= dict.fromkeys(range(0xF0, 0xF8), 3)
    if any(len(point) - 1 > announced.get(point[0], 0) for point in head + tail):
        return None
    return b"".join(head) + bytes(string_masks._MASK_TABLE[point[0]] for point in middle) + b"".join(tail)


@settings(max_examples=300, deadline=None)
@given(
    slots=st.lists(st.tuples(ANY_BYTES, st.booleans()), min_size=1, max_size=20),
    before=ANY_BYTES,
    action=st.sampled_from(sorted(MASKS)),
    arrow_type=st.sampled_from([pa.string(), pa.large_string()]),
    cut=st.integers(0, 3),
    compacting=st.booleans(),
)
def test_the_c_kernels_follow_the_byte_rule_on_invalid_utf8_and_under_nulls(
    slots: list[tuple[bytes, bool]], before: bytes, action: str, arrow_type: pa.DataType, cut: int, compacting: bool
) -> None:
    # what a Parquet string column can hold: every output byte is a kept one or a mask byte, null slots masked whole
    offset_type = pa.int64() if pa.types.is_large_string(arrow_type) else pa.int32()
    offsets = pa.array(list(accumulate((len(value) for value, _ in slots), initial=len(before))), offset_type)
    validity = pa.array([valid for _, valid in slots]).buffers()[1]
    data = pa.py_buffer(before + b"".join(value for value, _ in slots))  # `before`: bytes no slot covers
    cut = min(cut, len(slots) - 1)
    array = pa.Array.from_buffers(arrow_type, len(slots), [validity, offsets.buffers()[1], data]).slice(cut)
    expected = [byte_rule(value, action if valid else "mask-alphanum") for value, valid in slots[cut:]]
    if None in expected:
        with compacting_path(compacting), pytest.raises(ValueError, match=INVALID_UTF8):
            MASKS[action](array, native=True)
        return
    with compacting_path(compacting):
        result = MASKS[action](array, native=True)
    out_offsets = pa.Array.from_buffers(offset_type, len(array) + 1, [None, result.buffers()[1]]).to_pylist()
    out = result.buffers()[2].to_pybytes()
    assert [out[a:b] for a, b in pairwise(out_offsets)] == expected
    assert result.is_valid().to_pylist() == [valid for _, valid in slots[cut:]]


@pytest.mark.parametrize("action", sorted(MASKS))
@pytest.mark.parametrize("arrow_type", [pa.string(), pa.large_string()], ids=str)
def test_falling_offsets_are_a_typed_error_never_a_read_outside_the_data(action: str, arrow_type: pa.DataType) -> None:
    array = malformed([0, 4, 2, 6], b"abcdef", arrow_type)  # Arrow's cheap validation lets this through
    with pytest.raises(RestrictionApplyError, match=f"{action} cannot be applied to Arrow .*string offsets outside"):
        apply_action(action, array, salt=b"")


def call_c(
    offsets: list[int], data: bytes, length: int, *, out_size: int = 64, out: object = None, width: int = 4
) -> int:
    """The C entry point on raw buffers, as string_masks.py calls it."""
    offset_type = pa.int64() if width == 8 else pa.int32()
    raw_offsets = pa.array(offsets, offset_type).buffers()[1]
    target = pa.allocate_buffer(out_size) if out is None else out
    assert string_masks._masks is not None
    return string_masks._masks.mask_strings(
        data, raw_offsets, width, 0, length, None, 0, 4, 0, target, pa.allocate_buffer((length + 1) * width)
    )


@pytest.mark.parametrize(
    ("offsets", "data", "length", "message"),
    [
        pytest.param([-3, 4], b"abcdef", 1, "string offsets outside the data buffer", id="negative"),
        pytest.param([0, 40], b"abcdef", 1, "string offsets outside the data buffer", id="past-the-data"),
        pytest.param([0, 2**31 - 1], b"ab", 1, "string offsets outside the data buffer", id="huge"),
        pytest.param([0, 1], b"a", 5, "string offsets or validity shorter than the array", id="short-offsets"),
    ],
)
@pytest.mark.parametrize("width", [4, 8])
def test_the_c_entry_point_checks_every_offset_before_reading(
    offsets: list[int], data: bytes, length: int, message: str, width: int
) -> None:
    with pytest.raises(ValueError, match=message):
        call_c(offsets, data, length, width=width)


def test_the_c_entry_point_refuses_a_short_or_read_only_output_and_odd_widths() -> None:
    with pytest.raises(ValueError, match="the output is too short"):
        call_c([0, 6], b"abcdef", 1, out_size=5)
    with pytest.raises(TypeError, match="out is not a writable buffer"):
        call_c([0, 6], b"abcdef", 1, out=b"0123456789")
    with pytest.raises(ValueError, match="a width of 4 or 8"):
        call_c([0, 6], b"abcdef", 1, width=2)
    assert call_c([0, 6], b"abcdef", 1) == 6  # the same call, well formed


@pytest.mark.parametrize("action", sorted(MASKS))
def test_the_c_kernels_keep_a_sliced_arrays_nulls_and_values(action: str) -> None:
    values = ["0123456789abcdef0123é", None, "😀😀😀😀😀😀", "", "ab"] * 50
    array = pa.array(values, pa.large_string()).slice(3, 240)
    result = MASKS[action](array, native=True)
    assert result.offset == 0  # rebuilt from the slice's first value
    assert result.to_pylist() == [None if v is None else REFERENCE[action](v) for v in values[3:243]]
    assert result.null_count == array.null_count
