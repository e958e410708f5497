"""The process's prefetch registry in a forked child: it starts afresh, whatever the parent's threads held."""

from __future__ import annotations

import os
import signal
import threading

from sqe.execution.cached_files import _PREFETCHES

_DEADLOCKED = 3  # the child's exit status when its alarm ended a wait on the lock


def test_a_child_forked_while_a_thread_holds_the_registrys_lock_can_still_use_it() -> None:
    """Found by review: the child reset the registry only under its lock, which a parent thread may have held at
    the fork; no thread in the child would ever release it."""
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with _PREFETCHES._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: leaves with its own status, never through pytest
            signal.signal(signal.SIGALRM, lambda *_: os._exit(_DEADLOCKED))
            signal.alarm(5)
            os._exit(0 if _PREFETCHES.running() == 0 else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0
