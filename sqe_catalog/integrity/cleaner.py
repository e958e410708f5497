"""The background cleaner: a thread in the ``sqe-catalog serve`` process that runs persisted cleanup tasks.

A drop with purge only persists its cleanup task (with the copy of the trusted state) and returns; this thread
wakes every ``server.cleanup_interval_seconds`` and runs each pending task that was persisted at least one interval
earlier, so an operator always has that window to look at a task (``sqe-catalog admin list-cleanup-tasks``) before
anything is deleted. Each task verifies the metadata again before it traverses or deletes anything
(``sqe_catalog.integrity.purge``). ``cleanup_interval_seconds = 0`` turns the thread off; ``sqe-catalog admin
run-cleanup`` runs the pending tasks on demand either way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from sqe._text import first_line
from sqe_catalog.integrity.state import now_ms

__all__ = ["BackgroundCleaner"]

log = logging.getLogger("sqe_catalog.integrity.cleaner")

# Runs one warehouse's pending tasks persisted before the given instant (ms); returns task id -> final status.
RunPending = Callable[[int], dict[int, str]]


class BackgroundCleaner:
    def __init__(self, runners: Sequence[RunPending], interval_seconds: float) -> None:
        self._runners = tuple(runners)
        self._interval = interval_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self._interval > 0 and bool(self._runners)

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="sqe-catalog-cleaner", daemon=True)
        self._thread.start()
        log.info("background cleaner runs every %.1f s", self._interval)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the task in progress (if any) has finished."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.run_once()

    def run_once(self) -> dict[int, str]:
        """One pass over every warehouse; a failing warehouse is logged and does not stop the others."""
        cutoff = now_ms() - int(self._interval * 1000)
        ran: dict[int, str] = {}
        for runner in self._runners:
            if self._stop.is_set():
                break
            try:
                ran.update(runner(cutoff))
            except Exception as exc:  # the cleaner must outlive one broken store; the task stays visible
                log.error("background cleaner pass failed: %s: %s", type(exc).__name__, first_line(exc))
        for task_id, status in ran.items():
            log.info("cleanup task %d: %s", task_id, status)
        return ran
