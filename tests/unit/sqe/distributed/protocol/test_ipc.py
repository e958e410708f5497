"""Batch frames: the worker's hand-written ``ExecuteResponse`` bytes parse to the message protobuf would write,
with the IPC body aligned."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from google.protobuf.message import DecodeError

from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidBatchError, MessageTooLargeError
from sqe.distributed.protocol.ipc import (
    ALIGNMENT,
    ReceivedBatch,
    _aligning_widths,
    _varint,
    batch_frames,
    decode_batch,
    decode_schema,
    encode_batch,
    parse_execute_response,
    plain_offsets,
    serialize_execute_response,
)

BATCH = pa.record_batch({"id": pa.array(range(50_000), pa.int64()), "s": [f"v{i}" for i in range(50_000)]})


@pytest.mark.parametrize(("task_index", "row_offset"), [(0, 0), (3, 0), (0, 7), (300, 1 << 40)])
def test_protobuf_reads_each_frame_as_the_message_it_would_write(task_index: int, row_offset: int) -> None:
    frames = list(batch_frames(BATCH, 256 << 10, task_index=task_index, row_offset=row_offset))
    slices = list(encode_batch(BATCH, 256 << 10))
    assert len(frames) == len(slices) > 1  # sliced to the message limit like encode_batch
    offset = row_offset
    for frame, (ipc, rows) in zip(frames, slices, strict=True):
        reference = pb.ExecuteResponse(
            batch=pb.ArrowBatch(ipc=ipc, num_rows=rows, task_index=task_index, row_offset=offset)
        )
        assert pb.ExecuteResponse.FromString(frame.data) == reference
        assert len(frame.data) - len(reference.SerializeToString()) < ALIGNMENT + 2  # only the varints' padding
        assert (frame.rows, frame.ipc_bytes) == (rows, len(ipc))
        offset += rows


@pytest.mark.parametrize("ipc_size", [0, 1, 100, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 16 << 20, 1 << 35])
@pytest.mark.parametrize("scalars_size", [0, 2, 7, 30])
def test_the_body_starts_on_an_aligned_offset_of_the_frame(ipc_size: int, scalars_size: int) -> None:
    outer, inner = _aligning_widths(ipc_size, scalars_size)
    assert (2 + outer + inner) % ALIGNMENT == 0
    assert len(_varint(ipc_size)) <= inner <= 10
    assert len(_varint(1 + inner + ipc_size + scalars_size)) <= outer <= 10


def test_received_bodies_are_aligned_views_or_aligned_copies() -> None:
    frame = next(batch_frames(BATCH, 256 << 10, task_index=1, row_offset=0))
    received = parse_execute_response(bytes(frame.data))  # as gRPC hands it over: a bytes object of its own
    assert isinstance(received, ReceivedBatch)
    view = decode_batch(received.ipc, BATCH.schema)
    assert all(b.address % ALIGNMENT == 0 for column in view.columns for b in column.buffers() if b is not None)
    body = pa.py_buffer(received.ipc)
    assert body.address <= view.column(0).buffers()[1].address < body.address + body.size  # a view, not a copy
    shifted = memoryview(b"\x00" + bytes(received.ipc))[1:]  # the same body, one byte off alignment
    copied = decode_batch(shifted, BATCH.schema)
    assert all(b.address % ALIGNMENT == 0 for column in copied.columns for b in column.buffers() if b is not None)
    assert copied.equals(view)


def test_frames_decode_to_the_batch_with_contiguous_offsets() -> None:
    parsed = [
        pb.ExecuteResponse.FromString(serialize_execute_response(frame))
        for frame in batch_frames(BATCH, 256 << 10, task_index=2, row_offset=10)
    ]
    assert all(m.WhichOneof("payload") == "batch" and m.batch.task_index == 2 for m in parsed)
    assert [m.batch.row_offset for m in parsed] == [
        10 + sum(p.batch.num_rows for p in parsed[:i]) for i in range(len(parsed))
    ]
    rows = pa.Table.from_batches([decode_batch(m.batch.ipc, BATCH.schema) for m in parsed])
    assert rows.equals(pa.Table.from_batches([BATCH]))


def test_other_messages_are_serialised_by_protobuf() -> None:
    message = pb.ExecuteResponse(complete=pb.Complete(rows=5, batches=1, files=1, bytes=10))
    assert serialize_execute_response(message) == message.SerializeToString()


def test_a_row_too_big_for_any_message_fails_closed() -> None:
    big = pa.record_batch({"s": ["x" * 300_000]})
    with pytest.raises(MessageTooLargeError, match="message limit"):
        list(batch_frames(big, 64 << 10, task_index=0, row_offset=0))


@pytest.mark.parametrize(("task_index", "row_offset"), [(0, 0), (5, 0), (0, 9), (300, 1 << 40)])
def test_the_coordinator_parses_frames_without_protobuf_and_without_copying(task_index: int, row_offset: int) -> None:
    frame = next(batch_frames(BATCH, 8 << 20, task_index=task_index, row_offset=row_offset))
    parsed = parse_execute_response(frame.data)
    assert isinstance(parsed, ReceivedBatch)
    assert (parsed.num_rows, parsed.task_index, parsed.row_offset) == (BATCH.num_rows, task_index, row_offset)
    assert parsed.ipc.obj is frame.data  # a view of the received message
    assert decode_batch(parsed.ipc, BATCH.schema).equals(BATCH)


def test_every_other_shape_goes_to_protobuf() -> None:
    # Fields in another order (valid protobuf, not the worker's layout) still parse, through protobuf.
    reordered = pb.ExecuteResponse(batch=pb.ArrowBatch(ipc=b"x", num_rows=1, task_index=2, row_offset=3))
    data = reordered.SerializeToString()
    swapped = data[:2] + data[5:] + data[2:5]  # the scalars before the ipc field
    message = parse_execute_response(swapped)
    assert isinstance(message, pb.ExecuteResponse) and message.batch.row_offset == 3
    schema_message = pb.ExecuteResponse(schema=pb.ArrowSchema(ipc=b"s", row_positions=True))
    assert parse_execute_response(schema_message.SerializeToString()) == schema_message


@pytest.mark.parametrize("cut", [1, 2, 3, 10])
def test_a_truncated_frame_is_rejected_not_misread(cut: int) -> None:
    frame = next(batch_frames(BATCH, 8 << 20, task_index=1, row_offset=0)).data
    with pytest.raises(DecodeError):
        parse_execute_response(frame[:-cut] if cut < 10 else frame[:cut])


def _frame(*scalars: bytes) -> bytes:
    """A batch ``ExecuteResponse`` of a one-byte IPC body and the given raw scalar fields (tag + varint)."""
    inner = b"\x0a\x01x" + b"".join(scalars)
    return b"\x12" + bytes([len(inner)]) + inner


# Ten-byte varints whose value does not fit in 64 bits (protobuf keeps the low 64 bits), or is an int64 below 0.
_BEYOND_64_BITS = b"\x80" * 9 + b"\x02"  # 2**64: protobuf reads 0
_MINUS_ONE = b"\xff" * 9 + b"\x01"  # protobuf reads -1


@pytest.mark.parametrize("varint", [_BEYOND_64_BITS, _MINUS_ONE], ids=["beyond-64-bits", "negative"])
@pytest.mark.parametrize(("tag", "field"), [(b"\x10", "num_rows"), (b"\x20", "row_offset")], ids=["rows", "offset"])
def test_an_int64_field_reads_as_protobuf_reads_it(varint: bytes, tag: bytes, field: str) -> None:
    data = _frame(tag + varint)
    parsed = parse_execute_response(data)
    expected = getattr(pb.ExecuteResponse.FromString(data).batch, field)
    assert getattr(parsed if isinstance(parsed, ReceivedBatch) else parsed.batch, field) == expected


def test_plain_offsets_narrow_only_top_level_large_strings_and_binaries() -> None:
    wide = pa.schema(
        [
            pa.field("s", pa.large_string(), nullable=False, metadata={b"PARQUET:field_id": b"1"}),
            pa.field("b", pa.large_binary()),
            pa.field("i", pa.int64()),
            pa.field("plain", pa.string()),
            pa.field("nested", pa.list_(pa.large_string())),
        ],
        metadata={b"k": b"v"},
    )
    narrow = plain_offsets(wide)
    assert narrow.types == [pa.string(), pa.binary(), pa.int64(), pa.string(), pa.list_(pa.large_string())]
    assert narrow.names == wide.names and narrow.metadata == wide.metadata
    assert narrow.field("s").metadata == wide.field("s").metadata and not narrow.field("s").nullable
    assert plain_offsets(narrow) == narrow


def _with_offsets(batch: pa.RecordBatch, old: tuple[int, ...], new: tuple[int, ...]) -> bytes:
    """``batch`` serialised, with the first 32-bit offsets run ``old`` written as ``new``."""
    data = bytearray(batch.serialize().to_pybytes())
    at = data.index(struct.pack(f"<{len(old)}i", *old))
    data[at : at + 4 * len(new)] = struct.pack(f"<{len(new)}i", *new)
    return bytes(data)


NESTED = pa.schema(
    [
        ("s", pa.string()),
        ("l", pa.list_(pa.string())),
        ("m", pa.map_(pa.string(), pa.large_string())),
        ("t", pa.struct([("b", pa.binary()), ("d", pa.string())])),
    ]
)


def test_well_formed_batches_of_every_shape_decode() -> None:
    batch = pa.record_batch(
        [
            pa.array(["ab", None, "cdé"]),
            pa.array([["x", "y"], [], None], pa.list_(pa.string())),
            pa.array([[("k", "v")], None, []], pa.map_(pa.string(), pa.large_string())),
            pa.array([{"b": b"\x00", "d": "z"}, None, {"b": None, "d": "w"}], NESTED.field("t").type),
        ],
        schema=NESTED,
    )
    assert decode_batch(batch.serialize().to_pybytes(), NESTED).equals(batch)


@pytest.mark.parametrize(
    "crossed",
    [
        (0, 5, 4, 6),  # the first value runs into the second, which has length -1
        (0, 2, -50_000_000, 6),  # a value 50 MB before the column's data, within the offsets' span
        (0, 2, 4, 100_000),  # the last value past the data
    ],
)
def test_a_batch_whose_offsets_leave_its_data_is_refused_before_anything_reads_it(crossed: tuple[int, ...]) -> None:
    batch = pa.record_batch([pa.array(["ab", "cd", "ef"])], names=["s"])
    data = _with_offsets(batch, (0, 2, 4, 6), crossed)
    with pytest.raises(InvalidBatchError, match="do not hold its values"):
        decode_batch(data, batch.schema)


def test_nested_strings_are_checked_too() -> None:
    schema = pa.schema([("l", pa.list_(pa.string()))])
    batch = pa.record_batch([pa.array([["ab", "cd", "ef"]], pa.list_(pa.string()))], schema=schema)
    with pytest.raises(InvalidBatchError, match="do not hold its values"):
        decode_batch(_with_offsets(batch, (0, 2, 4, 6), (0, 5, 4, 6)), schema)


def test_bytes_that_are_no_batch_of_the_schema_are_refused_typed() -> None:
    with pytest.raises(InvalidBatchError, match="not Arrow IPC"):
        decode_batch(b"\x00" * 64, pa.schema([("s", pa.string())]))


def test_a_batch_whose_column_is_not_the_batchs_length_is_refused_typed() -> None:
    """Arrow reports this (and a length past the message) as an IOError, a plain OSError in Python: before, it
    escaped decode_batch untyped, so the scan took it for a coordinator bug and failed the query instead of
    retrying the fragment elsewhere."""
    batch = pa.record_batch([pa.array([10, 20, 30], pa.int64())], names=["n"])
    data = bytearray(batch.serialize().to_pybytes())
    at = data.index(struct.pack("<q", 3))  # the batch's length in its metadata (the values are 10, 20, 30)
    data[at : at + 8] = struct.pack("<q", 1000)
    with pytest.raises(InvalidBatchError, match="not Arrow IPC"):
        decode_batch(bytes(data), batch.schema)


@pytest.mark.parametrize("kind", [pa.string_view(), pa.binary_view()])
def test_a_view_naming_a_data_buffer_the_batch_lacks_is_refused_typed(kind: pa.DataType) -> None:
    """Arrow's full validation reports it as an ArrowIndexError: before, that escaped decode_batch untyped (the
    query failed as a coordinator error instead of the fragment being retried)."""
    value = "a-value-longer-than-twelve-bytes"
    batch = pa.record_batch([pa.array([value], kind)], names=["v"])
    data = bytearray(batch.serialize().to_pybytes())
    view = struct.pack("<i4si", len(value), value[:4].encode(), 0)  # length, prefix, data buffer 0
    at = data.index(view)
    data[at : at + len(view)] = struct.pack("<i4si", len(value), value[:4].encode(), 7)  # buffer 7 of 1
    with pytest.raises(InvalidBatchError, match="do not hold its values"):
        decode_batch(bytes(data), batch.schema)


@pytest.mark.parametrize("data", [b"", b"garbage", b"\x00" * 64])
def test_bytes_that_are_no_schema_are_refused_typed(data: bytes) -> None:
    """Before, Arrow's error escaped decode_schema untyped: the query failed as a coordinator error instead of the
    fragment being retried, as for a bad batch."""
    with pytest.raises(InvalidBatchError, match="not an Arrow IPC schema"):
        decode_schema(data)


def _batch_message(batch: pa.RecordBatch, compression: str | None) -> bytes:
    """The record batch message of ``batch`` as an IPC stream writer with ``compression`` writes it."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_batch(batch)
    reader = pa.ipc.MessageReader.open_stream(sink.getvalue())
    reader.read_next_message()  # the schema
    return bytes(reader.read_next_message().serialize().to_pybytes())


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_a_compressed_batch_is_refused_before_arrow_inflates_it(compression: str) -> None:
    """Arrow inflates a compressed message's buffers to the sizes they state as it reads them, before any row count
    is checked: 50 million int64 zeros (400 MB) take 12 KB of zstd, so a worker's 16 MiB message could have the
    coordinator allocate hundreds of GiB. Before, decode_batch read it."""
    zeros = pa.record_batch([pa.repeat(pa.scalar(0, pa.int64()), 1_000_000)], names=["id"])
    data = _batch_message(zeros, compression)
    assert len(data) < zeros.nbytes // 4
    before = pa.total_allocated_bytes()
    with pytest.raises(InvalidBatchError, match="compressed"):
        decode_batch(data, zeros.schema)
    assert pa.total_allocated_bytes() - before < zeros.nbytes // 4


def test_an_uncompressed_stream_message_still_decodes() -> None:
    assert decode_batch(_batch_message(BATCH, None), BATCH.schema).equals(BATCH)
