"""Every Avro read pyiceberg makes in SQE stays inside its block (``sqe.planning.avro_decoder``).

pyiceberg's compiled decoder trusts the lengths a file states: a value whose length runs past its block is read
from the process's memory beyond it. These tests never run that decoder on such input (what it would read is
whatever lies beyond); they check the bounded one refuses every read past the end, decodes everything else as
the compiled one does, and is the one pyiceberg's Avro files use once planning's modules are imported.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.avro.decoder_fast import CythonBinaryDecoder
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import read_manifest_list

from sqe.planning.avro_decoder import BoundedDecoder, bounded_decoder
from tests.helpers.avro import avro_long, recoded

# One of each value pyiceberg reads, encoded back to back, and the reads that decode them in order.
ENCODED = b"".join(
    [
        avro_long(-3),
        avro_long(2**40),
        b"\x01",  # a boolean
        struct.pack("<f", 1.5),
        struct.pack("<d", -2.25),
        avro_long(5) + b"bytes",
        avro_long(len("päth".encode())) + "päth".encode(),
        avro_long(7) + avro_long(8) + avro_long(9),  # three ints read at once
        avro_long(1) + avro_long(7) + avro_long(4) + b"\x00\x01\x02\x03",  # a count, then one (int, bytes) entry
        avro_long(3) + b"abc",  # skipped bytes
        avro_long(300),  # a skipped int
    ]
)
READS: list[Callable[[Any], Any]] = [
    lambda d: d.read_int(),
    lambda d: d.read_int(),
    lambda d: d.read_boolean(),
    lambda d: d.read_float(),
    lambda d: d.read_double(),
    lambda d: d.read_bytes(),
    lambda d: d.read_utf8(),
    lambda d: d.read_ints(3),
    lambda d: (d.read_int(), d.read_int_bytes_dict(1, out := {}), out)[2],
    lambda d: d.skip_bytes(),
    lambda d: d.skip_int(),
    lambda d: d.tell(),
]


def _plain(value: Any) -> Any:
    """``read_ints`` gives an ``array`` of unsigned 64-bit ints; a tuple compares with it."""
    return tuple(value) if isinstance(value, array) else value


def test_values_within_the_block_decode_as_the_compiled_decoder_decodes_them() -> None:
    compiled, bounded = CythonBinaryDecoder(ENCODED), BoundedDecoder(ENCODED)
    assert [_plain(read(bounded)) for read in READS] == [_plain(read(compiled)) for read in READS]
    assert bounded.tell() == len(ENCODED)
    with pytest.raises(EOFError, match="runs past the end of its block"):
        bounded.read_int()  # and nothing is left


# Each: bytes that end early, and the read that would run past their end.
PAST_THE_END: dict[str, tuple[bytes, Callable[[Any], Any]]] = {
    "string": (avro_long(4000) + b"s3://", lambda d: d.read_utf8()),
    "bytes": (avro_long(4000) + b"xx", lambda d: d.read_bytes()),
    "negative length": (avro_long(-5) + b"xxxxx", lambda d: d.read_bytes()),
    "read": (b"abc", lambda d: d.read(16)),
    "skip": (b"abc", lambda d: d.skip(4)),
    "skipped bytes": (avro_long(100) + b"abc", lambda d: d.skip_bytes()),
    "skipped string": (avro_long(100) + b"abc", lambda d: d.skip_utf8()),
    "int at the end": (b"", lambda d: d.read_int()),
    "skipped int at the end": (b"", lambda d: d.skip_int()),
    "float": (b"\x00\x00\x00", lambda d: d.read_float()),
    "skipped float": (b"\x00\x00\x00", lambda d: d.skip_float()),
    "double": (b"\x00" * 7, lambda d: d.read_double()),
    "skipped double": (b"\x00" * 7, lambda d: d.skip_double()),
    "boolean": (b"", lambda d: d.read_boolean()),
    "skipped boolean": (b"", lambda d: d.skip_boolean()),
    # a count a writer states drives the reads: 10**9 ints from 3 bytes
    "ints counted past the end": (b"\x02\x04\x06", lambda d: d.read_ints(10**9)),
    "map entry's value": (avro_long(1) + avro_long(4000) + b"ab", lambda d: d.read_int_bytes_dict(1, {})),
    "map entries counted past the end": (avro_long(1) + avro_long(1) + b"a", lambda d: d.read_int_bytes_dict(9, {})),
}


@pytest.mark.parametrize("case", list(PAST_THE_END))
def test_a_read_past_the_end_of_the_block_is_refused(case: str) -> None:
    data, read = PAST_THE_END[case]
    with pytest.raises(EOFError, match="runs past the end of its block"):
        read(BoundedDecoder(data))


def test_a_varint_ending_past_the_block_is_refused_on_the_next_read() -> None:
    # A varint that starts before the end may end in the zeros after it (it reads nothing else); the next read
    # starts past the end and is refused.
    decoder = BoundedDecoder(b"\x80\x80")
    assert decoder.read_int() == 0
    with pytest.raises(EOFError):
        decoder.read_int()


def test_pyiceberg_decodes_avro_files_with_the_bounded_decoder_once_planning_is_imported() -> None:
    import pyiceberg.avro.file as avro_file

    import sqe.planning.avro_limits  # noqa: F401  (installs it)

    assert avro_file.new_decoder is bounded_decoder
    assert isinstance(bounded_decoder(b""), BoundedDecoder)


def _manifest_list(tmp_path: Path) -> bytes:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("ns")
    table = catalog.create_table(
        "ns.t", schema=pa.schema([("id", pa.int64())]), properties={"write.avro.compression-codec": "null"}
    )
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return Path(snapshot.manifest_list.removeprefix("file://")).read_bytes()


def test_a_manifest_path_running_past_its_block_is_refused_not_read_from_memory(tmp_path: Path) -> None:
    import sqe.planning.avro_limits  # noqa: F401  (installs the bounded decoder)

    def overrun(block: bytes) -> bytes:  # the first value of a manifest list's record is its manifest's path
        return avro_long(4000) + b"file:///"

    path = tmp_path / "hostile.avro"
    path.write_bytes(recoded(_manifest_list(tmp_path), b"null", overrun))
    with pytest.raises(EOFError, match="runs past the end of its block"):
        list(read_manifest_list(PyArrowFileIO().new_input(str(path))))
    (tmp_path / "again").mkdir()
    path.write_bytes(recoded(_manifest_list(tmp_path / "again"), b"null", lambda block: block))  # as written
    [manifest] = read_manifest_list(PyArrowFileIO().new_input(str(path)))
    assert manifest.manifest_path.endswith(".avro") and manifest.added_rows_count == 3


def test_many_ints_far_from_the_end_are_read_at_once_as_the_compiled_decoder_reads_them() -> None:
    data = b"".join(avro_long(i) for i in range(200))
    compiled, bounded = CythonBinaryDecoder(data), BoundedDecoder(data)
    assert _plain(bounded.read_ints(50)) == _plain(compiled.read_ints(50)) == tuple(range(50))
    assert _plain(bounded.read_ints(150)) == _plain(compiled.read_ints(150)) == tuple(range(50, 200))
    assert bounded.tell() == compiled.tell() == len(data)


def test_ints_read_at_once_whose_first_varint_runs_to_the_end_are_refused() -> None:
    """Found by review: ``read_ints`` read at once when ten bytes an int fit before the end, but a varint has no
    length cap: one of continuation bytes running to the end left the others to be read from the padding and the
    memory past it (40 counted from 400 bytes read 24 bytes past the padded copy), and gave them back."""
    data = b"\x80" * 400  # one varint of 400 bytes; the count says 40
    decoder = BoundedDecoder(data)
    with pytest.raises(EOFError, match="runs past the end of its block"):
        decoder.read_ints(40)
    with pytest.raises(EOFError, match="runs past the end of its block"):
        decoder.read_int()  # and the decoder stays past the end


def test_ints_read_at_once_with_long_runs_elsewhere_decode_as_the_compiled_decoder_decodes_them() -> None:
    # ten bytes of 0x80 and above in a row (a non-ASCII bound) right after the ints: the same values as compiled
    data = b"".join(avro_long(i) for i in range(30)) + avro_long(12) + "日本語の".encode() + bytes(300)
    compiled, bounded = CythonBinaryDecoder(data), BoundedDecoder(data)
    assert _plain(bounded.read_ints(30)) == _plain(compiled.read_ints(30)) == tuple(range(30))
    assert bounded.read_utf8() == compiled.read_utf8() == "日本語の"
    assert bounded.read(300) == compiled.read(300)
    assert bounded.tell() == compiled.tell() == len(data)


def test_negative_ints_read_at_once_decode_alike_near_the_end_and_far_from_it() -> None:
    """Found by review: the compiled decoder gives ints read at once as unsigned 64-bit (-1 as 2**64 - 1); read one
    by one near a block's end they came out signed, so a value depended on where its block ended."""
    near, far = avro_long(-1) + avro_long(5), avro_long(-1) + avro_long(5) + bytes(40)
    expected = _plain(CythonBinaryDecoder(far).read_ints(2))
    assert expected == (2**64 - 1, 5)
    assert _plain(BoundedDecoder(far).read_ints(2)) == _plain(BoundedDecoder(near).read_ints(2)) == expected


def test_a_double_is_read_as_a_64_bit_float() -> None:
    # Found while removing copy-paste: pyiceberg's compiled read_double gives a 32-bit float (0.1 came back as
    # 0.10000000149011612), so a double partition value was shown and compared wrong.
    encoded = struct.pack("<d", 0.1) + struct.pack("<f", 0.1)
    decoder = BoundedDecoder(encoded)
    assert decoder.read_double() == 0.1
    assert decoder.read_float() == struct.unpack("<f", struct.pack("<f", 0.1))[0]
