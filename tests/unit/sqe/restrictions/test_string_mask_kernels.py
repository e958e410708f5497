"""The two implementations of the string masks, the C kernels (``_masks.c``) and the Arrow kernels, against the
per-code-point rules and each other, and the C kernels against malformed arrays."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqe.errors import RestrictionApplyError
from sqe.restrictions import apply_action, string_masks
from sqe.restrictions.string_masks import mask_alphanum, show_first_4, show_last_4

Mask = Callable[..., pa.Array]
MASKS: dict[str, Mask] = {"mask-alphanum": mask_alphanum, "show-first-4": show_first_4, "show-last-4": show_last_4}
KERNELS = [pytest.param(True, id="c"), pytest.param(False, id="arrow")]


def rule_mask(text: str) -> str:
    return "".join("n" if "0" <= ch <= "9" else ch if ch in "(),.-@" else "x" for ch in text)


RULES: dict[str, Callable[[str], str]] = {
    "mask-alphanum": rule_mask,
    "show-first-4": lambda text: text[:4] + rule_mask(text[4:]),
    "show-last-4": lambda text: text if len(text) <= 4 else rule_mask(text[:-4]) + text[-4:],
}

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
    expected = [None if text is None else RULES[action](text) for text in texts[min(cut, len(texts)) :]]
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
        assert mask_alphanum(array, native=True).to_pylist() == [rule_mask(v) for v in values]


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
    array = pa.array(values, pa.binary()).view(pa.string())
    with compacting_path(True):
        compacting = MASKS[action](array, native=True)
    with compacting_path(False):
        walked = MASKS[action](array, native=True)
    assert compacting.view(pa.binary()).to_pylist() == walked.view(pa.binary()).to_pylist()


def test_a_kept_prefix_pushed_out_of_the_window_is_still_found() -> None:
    # "a" and 100 continuation bytes are one (invalid) code point: the prefix ends after "bcd", not at the end
    array = pa.array([b"a" + b"\x80" * 100 + b"bcdef12345"], pa.binary()).view(pa.string())
    for compacting in (True, False):
        with compacting_path(compacting):
            out = show_first_4(array, native=True).view(pa.binary()).to_pylist()
        assert out == [b"a" + b"\x80" * 100 + b"bcdxxnnnnn"], f"compacting={compacting}"


@pytest.mark.parametrize("native", KERNELS)
@pytest.mark.parametrize("action", sorted(MASKS))
def test_a_null_slots_stray_bytes_never_reach_the_output(action: str, native: bool) -> None:
    # Arrow lets a null slot cover bytes; a kept prefix or suffix must never copy them out
    data = b"abcdefSECRET-VALUE-9999ghij"
    offsets = pa.array([0, 6, 23, 27], pa.int32()).buffers()[1]
    validity = pa.array([True, False, True]).buffers()[1]
    array = pa.Array.from_buffers(pa.string(), 3, [validity, offsets, pa.py_buffer(data)])
    result = MASKS[action](array, native=native)
    assert result.to_pylist() == [RULES[action]("abcdef"), None, RULES[action]("ghij")]
    out = result.buffers()[2].to_pybytes()
    assert b"SECR" not in out and b"9999" not in out and b"ALUE" not in out


@pytest.mark.parametrize("action", sorted(MASKS))
def test_continuation_bytes_before_a_values_first_code_point_are_dropped(action: str) -> None:
    # invalid UTF-8 (Arrow never checks it on a buffer-built array): the stray bytes belong to no code point
    array = malformed([0, 9, 11], b"\x80\xbfabcde12\x8f\x80")
    assert MASKS[action](array, native=True).to_pylist() == [RULES[action]("abcde12"), ""]
    if action == "mask-alphanum":  # the Arrow kernel drops them too
        assert MASKS[action](array, native=False).to_pylist() == [RULES[action]("abcde12"), ""]


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
    assert result.to_pylist() == [None if v is None else RULES[action](v) for v in values[3:243]]
    assert result.null_count == array.null_count
