"""Which of pyarrow's reads of a file's small row groups are fetched as one GET (sqe.execution.cached_files).

Footers of real Parquet files written in memory: the rule decides from the column chunks' offsets and sizes only.
"""

from __future__ import annotations

import functools
import io
import itertools
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from sqe.execution.cached_files import MERGE_HOLE_BYTES, MERGE_SMALL_BYTES, coalesced_reads, merged_reads

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
