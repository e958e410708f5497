"""Batch frames: the worker's hand-written ``ExecuteResponse`` bytes parse to the same message protobuf writes."""

from __future__ import annotations

import pyarrow as pa
import pytest
from google.protobuf.message import DecodeError

from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import MessageTooLargeError
from sqe.distributed.protocol.ipc import (
    ReceivedBatch,
    batch_frames,
    decode_batch,
    encode_batch,
    parse_execute_response,
    serialize_execute_response,
)

BATCH = pa.record_batch({"id": pa.array(range(50_000), pa.int64()), "s": [f"v{i}" for i in range(50_000)]})


@pytest.mark.parametrize(("task_index", "row_offset"), [(0, 0), (3, 0), (0, 7), (300, 1 << 40)])
def test_frames_are_byte_for_byte_what_protobuf_writes(task_index: int, row_offset: int) -> None:
    frames = list(batch_frames(BATCH, 256 << 10, task_index=task_index, row_offset=row_offset))
    slices = list(encode_batch(BATCH, 256 << 10))
    assert len(frames) == len(slices) > 1  # sliced to the message limit like encode_batch
    offset = row_offset
    for frame, (ipc, rows) in zip(frames, slices, strict=True):
        reference = pb.ArrowBatch(ipc=ipc, num_rows=rows, task_index=task_index, row_offset=offset)
        assert frame.data == pb.ExecuteResponse(batch=reference).SerializeToString()
        assert (frame.rows, frame.ipc_bytes) == (rows, len(ipc))
        offset += rows


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
