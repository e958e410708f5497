"""Which of pyarrow's reads of a file's small row groups are fetched as one GET (sqe.execution.cached_files).

Footers of real Parquet files written in memory: the rule decides from the column chunks' offsets and sizes only.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from sqe.execution.cached_files import MERGE_HOLE_BYTES, MERGE_SMALL_BYTES, coalesced_reads, merged_reads
from tests.helpers.avro import avro_long

ROWS = 240_000
PART = 16 << 20
AGG = {1, 2}  # the leaves of x and y: the id chunk lies before x, the tag chunk after y (the gaps)


@functools.cache  # written once per size: the rule reads only the footer
def _footer(group_rows: int) -> tuple[Any, int]:
    table = pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "x": pa.array(range(0, 3 * ROWS, 3), pa.int64()),
            "y": pc.random(ROWS),
            "tag": pa.array([f"tag-{i % 97:03d}" for i in range(ROWS)]),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=group_rows)
    return pq.ParquetFile(io.BytesIO(sink.getvalue())).metadata, len(sink.getvalue())


def _pieces(metadata: Any, size: int, *, eager: bool) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    groups = list(range(metadata.num_row_groups))
    return coalesced_reads(metadata, groups, AGG, size), merged_reads(metadata, groups, AGG, size, PART, eager=eager)


@pytest.mark.parametrize("eager", [False, True], ids=["prefetch-off", "prefetch-on"])
def test_tiny_row_groups_reads_are_joined_with_the_prefetch_on_or_off(eager: bool) -> None:
    metadata, size = _footer(2_000)
    reads, merged = _pieces(metadata, size, eager=eager)
    assert len(reads) == metadata.num_row_groups == 120
    assert len(merged) == 1 and merged[0][2] == 120  # 120 GETs become one
    assert merged[0][0] == reads[0][0] and sum(merged[0][:2]) == sum(reads[-1])


def test_reads_too_large_to_join_without_the_prefetch_are_joined_with_it() -> None:
    # Each x+y read with the gap before it is over MERGE_SMALL_BYTES, the gap under MERGE_HOLE_BYTES: with the
    # scanner's four parallel readers, one merged read (one connection) is slower than their four GETs, so only
    # the prefetch, which sends its parts in parallel, joins them.
    metadata, size = _footer(40_000)
    reads, lazy = _pieces(metadata, size, eager=False)
    gaps = [b[0] - (a[0] + a[1]) for a, b in itertools.pairwise(reads)]
    assert max(gaps) <= MERGE_HOLE_BYTES
    assert min(gap + length for gap, (_, length) in zip(gaps, reads[1:], strict=True)) > MERGE_SMALL_BYTES
    assert lazy == [(offset, length, 1) for offset, length in reads]
    _, eager = _pieces(metadata, size, eager=True)
    assert len(eager) == 1 and eager[0][2] == len(reads) == 6


def test_no_merged_read_passes_its_part_size() -> None:
    metadata, size = _footer(2_000)
    groups = list(range(metadata.num_row_groups))
    part = 64 << 10
    merged = merged_reads(metadata, groups, AGG, size, part, eager=True)
    assert len(merged) > 1 and all(length <= part or joined == 1 for _, length, joined in merged)
    assert sum(joined for _, _, joined in merged) == len(coalesced_reads(metadata, groups, AGG, size))


def _zigzag(value: int, width: int) -> bytes:
    """``value`` (negative too) as a thrift compact i64, a zigzag varint, in ``width`` bytes."""
    zigzag, out = (value << 1) ^ (value >> 63), bytearray()
    for position in range(width):
        out.append(zigzag & 0x7F | (0x80 if position < width - 1 else 0))
        zigzag >>= 7
    assert not zigzag
    return bytes(out)


def with_data_page_offset(data: bytes, group: int, leaf: int, offset: int) -> bytes:
    """The Parquet file ``data`` with row group ``group``'s column chunk ``leaf`` stating ``offset`` as its data
    page offset (pages untouched): each i64 in the footer holding the stated offset is tried, and kept when it
    changed that chunk's."""
    stated = avro_long(pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(group).column(leaf).data_page_offset)
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    for at in range(footer, len(data) - 8):
        if data[at - 1] & 0x0F != 6 or not data.startswith(stated, at):  # 6: a compact i64 field
            continue
        attempt = data[:at] + _zigzag(offset, len(stated)) + data[at + len(stated) :]
        with contextlib.suppress(OSError):  # an i64 that was not a field: the footer no longer parses
            chunk = pq.ParquetFile(pa.BufferReader(attempt)).metadata.row_group(group).column(leaf)
            if chunk.data_page_offset == offset:
                return attempt
    raise AssertionError("the chunk's data page offset is not in the footer")


def test_a_chunk_a_corrupt_footer_places_before_the_file_is_planned_as_no_read() -> None:
    # Before: group 0's x chunk at -1000 was planned as the read (-1000, ...) and the next groups' reads joined it,
    # so their first read sent a GET of "bytes=-1000-..." (pyarrow itself refuses the chunk, reading nothing).
    sink = io.BytesIO()
    table = pa.table({"x": pa.array(range(ROWS), pa.int64()), "y": pc.random(ROWS)})
    pq.write_table(table, sink, row_group_size=2_000)
    data = with_data_page_offset(sink.getvalue(), 0, 0, -1000)
    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    groups = list(range(metadata.num_row_groups))
    for eager in (False, True):
        merged = merged_reads(metadata, groups, {0, 1}, len(data), PART, eager=eager)
        assert merged and all(offset >= 0 and offset + length <= len(data) for offset, length, _ in merged)
        y = metadata.row_group(0).column(1)
        assert merged[0][0] == (y.dictionary_page_offset if y.has_dictionary_page else y.data_page_offset)
