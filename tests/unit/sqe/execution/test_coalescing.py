"""A reader thread joins its small batches while the consumer is busy, and hands each one over while it waits."""

from __future__ import annotations

import pyarrow as pa

from sqe.execution.local import _Coalescer


def longs(*values: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(values, pa.int64())], names=["id"])


def test_a_waiting_consumer_gets_every_batch_at_once() -> None:
    held = _Coalescer(target_bytes=1 << 20)
    assert held.add(longs(1, 2), consumer_waiting=True) == [longs(1, 2)]
    assert held.flush() == []


def test_batches_are_joined_in_order_until_the_target_size() -> None:
    held = _Coalescer(target_bytes=8 * 5)  # five longs
    assert held.add(longs(1, 2), consumer_waiting=False) == []
    assert held.add(longs(3, 4), consumer_waiting=False) == []
    [joined] = held.add(longs(5), consumer_waiting=False)
    assert joined.column(0).to_pylist() == [1, 2, 3, 4, 5] and held.flush() == []


def test_a_batch_of_another_schema_is_never_joined_with_the_held_ones() -> None:
    held = _Coalescer(target_bytes=1 << 20)
    assert held.add(longs(1), consumer_waiting=False) == []
    strings = pa.record_batch([pa.array(["a"])], names=["id"])
    assert held.add(strings, consumer_waiting=False) == [longs(1)]
    assert held.flush() == [strings]
    tagged = longs(2).replace_schema_metadata({"doc": "x"})  # same types, other metadata: not joined either
    held.add(longs(3), consumer_waiting=False)
    assert held.add(tagged, consumer_waiting=False) == [longs(3)]
