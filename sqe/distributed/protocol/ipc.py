"""Arrow IPC framing for ``Execute`` streams: one schema message, then one encapsulated IPC message per batch.

Each batch message is self-contained (no dictionary batches: the worker casts every batch to the plain output
schema first), so the reader decodes any message with the schema alone. A batch whose IPC form would exceed the
gRPC message limit is sliced by rows until every slice fits.

The worker's batch messages are the bulk of its output, so they skip the protobuf message objects: a batch
``ExecuteResponse`` is written straight in protobuf wire form around the IPC body (:func:`batch_frames`), one
copy of the body instead of the four that building ``ArrowBatch`` and ``ExecuteResponse`` objects and
serialising them cost. :func:`serialize_execute_response` is the worker's gRPC response serializer: it passes
such frames through and serialises every other message the usual way. The coordinator parses the same bytes
with :func:`parse_execute_response`: a batch message in exactly that shape becomes a :class:`ReceivedBatch`
whose IPC body is a view of the received bytes (no copy); anything else goes to the generated
``ExecuteResponse`` parser. A test checks the frames equal what protobuf writes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import MessageTooLargeError

# Room for the protobuf envelope around the IPC bytes (field tags, lengths, the row count).
ENVELOPE_BYTES = 1024


def encode_schema(schema: pa.Schema) -> bytes:
    return bytes(schema.serialize().to_pybytes())


def decode_schema(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))


def decode_batch(data: bytes | memoryview, schema: pa.Schema) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(pa.py_buffer(data), schema)


def encode_batch(batch: pa.RecordBatch, max_message_bytes: int) -> Iterator[tuple[bytes, int]]:
    """``(ipc bytes, rows)`` for ``batch``, sliced so each fits in a message of ``max_message_bytes``."""
    limit = max_message_bytes - ENVELOPE_BYTES
    if limit <= 0:
        raise ValueError(f"max_message_bytes must exceed {ENVELOPE_BYTES}")
    yield from _fitting(batch, limit)


def _fitting(batch: pa.RecordBatch, limit: int) -> Iterator[tuple[bytes, int]]:
    for data, rows in _fitting_buffers(batch, limit):
        yield bytes(data.to_pybytes()), rows


def _fitting_buffers(batch: pa.RecordBatch, limit: int) -> Iterator[tuple[pa.Buffer, int]]:
    data = batch.serialize()
    if data.size <= limit:
        yield data, batch.num_rows
        return
    if batch.num_rows <= 1:
        raise MessageTooLargeError(
            f"a single row needs {data.size} bytes, more than the {limit + ENVELOPE_BYTES}-byte message limit "
            "(raise the worker's --max-message-bytes and the coordinator's receive limit)"
        )
    parts = max(2, math.ceil(data.size / limit))
    step = math.ceil(batch.num_rows / parts)
    for start in range(0, batch.num_rows, step):
        yield from _fitting_buffers(batch.slice(start, step), limit)


@dataclass(frozen=True)
class BatchFrame:
    """One batch ``ExecuteResponse`` in wire form, with what the worker counts about it."""

    data: bytes
    rows: int
    ipc_bytes: int


def batch_frames(
    batch: pa.RecordBatch, max_message_bytes: int, *, task_index: int, row_offset: int
) -> Iterator[BatchFrame]:
    """``batch`` as serialised ``ExecuteResponse(batch=ArrowBatch(...))`` messages, sliced like
    :func:`encode_batch`; each slice's ``row_offset`` counts the rows of the slices before it."""
    limit = max_message_bytes - ENVELOPE_BYTES
    if limit <= 0:
        raise ValueError(f"max_message_bytes must exceed {ENVELOPE_BYTES}")
    for data, rows in _fitting_buffers(batch, limit):
        yield BatchFrame(_batch_message(data, rows, task_index, row_offset), rows, data.size)
        row_offset += rows


# Protobuf wire tags (field number << 3 | wire type): ExecuteResponse.batch = 2 (length-delimited); ArrowBatch
# ipc = 1 (length-delimited), num_rows = 2, task_index = 3, row_offset = 4 (varints).
_RESPONSE_BATCH, _IPC, _NUM_ROWS, _TASK_INDEX, _ROW_OFFSET = b"\x12", b"\x0a", b"\x10", b"\x18", b"\x20"


def _batch_message(ipc: pa.Buffer, rows: int, task_index: int, row_offset: int) -> bytes:
    # Proto3 leaves out scalars equal to zero; so does this, so the bytes equal protobuf's own.
    scalars = b"".join(
        tag + _varint(value)
        for tag, value in ((_NUM_ROWS, rows), (_TASK_INDEX, task_index), (_ROW_OFFSET, row_offset))
        if value
    )
    inner = _IPC + _varint(ipc.size)
    inner_size = len(inner) + ipc.size + len(scalars)
    return b"".join((_RESPONSE_BATCH, _varint(inner_size), inner, memoryview(ipc), scalars))


def _varint(value: int) -> bytes:
    if value < 0:
        raise ValueError("batch positions are never negative")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def serialize_execute_response(message: pb.ExecuteResponse | BatchFrame) -> bytes:
    """The worker's ``Execute`` response serializer: frames go out as written, messages are serialised."""
    if isinstance(message, BatchFrame):
        return message.data
    return bytes(message.SerializeToString())


@dataclass(frozen=True)
class ReceivedBatch:
    """A batch message as the coordinator reads it: the ``ArrowBatch`` fields, ``ipc`` a view of the message."""

    ipc: memoryview
    num_rows: int
    task_index: int
    row_offset: int


def parse_execute_response(data: bytes) -> pb.ExecuteResponse | ReceivedBatch:
    """The coordinator's ``Execute`` response deserializer (see the module docstring)."""
    fast = _parse_batch(data) if data[:1] == _RESPONSE_BATCH else None
    return fast if fast is not None else pb.ExecuteResponse.FromString(data)


def _parse_batch(data: bytes) -> ReceivedBatch | None:
    """The batch message written by :func:`_batch_message`, or None for any other shape (protobuf then parses
    it, and rejects what is malformed)."""
    view = memoryview(data)
    inner_size, pos = _read_varint(view, 1)
    if pos < 0 or pos + inner_size != len(view) or view[pos : pos + 1] != _IPC:
        return None
    ipc_size, start = _read_varint(view, pos + 1)
    end = start + ipc_size
    if start < 0 or end > len(view):
        return None
    fields = {_NUM_ROWS: 0, _TASK_INDEX: 0, _ROW_OFFSET: 0}
    pos = end
    while pos < len(view):
        tag = bytes(view[pos : pos + 1])
        if tag not in fields:
            return None
        fields[tag], pos = _read_varint(view, pos + 1)
        if pos < 0:
            return None
    task_index, num_rows, row_offset = fields[_TASK_INDEX], fields[_NUM_ROWS], fields[_ROW_OFFSET]
    # int32 and int64 on the wire: protobuf reads larger varints as negative or keeps their low bits only, so
    # leave anything out of range to protobuf rather than read it another way.
    if task_index >= 1 << 31 or num_rows >= 1 << 63 or row_offset >= 1 << 63:
        return None
    return ReceivedBatch(view[start:end], num_rows, task_index, row_offset)


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    """``(value, position after it)``; position -1 when the varint is cut off or longer than 64 bits."""
    value = shift = 0
    while pos < len(view) and shift < 64:
        byte = view[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7
    return 0, -1
