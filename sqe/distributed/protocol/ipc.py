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
``ExecuteResponse`` parser.

Arrow wants each buffer on an 8-byte boundary (pyarrow's engine warns and some kernels may fault on misaligned
ones), and protobuf's own copy of the body was aligned. So the frame's two length varints are written as wide as
it takes for the body to start at a multiple of 8 bytes into the message (a longer-than-needed varint is valid
protobuf, which parses the frame to the same message: tests check both), and gRPC hands the message over as a
bytes object whose data is 16-byte aligned. :func:`decode_batch` still copies a body that arrives misaligned.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidBatchError, MessageTooLargeError

# Room for the protobuf envelope around the IPC bytes (field tags, lengths, the row count).
ENVELOPE_BYTES = 1024


_PLAIN_OFFSETS = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}


def plain_offsets(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its top-level large string and binary fields at 32-bit offsets (``ScanTicket.plain_offsets``):
    what Parquet decodes them to and what DuckDB exports, so a pass-through result converts no offsets."""
    fields = [f.with_type(_PLAIN_OFFSETS.get(f.type, f.type)) for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def encode_schema(schema: pa.Schema) -> bytes:
    return bytes(schema.serialize().to_pybytes())


def decode_schema(data: bytes) -> pa.Schema:
    """The schema of one IPC schema message; InvalidBatchError if it is none (a broken stream, as for a batch)."""
    try:
        return pa.ipc.read_schema(pa.py_buffer(data))
    except (pa.ArrowException, OSError, EOFError) as exc:
        raise InvalidBatchError(f"a schema message is not an Arrow IPC schema ({exc})") from None


ALIGNMENT = 8  # bytes: Arrow's buffer alignment


def decode_batch(data: bytes | memoryview, schema: pa.Schema) -> pa.RecordBatch:
    """The batch of one IPC message, its buffers views of ``data`` when that is aligned, else of an aligned copy;
    checked (:func:`check_layout`) before anything reads its values."""
    buffer = pa.py_buffer(data)
    if buffer.address % ALIGNMENT:
        buffer = pa.py_buffer(bytes(data))  # a new bytes object's data is aligned
    try:
        message = pa.ipc.read_message(buffer)  # parsed once: its body stays a view of ``buffer``
        if _body_compressed(message.metadata):
            # Arrow would inflate each buffer to the size it states: a 16 MiB message of zstd can state hundreds
            # of GiB (zstd stores a run of one byte in 4 bytes), allocated before any row count is checked.
            # Workers never compress (batch_frames).
            raise InvalidBatchError("a batch message is compressed; workers send uncompressed Arrow IPC")
        batch = pa.ipc.read_record_batch(message, schema)
    # OSError: Arrow reports most malformed messages (a column's length not the batch's, a body or metadata
    # length past the message) as IOError, which pyarrow raises as a plain OSError; EOFError: a message cut short.
    except (pa.ArrowException, OSError, EOFError) as exc:
        raise InvalidBatchError(f"a batch message is not Arrow IPC of the stream's schema ({exc})") from None
    check_layout(batch)
    return batch


class _Malformed(Exception):
    """A flatbuffer offset outside the message's metadata."""


_HEADER_RECORD_BATCH = 3  # Message.fbs: union MessageHeader { Schema, DictionaryBatch, RecordBatch, ... }


def _body_compressed(metadata: pa.Buffer) -> bool:
    """Whether an IPC message's flatbuffer metadata is a ``RecordBatch`` with a ``compression`` field (Message.fbs:
    ``Message`` fields version, header_type, header; ``RecordBatch`` fields length, nodes, buffers, compression).
    Read before Arrow reads the message: Arrow decompresses as it reads. An offset outside the metadata is an
    InvalidBatchError (Arrow's verifier would refuse it too)."""
    fb = memoryview(metadata).cast("B")
    try:
        message = _uint(fb, 0, 4)
        kind = _field(fb, message, 1)
        if kind is None or _uint(fb, kind, 1) != _HEADER_RECORD_BATCH:
            return False  # not a record batch: read_record_batch refuses it
        header = _field(fb, message, 2)
        if header is None:
            return False
        return _field(fb, header + _uint(fb, header, 4), 3) is not None
    except _Malformed:
        raise InvalidBatchError("a batch message's metadata is not an Arrow IPC message") from None


def _uint(fb: memoryview, pos: int, size: int, *, signed: bool = False) -> int:
    if pos < 0 or pos + size > len(fb):
        raise _Malformed
    return int.from_bytes(fb[pos : pos + size], "little", signed=signed)


def _field(fb: memoryview, table: int, index: int) -> int | None:
    """The position of field ``index`` of the flatbuffer table at ``table``; None when it is absent."""
    vtable = table - _uint(fb, table, 4, signed=True)
    slot = 4 + 2 * index
    if slot + 2 > _uint(fb, vtable, 2):
        return None
    offset = _uint(fb, vtable + slot, 2)
    return table + offset if offset else None


def check_layout(batch: pa.RecordBatch) -> None:
    """InvalidBatchError unless every buffer, offset and size of ``batch`` lies within its buffers.

    Reading IPC checks almost nothing: a batch from another process with an offset past its data (a buggy or hostile
    worker) would have a cast, DuckDB or a client read out of bounds (a crash, or another query's bytes in a
    result). Arrow's full validation checks each offset, O(rows); strings are checked as the binary of the same
    layout, which skips only the UTF-8 check (about eight times the cost of the rest, and bad UTF-8 reads no byte
    out of bounds)."""
    try:
        for column in batch.columns:
            _as_bytes(column).validate(full=True)
    except pa.ArrowException as exc:  # ArrowInvalid mostly; a view naming a data buffer it lacks: ArrowIndexError
        raise InvalidBatchError(f"a batch's buffers do not hold its values ({exc})") from None


_BYTES_LAYOUT = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary(), pa.string_view(): pa.binary_view()}


def _as_bytes(column: pa.Array) -> pa.Array:
    """``column`` viewed with every string type as the binary type of the same layout (no copy); as it is when
    Arrow cannot view it so (then its strings are checked as UTF-8 too)."""
    target = _bytes_typed(column.type)
    if target == column.type:
        return column
    try:
        return column.view(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
        return column


def _bytes_typed(kind: pa.DataType) -> pa.DataType:
    if kind in _BYTES_LAYOUT:
        return _BYTES_LAYOUT[kind]
    if pa.types.is_struct(kind):
        return pa.struct([_bytes_field(kind.field(i)) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):
        return pa.map_(_bytes_field(kind.key_field), _bytes_field(kind.item_field), kind.keys_sorted)
    if pa.types.is_list(kind):
        return pa.list_(_bytes_field(kind.value_field))
    if pa.types.is_large_list(kind):
        return pa.large_list(_bytes_field(kind.value_field))
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(_bytes_field(kind.value_field), kind.list_size)
    if pa.types.is_dictionary(kind):
        return pa.dictionary(kind.index_type, _bytes_typed(kind.value_type), kind.ordered)
    return kind


def _bytes_field(field: pa.Field) -> pa.Field:
    return field.with_type(_bytes_typed(field.type))


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
    # Proto3 leaves out scalars equal to zero; so does this.
    scalars = b"".join(
        tag + _varint(value)
        for tag, value in ((_NUM_ROWS, rows), (_TASK_INDEX, task_index), (_ROW_OFFSET, row_offset))
        if value
    )
    outer_width, ipc_width = _aligning_widths(ipc.size, len(scalars))
    inner_size = 1 + ipc_width + ipc.size + len(scalars)
    header = _RESPONSE_BATCH + _varint(inner_size, outer_width) + _IPC + _varint(ipc.size, ipc_width)
    return b"".join((header, memoryview(ipc), scalars))


_MAX_VARINT = 10  # bytes of a 64-bit varint


def _aligning_widths(ipc_size: int, scalars_size: int) -> tuple[int, int]:
    """The narrowest widths of the outer length and the IPC length varints with which the header (two tags and
    both varints) is a multiple of ``ALIGNMENT`` bytes long, so the body after it is aligned."""
    for ipc_width in range(len(_varint(ipc_size)), _MAX_VARINT + 1):
        inner_size = 1 + ipc_width + ipc_size + scalars_size
        for outer_width in range(len(_varint(inner_size)), _MAX_VARINT + 1):
            if (2 + outer_width + ipc_width) % ALIGNMENT == 0:
                return outer_width, ipc_width
    raise ValueError("no varint widths align the batch body")  # unreachable: the widths span more than 8 sums


def _varint(value: int, width: int = 0) -> bytes:
    """``value`` as a protobuf varint, padded with zero groups to ``width`` bytes when given (still valid)."""
    if value < 0:
        raise ValueError("batch positions are never negative")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    while len(out) < width:
        out[-1] |= 0x80
        out.append(0)
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
