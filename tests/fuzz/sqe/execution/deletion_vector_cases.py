"""Mutated deletion vectors checked and decoded as a scan does; run by ``test_fuzz_deletion_vectors`` in a child
process (``python -m tests.fuzz.sqe.execution.deletion_vector_cases COUNT``; see ``tests/fuzz/subprocess_cases``).

Case N (``random.Random(N)``) starts from a Puffin file of one deletion vector (array, bitset and run containers,
several keys, zstd or not) and changes the serialized bitmaps (then frames them again, as a writer could), the
footer's blob metadata, or any byte; the file goes through ``check_position_deletes`` and, if it passes, through
the scan's decoding of the checked bytes. Some cases give pyroaring's own deserializers (32- and 64-bit) a
changed serialized bitmap directly. Outcomes: ``refused`` (DeleteFileLimitError), ``decoded`` (every position
within its data file's rows, at most ``MAX_POSITION_DELETE_ROWS``), ``roaring-refused`` or ``roaring-read``.
"""

from __future__ import annotations

import itertools
import json
import random
import struct
import sys
import zlib
from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc
import zstandard
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record
from pyroaring import BitMap, BitMap64

from sqe.errors import DeleteFileLimitError
from sqe.execution.delete_limits import MAX_POSITION_DELETE_ROWS, check_position_deletes
from sqe.execution.local import _vectors
from tests.fuzz.memory_io import BytesIO
from tests.fuzz.subprocess_cases import report, starting

DATA = "s3://b/data.parquet"
WORDS = [0, 1, 2, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 4095, 4096, 4097, 12346, 12347, 0x7FFFFFFF, 0xFFFFFFFF]


def _ranges(*spans: tuple[int, int]) -> BitMap:
    bitmap = BitMap()
    for start, stop in spans:
        bitmap.add_range(start, stop)
    bitmap.run_optimize()
    return bitmap


# Each: the data file's rows, and its vector's bitmaps by key (the high 32 bits of a position).
VECTORS: list[tuple[int, dict[int, BitMap]]] = [
    (200_000, {0: BitMap([0, 5, 99])}),
    (200_000, {0: BitMap(range(0, 100_000, 2))}),  # bitset containers
    (200_000, {0: _ranges((10, 70_000), (80_000, 90_000))}),  # run containers
    (1 << 34, {0: BitMap([1, 70_000]), 1: _ranges((0, 5000)), 3: BitMap([7])}),
    (10, {0: BitMap()}),
]


def _serialized(bitmaps: dict[int, BitMap]) -> bytes:
    return struct.pack("<Q", len(bitmaps)) + b"".join(
        struct.pack("<I", k) + bitmaps[k].serialize() for k in sorted(bitmaps)
    )


def _puffin(vector: bytes, zstd: bool, footer: Callable[[dict[str, Any]], None] | None = None) -> bytes:
    """A Puffin file of one ``deletion-vector-v1`` blob framing ``vector``, as the spec frames it."""
    body = b"\xd1\xd3\x39\x64" + vector
    blob = struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))
    blob = zstandard.ZstdCompressor().compress(blob) if zstd else blob
    meta: dict[str, Any] = {"type": "deletion-vector-v1", "fields": [2147483645], "snapshot-id": -1}
    meta |= {"sequence-number": -1, "offset": 4, "length": len(blob), "properties": {"referenced-data-file": DATA}}
    if zstd:
        meta["compression-codec"] = "zstd"
    document = {"blobs": [meta]}
    if footer is not None:
        footer(document)
    text = json.dumps(document).encode()
    return b"PFA1" + blob + b"PFA1" + text + struct.pack("<I", len(text)) + b"\0\0\0\0PFA1"


def _changed(rng: random.Random, data: bytes) -> bytes:
    """``data`` with one change: bit flips, a 16- or 32-bit word written over it, a span cut or doubled, a cut."""
    out, at = bytearray(data), rng.randrange(max(1, len(data)))
    how = rng.randrange(6)
    if how == 0 and out:
        for _ in range(rng.randint(1, 3)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif how in (1, 2):
        width = 2 * how
        out[at : at + width] = (rng.choice(WORDS) & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
    elif how == 3:
        del out[at : at + rng.randint(1, 16)]
    elif how == 4:
        out[at:at] = out[at : at + rng.randint(1, 64)]
    else:
        del out[at:]
    return bytes(out)


def _footer_change(rng: random.Random) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        blob = document["blobs"][0]
        field = rng.choice(["offset", "length", "compression-codec", "properties", "blobs"])
        if field in ("offset", "length"):
            blob[field] = rng.choice([0, -1, 3, 5, blob[field] + 1, blob[field] - 1, 1 << 40, -(2**63)])
        elif field == "compression-codec":
            blob[field] = rng.choice(["zstd", "lz4", None, 5])
        elif field == "properties":
            blob[field] = rng.choice([{}, {"referenced-data-file": 5}, {"referenced-data-file": DATA + "x"}])
        else:
            document["blobs"] *= rng.choice([2, 30])

    return change


def _exercised(bitmap: BitMap | BitMap64) -> int:
    """Read a deserialized bitmap every way a reader might (an invalid one could crash here)."""
    if bitmap:
        bitmap.rank(bitmap.max())
        bitmap[len(bitmap) // 2]
    type(bitmap).deserialize(bitmap.serialize())
    list(itertools.islice(bitmap, 2000))
    (bitmap | bitmap).run_optimize()
    return len(bitmap)


def roaring_outcome(rng: random.Random, bitmaps: dict[int, BitMap]) -> str:
    wide = rng.random() < 0.4
    data = _serialized(bitmaps) if wide else (bitmaps.get(0) or BitMap()).serialize()
    for _ in range(rng.randint(1, 3)):
        data = _changed(rng, data)
    try:
        bitmap = (BitMap64 if wide else BitMap).deserialize(data)
    except (ValueError, IndexError):  # IndexError: pyroaring's for no bytes at all
        return "roaring-refused"
    _exercised(bitmap)
    return "roaring-read"


def scan_outcome(data: bytes, rows: int) -> str:
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path="s3://b/dv.puffin", file_format=FileFormat.PUFFIN,
        partition=Record(), record_count=1, file_size_in_bytes=len(data),
    )  # fmt: skip
    try:
        checked = check_position_deletes(BytesIO(data), delete_file, {DATA: rows})
    except DeleteFileLimitError:
        return "refused"
    assert checked is not None
    decoded = _vectors(checked)
    total = sum(len(positions) for positions in decoded.values())
    last = pc.max(decoded[DATA]).as_py() if DATA in decoded and len(decoded[DATA]) else None
    if total > MAX_POSITION_DELETE_ROWS or (last is not None and last >= rows):
        return f"bad: {total} positions decoded, the last {last}, of a data file of {rows} rows"
    return "decoded"


def outcome(case: int) -> str:
    rng = random.Random(case)
    rows, bitmaps = VECTORS[case % len(VECTORS)]
    kind, zstd = rng.randrange(10), rng.random() < 0.25
    if kind < 3:
        return roaring_outcome(rng, bitmaps)
    vector = _serialized(bitmaps)
    if kind < 7:  # inside the serialized bitmaps (mostly after the count)
        changed = _changed(rng, vector[8:])
        data = _puffin(vector[:8] + changed if rng.random() < 0.8 else _changed(rng, vector), zstd)
    elif kind < 9:
        data = _puffin(vector, zstd, _footer_change(rng))
    else:
        data = _changed(rng, _puffin(vector, zstd))
    return scan_outcome(data, rows)


def main(count: int) -> None:
    for case in range(count):
        starting(case)
        try:
            result = outcome(case)
        except Exception as exc:  # anything but the typed refusal is a defect to report
            result = f"bad: {type(exc).__name__}: {exc}"[:300]
        report(case, result)


if __name__ == "__main__":
    main(int(sys.argv[1]))
