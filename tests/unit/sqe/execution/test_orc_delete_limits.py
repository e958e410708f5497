"""An ORC position delete file is bounded by the size its values decode to, not only by its rows
(``sqe.execution.delete_limits``, ``sqe.execution.orc_footer``).

pyiceberg reads an ORC delete file whole, one ``file_path`` string a row (not dictionary-encoded): a file of a few
rows of long paths, a few hundred KiB stored, decodes to more than a GiB. Real files written by pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.orc as orc
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from sqe.errors import DeleteFileLimitError
from sqe.execution.delete_limits import MAX_POSITION_DELETE_BYTES, MAX_POSITION_DELETE_ROWS, check_position_deletes
from sqe.execution.orc_footer import OrcStated, stated

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

PATH = "s3://b/t/data/x.parquet"  # 23 bytes


def _orc(rows: int, path: str = PATH, batch: int = 1024, **options: object) -> bytes:
    """An ORC position delete file of ``rows`` rows naming ``path``, written ``batch`` rows at a time."""
    chunk = pa.table({"file_path": pa.array([path] * batch, pa.string()), "pos": pa.array(range(batch), pa.int64())})
    sink = pa.BufferOutputStream()
    writer = orc.ORCWriter(sink, compression="zstd", **options)
    for start in range(0, rows, batch):
        writer.write(chunk.slice(0, min(batch, rows - start)))
    writer.close()
    return bytes(sink.getvalue().to_pybytes())


def _tail(data: bytes) -> bytes:
    return bytes(orc.ORCFile(pa.BufferReader(data)).reader.serialized_file_tail())


def _delete_file(tmp_path: Path, data: bytes) -> DataFile:
    path = tmp_path / "deletes.orc"
    path.write_bytes(data)
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=str(path),
        file_format=FileFormat.ORC,
        partition=Record(),
        record_count=1,
        file_size_in_bytes=len(data),
    )


def test_the_footer_states_the_rows_and_the_size_their_values_decode_to() -> None:
    # the root struct, file_path (its strings and an 8-byte slot each), pos: 8 bytes a value each
    assert stated(_tail(_orc(1000))) == OrcStated(rows=1000, decoded_bytes=1000 * (8 + 8 + len(PATH) + 8))
    table = orc.ORCFile(pa.BufferReader(_orc(1000))).read()
    assert stated(_tail(_orc(1000))).decoded_bytes >= table.nbytes  # never less than pyarrow decodes


def test_a_delete_file_of_few_rows_decoding_past_the_byte_limit_is_refused(tmp_path: Path) -> None:
    # Before: only its 17,408 rows were checked (a 32 Mi limit); pyiceberg decoded its 1.1 GB of paths whole.
    path = "s3://b/" + "x" * (1 << 16)
    rows = MAX_POSITION_DELETE_BYTES // len(path) + 1024
    data = _orc(rows, path)
    assert len(data) < 1 << 20 and rows < MAX_POSITION_DELETE_ROWS
    with pytest.raises(DeleteFileLimitError) as raised:
        check_position_deletes(PyArrowFileIO(), _delete_file(tmp_path, data), {})
    assert str(raised.value) == (
        "cannot apply the scan's deletes: a position delete file of the table holds more than "
        f"{MAX_POSITION_DELETE_BYTES} bytes decoded (MAX_POSITION_DELETE_BYTES)"
    )


def test_a_delete_file_within_the_limits_passes(tmp_path: Path) -> None:
    assert check_position_deletes(PyArrowFileIO(), _delete_file(tmp_path, _orc(5000)), {}) is None


def _message(fields: list[tuple[int, int, int | bytes]]) -> bytes:
    """A protobuf message of ``fields`` (number, wire type, value): varints and length-delimited only."""
    out = bytearray()
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        out += _varint(value) if isinstance(value, int) else _varint(len(value)) + value
    return bytes(out)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def _changed(message: bytes, path: list[tuple[int, int]], change: Callable[[bytes], bytes]) -> bytes:
    """``message`` with the nested message at ``path`` (each step: a field number and which of its
    occurrences) replaced by ``change`` of it."""
    from sqe.execution.orc_footer import _fields

    (number, index), rest = path[0], path[1:]
    fields, seen = list(_fields(message)), 0
    for i, (field, wire, value) in enumerate(fields):
        if field == number:
            if seen == index:
                assert isinstance(value, bytes)
                fields[i] = (field, wire, change(value) if not rest else _changed(value, rest, change))
            seen += 1
    return _message(fields)


def _without(number: int) -> Callable[[bytes], bytes]:
    from sqe.execution.orc_footer import _fields

    return lambda message: _message([field for field in _fields(message) if field[0] != number])


def test_a_string_column_stating_no_total_length_is_refused() -> None:
    # the file_path column (id 1): footer (2), its statistics (7, the second), their string statistics (4)
    tail = _tail(_orc(10))
    assert stated(tail).decoded_bytes == 10 * (8 + 8 + len(PATH) + 8)
    with pytest.raises(ValueError, match="states no total length"):
        stated(_changed(tail, [(2, 0), (7, 1), (4, 0)], _without(3)))  # its total length (3) left out
    with pytest.raises(ValueError, match="states no total length"):
        stated(_changed(tail, [(2, 0), (7, 1)], _without(4)))  # no string statistics at all


def test_rows_are_the_larger_of_the_footers_and_its_stripes() -> None:
    # As for Parquet: a reader reads what the stripes state; the footer's count is only the writer's sum.
    from sqe.execution.orc_footer import _fields

    def understated(footer: bytes) -> bytes:  # the footer's numberOfRows (6) says 1
        return _message([(n, w, 1 if n == 6 else v) for n, w, v in _fields(footer)])

    tail = _changed(_tail(_orc(1000)), [(2, 0)], understated)
    assert stated(tail).rows == 1000


@pytest.mark.parametrize("kept", [0.25, 0.5, 0.75])
def test_a_tail_cut_inside_its_footer_is_malformed(kept: float) -> None:
    tail = _tail(_orc(10))
    with pytest.raises(ValueError, match="runs past its message"):
        stated(tail[: int(len(tail) * kept)])


def test_a_string_column_of_no_values_needs_no_total_length() -> None:
    # Found by review: ORC's Java writer (Spark's, Trino's) states a string column's total length only when the
    # column has values (StringStatisticsImpl.serialize), so a delete file whose optional ``row`` struct holds a
    # string column that is null in every row was refused as "states no total length". Its values: none, 0 bytes.
    rows = 10
    chunk = pa.table(
        {
            "file_path": pa.array([PATH] * rows, pa.string()),
            "pos": pa.array(range(rows), pa.int64()),
            "row": pa.array([None] * rows, pa.struct([("s", pa.string())])),
        }
    )
    sink = pa.BufferOutputStream()
    orc.write_table(chunk, sink)
    tail = _tail(bytes(sink.getvalue().to_pybytes()))
    # columns: the root struct, file_path, pos, row, row.s (id 4): its statistics as Java's writer states them
    java_like = _changed(tail, [(2, 0), (7, 4), (4, 0)], _without(3))
    assert stated(java_like) == stated(tail) == OrcStated(rows, rows * (5 * 8 + len(PATH)))
    # a column of values without a total length is still refused: its size cannot be known
    with pytest.raises(ValueError, match="states no total length"):
        stated(_changed(tail, [(2, 0), (7, 1), (4, 0)], _without(3)))
