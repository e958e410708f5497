"""Stopping a child process a test started itself with ``subprocess.Popen`` (``sqe serve``, ``sqe-worker``, the
catalog's Daemon handles): the exit status is what tests of shutdown look at."""

from __future__ import annotations

import signal
import subprocess


def stop_child(proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM, grace: float = 15.0) -> int:
    """Stop a child this process started and holds the handle of: ``sig``, wait up to ``grace`` s, then SIGKILL.

    Returns its exit status (negative: killed by that signal).
    """
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)
