"""Arrow IPC framing for ``Execute`` streams: one schema message, then one encapsulated IPC message per batch.

Each batch message is self-contained (no dictionary batches: the worker casts every batch to the plain output
schema first), so the reader decodes any message with the schema alone. A batch whose IPC form would exceed the
gRPC message limit is sliced by rows until every slice fits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pyarrow as pa

from sqe.distributed.protocol.errors import MessageTooLargeError

# Room for the protobuf envelope around the IPC bytes (field tags, lengths, the row count).
ENVELOPE_BYTES = 1024


def encode_schema(schema: pa.Schema) -> bytes:
    return bytes(schema.serialize().to_pybytes())


def decode_schema(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))


def decode_batch(data: bytes, schema: pa.Schema) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(pa.py_buffer(data), schema)


def encode_batch(batch: pa.RecordBatch, max_message_bytes: int) -> Iterator[tuple[bytes, int]]:
    """``(ipc bytes, rows)`` for ``batch``, sliced so each fits in a message of ``max_message_bytes``."""
    limit = max_message_bytes - ENVELOPE_BYTES
    if limit <= 0:
        raise ValueError(f"max_message_bytes must exceed {ENVELOPE_BYTES}")
    yield from _fitting(batch, limit)


def _fitting(batch: pa.RecordBatch, limit: int) -> Iterator[tuple[bytes, int]]:
    data = batch.serialize()
    if data.size <= limit:
        yield bytes(data.to_pybytes()), batch.num_rows
        return
    if batch.num_rows <= 1:
        raise MessageTooLargeError(
            f"a single row needs {data.size} bytes, more than the {limit + ENVELOPE_BYTES}-byte message limit "
            "(raise the worker's --max-message-bytes and the coordinator's receive limit)"
        )
    parts = max(2, math.ceil(data.size / limit))
    step = math.ceil(batch.num_rows / parts)
    for start in range(0, batch.num_rows, step):
        yield from _fitting(batch.slice(start, step), limit)
