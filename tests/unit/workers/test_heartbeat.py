"""``with_heartbeats``: the fragment's stream on a helper thread, handed over to gRPC's thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator

from workers.heartbeat import MAX_HEARTBEAT_MS, with_heartbeats


def test_a_call_ended_while_the_stream_is_behind_stops_its_helper_at_once() -> None:
    """gRPC stops pulling (the client cancelled while flow control held the stream back): the helper, blocked
    handing over its next message, must stop and close the fragment's stream, not wait out a heartbeat interval
    (up to an hour) holding the fragment's files and memory."""
    produced = 0
    closed = threading.Event()

    def fragment() -> Generator[int]:
        nonlocal produced
        try:
            while True:
                produced += 1
                yield produced
        finally:
            closed.set()

    stream = with_heartbeats(
        fragment(),
        interval_seconds=MAX_HEARTBEAT_MS / 1000,
        progress=lambda: produced,
        beat=lambda: -1,
        cancel=threading.Event(),
    )
    assert next(stream) == 1
    deadline = time.monotonic() + 30
    while produced < 3 and time.monotonic() < deadline:  # one message waits in the handover, one in the helper
        time.sleep(0.01)
    stream.close()  # what the end of the call does (gRPC drops the response iterator)
    assert closed.is_set(), "the helper still holds the fragment's stream"
    assert not [t for t in threading.enumerate() if t.name == "sqe-fragment-stream"]
