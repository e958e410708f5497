"""Progress heartbeats on an ``Execute`` stream (``ScanTicket.heartbeat_ms``).

A fragment may rightly send nothing for a long time (a partial aggregate of a large file sends its rows at the
end), so the coordinator cannot tell a slow fragment from a stalled one (a wedged read, a hung object store) by
silence alone. With heartbeats the worker sends a ``progress`` message after each interval without a message in
which the fragment made progress; a fragment that stops making progress goes quiet, and the coordinator gives it
up after several intervals. A timer alone would not do: it would keep a wedged fragment looking alive.

The fragment's own generator runs on a helper thread and hands its messages over a one-slot queue, so this
generator (gRPC's thread) can wait with a timeout; when the call ends early the helper stops and closes the
fragment's generator on its own thread, and the fragment's cancel flag stops its readers.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TypeVar

from sqe.execution.local import QueryCancelledError

MIN_HEARTBEAT_MS = 50  # a smaller request is raised to this: heartbeats must not crowd out the batches
MAX_HEARTBEAT_MS = 3_600_000
STOP_WAIT_SECONDS = 10.0  # the longest a call's end waits for the helper (a read that ignores the cancel flag)

ItemT = TypeVar("ItemT")
BeatT = TypeVar("BeatT")


def heartbeat_interval_ms(requested: int) -> int:
    """The interval kept for a ticket's ``heartbeat_ms``: 0 stays 0 (no heartbeats), others are bounded."""
    return 0 if requested <= 0 else min(max(requested, MIN_HEARTBEAT_MS), MAX_HEARTBEAT_MS)


@dataclass(frozen=True)
class _Raised:
    error: BaseException


class _End:
    pass


_END = _End()


def with_heartbeats(
    messages: Generator[ItemT],
    *,
    interval_seconds: float,
    progress: Callable[[], object],
    beat: Callable[[], BeatT],
    cancel: threading.Event,
) -> Iterator[ItemT | BeatT]:
    """``messages`` as they come, plus ``beat()`` after each ``interval_seconds`` without a message in which
    ``progress()`` changed. Errors of ``messages`` are raised here; closing this stops and closes ``messages``."""
    handover: queue.Queue[ItemT | _Raised | _End] = queue.Queue(maxsize=1)
    # Its own flag, not the fragment's cancel: a fragment sets that itself once its reading is over, before its
    # last messages (progress, complete) go out.
    stop = threading.Event()

    def put(item: ItemT | _Raised | _End) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                handover.put(item, timeout=interval_seconds)
                return True
        return False

    def produce() -> None:
        try:
            for message in messages:
                if not put(message):
                    return
            put(_END)
        except BaseException as exc:  # handed over: the stream fails the fragment with its kind
            put(_Raised(exc))
        finally:
            messages.close()  # on this thread, where the generator runs

    helper = threading.Thread(target=produce, name="sqe-fragment-stream", daemon=True)
    helper.start()
    seen = progress()
    try:
        while True:
            try:
                item = handover.get(timeout=interval_seconds)
            except queue.Empty:
                if not helper.is_alive() and handover.empty():  # it gave up handing over: cancelled
                    raise QueryCancelledError() from None
                now = progress()
                if now != seen:
                    seen = now
                    yield beat()
                continue
            if isinstance(item, _End):
                return
            if isinstance(item, _Raised):
                raise item.error
            seen = progress()  # a message went out: it says as much as a heartbeat would
            yield item
    finally:
        stop.set()  # over early (the call ended): the helper stops handing over and closes the fragment's stream
        cancel.set()  # ... and the fragment's readers stop, so the helper is not left waiting on a read
        _let_go(helper, handover)


def _let_go(helper: threading.Thread, handover: queue.Queue[ItemT | _Raised | _End]) -> None:
    """Wait (at most ``STOP_WAIT_SECONDS``) for the helper to end, emptying the handover so that a helper blocked
    on a full one (the call ended while the stream was behind) sees the stop at once, not after an interval."""
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    while helper.is_alive() and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            handover.get_nowait()
        helper.join(timeout=0.05)
